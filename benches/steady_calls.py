"""Driver calls per pass of a repeated training trace through ``DevicePool(0)``, under the emulated
CUDA driver (host memory, not a GPU): the steady state of the real backend, pass by pass, beside
the device calls the models of PyTorch's allocator make on the same trace (simulated).

Run: ``scripts/emulated-cuda.sh python benches/steady_calls.py [TRACE...] [--passes N]``. With no
trace it captures the demo's GPT (a different sequence length each step) and CNN (a different
batch size each step) under fake tensors. Prints, per pass, every driver call that allocates,
maps, frees or waits (by name), and the context and stream syncs among them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Sequence, Tuple

from driver_calls import driver_counts

#: The calls that cost a step: memory from and back to the driver, and waits.
COUNTED = (
    "cuMemAlloc",
    "cuMemFree",
    "cuMemCreate",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemUnmap",
    "cuMemRelease",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
)


def emulated_counts() -> Dict[str, int]:
    """Every driver call count since the emulator started, by name."""
    counts = driver_counts()
    if counts is None:
        raise SystemExit("steady_calls: run under scripts/emulated-cuda.sh (the loaded libcuda is not the emulated driver)")
    return counts


def events_of(rows: Sequence[Tuple[int, ...]]) -> List[Tuple[int, int]]:
    """``(id, size)`` for an allocation and ``(id, 0)`` for a free, in the replay's order (at each
    time, frees before allocations, ties by id)."""
    keyed = []
    for row in rows:
        ident, lower, upper, size = row[:4]
        keyed.append(((lower, 1, ident), (ident, size)))
        keyed.append(((upper, 0, ident), (ident, 0)))
    return [event for _, event in sorted(keyed)]


def passes_through_pool(events: Sequence[Tuple[int, int]], passes: int) -> List[Dict[str, int]]:
    """Replays ``events`` ``passes`` times through one ``DevicePool(0)``; the counted driver calls
    of each pass."""
    from vrampool import DevicePool

    pool = DevicePool(0)
    per_pass = []
    for _ in range(passes):
        before = emulated_counts()
        live = {}
        for ident, size in events:
            if size:
                live[ident] = pool.allocate(size)
            else:
                pool.deallocate(live.pop(ident))
        after = emulated_counts()
        per_pass.append({name: after.get(name, 0) - before.get(name, 0) for name in COUNTED})
    pool.close()
    return per_pass


def model_calls(rows: Sequence[Tuple[int, ...]], passes: int) -> Dict[str, Tuple[int, int]]:
    """The PyTorch models' device calls (allocations and frees) in their first and last pass
    (simulated)."""
    from vrampool.whatif.replay import replay_each

    out = {}
    for report in replay_each(list(rows), ["torch", "torch+expandable"], samples=0, repeat=passes):
        first = replay_each(list(rows), [report["strategy"]], samples=0, repeat=1)
        one = next(first)
        out[report["strategy"]] = (one["device_allocs"] + one["device_frees"], report["last_pass_device_allocs"] + report["last_pass_device_frees"])
    return out


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", help="trace files (any format vrampool replay reads)")
    parser.add_argument("--passes", type=int, default=6)
    args = parser.parse_args(argv)
    from vrampool.whatif.traces import load

    if args.traces:
        traces = [(path, load(path).rows()) for path in args.traces]
    else:
        from vrampool.whatif.workloads import capture_workload

        traces = [(f"{m} x2", capture_workload(m, 12, 0, scale=2, fake=True).rows()) for m in ("gpt", "cnn")]
    for name, rows in traces:
        per_pass = passes_through_pool(events_of(rows), args.passes)
        print(f"{name}: {len(rows):,} buffers, DevicePool(0) under the emulated driver")
        print(f"{'pass':>4} {'driver calls':>12} {'ctx syncs':>9} {'stream syncs':>12}  by name")
        for k, calls in enumerate(per_pass, 1):
            named = ", ".join(f"{n} {c}" for n, c in calls.items() if c)
            print(f"{k:>4} {sum(calls.values()):>12} {calls['cuCtxSynchronize']:>9} {calls['cuStreamSynchronize']:>12}  {named or '-'}")
        for model, (first, last) in model_calls(rows, args.passes).items():
            print(f"{model} (simulated): {first} device calls in pass 1, {last} in pass {args.passes}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
