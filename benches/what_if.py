"""What vrampool and the allocators people run today reserve on GPU-scale training steps, all on
the simulated device: fake-tensor captures of GPT-2 medium and a Llama-style 1.1 B model at
several batches and sequence lengths, and the demo's GPT at batches twenty times the usual, each
replayed through ``default``, the models of PyTorch's, RMM's, CuPy's and the driver's allocators,
the pool's hybrid and the plan.

    python benches/what_if.py [--json] [--repeat N]

For each trace: its capture time (the fake training steps alone, after torch's warm-up), peak
live bytes (the lower bound), each row's peak reserved over the bound, and the peak torch's
``MemTracker`` reports for the same step (for the one-step captures). ``--repeat`` replays the
largest trace that many times back to back through ``default`` and ``torch`` for warm events
per second.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

from vrampool.whatif.replay import repeated, replay
from vrampool.whatif.traces import Trace
from vrampool.whatif.training import memtracker_peak_bytes
from vrampool.whatif.workloads import capture_workload, model_function

ROWS = ("default", "torch", "torch+expandable", "rmm", "cupy", "async", "hybrid", "plan")
GIB = 1 << 30


def traces() -> List[Dict[str, Any]]:
    """(name, steps, capture) of each trace; one-step captures are also checked with MemTracker."""
    gpu = lambda model, batch, lengths, steps: dict(  # noqa: E731
        name=f"{model} batch {batch}, sequence {','.join(map(str, lengths))}, {steps} step{'s' * (steps > 1)}",
        steps=steps,
        capture=lambda: capture_workload(model, steps, fake=True, batch=batch, lengths=lengths),
        fn=model_function(model, batch=batch, lengths=lengths) if steps == 1 else None,
    )
    return [
        gpu("gpt2-medium", 3, [1024], 1),
        gpu("gpt2-medium", 19, [256], 2),
        gpu("gpt2-medium", 8, [256, 1024, 512, 768], 4),
        gpu("llama", 2, [512, 2048, 1024], 3),
        dict(name="demo gpt, batches x20, 12 steps", steps=12, capture=lambda: capture_workload("gpt", 12, scale=20, fake=True), fn=None),
    ]


def measure(case: Dict[str, Any]) -> Dict[str, Any]:
    start = time.perf_counter()
    trace: Trace = case["capture"]()
    seconds = time.perf_counter() - start
    reports = replay(trace, strategy=list(ROWS), samples=0)
    bound = reports[0]["lower_bound_bytes"]
    out = {
        "trace": case["name"],
        "capture_s": seconds,
        "events": reports[0]["events"],
        "lower_bound_bytes": bound,
        "reserved_over_bound": {r["strategy"]: r["peak_reserved_bytes"] / bound for r in reports},
        "device_allocs": {r["strategy"]: r["device_allocs"] for r in reports},
        "memtracker_peak_bytes": memtracker_peak_bytes(case["fn"]) if case["fn"] else None,
        "trace_obj": trace,
    }
    return out


def warm_rate(trace: Trace, times: int) -> Dict[str, float]:
    rows = repeated(trace.rows(), times)
    return {r["strategy"]: r["events_per_s"] for r in replay(rows, strategy=["default", "torch"], samples=0)}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeat", type=int, default=50, help="back-to-back copies of the largest trace for events/s")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    capture_workload("gpt", 1, fake=True)  # torch's one-time warm-up, kept out of the times
    results = [measure(case) for case in traces()]
    largest = max(results, key=lambda r: r["lower_bound_bytes"])
    rates = warm_rate(largest["trace_obj"], args.repeat)
    for r in results:
        del r["trace_obj"]
    if args.json:
        print(json.dumps({"traces": results, "warm_events_per_s": rates, "warm_trace": largest["trace"]}))
        return
    print("| trace | capture s | events | bound | " + " | ".join(ROWS) + " | MemTracker peak |")
    print("| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in ROWS) + " | ---: |")
    for r in results:
        cells = " | ".join(f"{r['reserved_over_bound'][name]:.3f}" for name in ROWS)
        tracker = f"{r['memtracker_peak_bytes'] / GIB:,.3f} GiB" if r["memtracker_peak_bytes"] else "-"
        print(f"| {r['trace']} | {r['capture_s']:.1f} | {r['events']:,} | {r['lower_bound_bytes'] / GIB:,.3f} GiB | {cells} | {tracker} |")
    print()
    print("| trace | " + " | ".join(f"{name} device allocs" for name in ("default", "torch", "torch+expandable")) + " |")
    print("| --- | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['trace']} | " + " | ".join(f"{r['device_allocs'][n]:,}" for n in ("default", "torch", "torch+expandable")) + " |")
    print(f"\nwarm events/s on {largest['trace']} x{args.repeat}: " + ", ".join(f"{k} {v / 1e6:.2f} M" for k, v in rates.items()))


if __name__ == "__main__":
    main()
