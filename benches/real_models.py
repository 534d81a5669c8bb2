"""Liveness and planning on real model graphs: GPT-2 small and ResNet-50, forward and training
step, traced on fake tensors on the CPU (no GPU, no parameter memory).

    python benches/real_models.py [--json] [--repeat N] [--gpt-batch B] [--resnet-batch B]

For each graph: the planned buffers (intermediates and outputs; parameters and inputs are left
out), the lower bound (most bytes live at once), the arena of ``plan`` (auto), their ratio, and
medians over ``--repeat`` runs of the planning time, the tracing time (``make_fx``, torch's work)
and the liveness time (``from_graph``, ours). The analysis time of the issue's target is tracing
plus liveness. The first trace in a process also pays torch's one-time warm-up (imports,
decomposition tables); it is reported apart as ``first_trace_s``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable, Dict, List, Tuple

import torch

from vrampool.whatif.liveness import from_graph, trace_forward, trace_training_step
from vrampool.whatif.models import gpt2_small, resnet50


def measure(name: str, trace: Callable[[], Any], repeat: int) -> Dict[str, Any]:
    trace_s, liveness_s, plan_s = [], [], []
    for _ in range(repeat):
        start = time.perf_counter()
        gm = trace()
        traced = time.perf_counter()
        live = from_graph(gm)
        trace_s.append(traced - start)
        liveness_s.append(time.perf_counter() - traced)
        result = live.plan()
        plan_s.append(result.seconds)
    return {
        "graph": name,
        "nodes": len(gm.graph.nodes),
        "buffers": len(result.buffers),
        "lower_bound_bytes": result.lower_bound_bytes,
        "arena_bytes": result.arena_bytes,
        "ratio": result.arena_bytes / result.lower_bound_bytes,
        "optimal": result.optimal,
        "plan_s": statistics.median(plan_s),
        "trace_s": statistics.median(trace_s),
        "liveness_s": statistics.median(liveness_s),
        "analysis_s": statistics.median(trace + live for trace, live in zip(trace_s, liveness_s)),
    }


def model_graphs(gpt_batch: int = 1, resnet_batch: int = 32) -> List[Tuple[str, Callable[[], Any]]]:
    """The four graphs, each as (name, a function that traces it); the GPT-2 forward first."""
    # Meta-device models: the fake-tensor trace needs shapes only, so no parameter memory.
    with torch.device("meta"):
        gpt, resnet = gpt2_small(), resnet50()
    tokens = torch.zeros(gpt_batch, 1024, dtype=torch.long, device="meta")
    images = torch.zeros(resnet_batch, 3, 224, 224, device="meta")
    return [
        (f"gpt2-small forward (batch {gpt_batch}, seq 1024)", lambda: trace_forward(gpt, (tokens,))),
        (f"gpt2-small training step (batch {gpt_batch}, seq 1024)", lambda: trace_training_step(gpt, (tokens,))),
        (f"resnet50 forward (batch {resnet_batch}, 224x224)", lambda: trace_forward(resnet, (images,))),
        (f"resnet50 training step (batch {resnet_batch}, 224x224)", lambda: trace_training_step(resnet, (images,))),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--repeat", type=int, default=3, help="runs per graph (medians are reported)")
    parser.add_argument("--gpt-batch", type=int, default=1)
    parser.add_argument("--resnet-batch", type=int, default=32)
    args = parser.parse_args()

    graphs = model_graphs(args.gpt_batch, args.resnet_batch)
    start = time.perf_counter()
    graphs[0][1]()
    first_trace_s = time.perf_counter() - start

    rows: List[Dict[str, Any]] = [measure(name, trace, args.repeat) for name, trace in graphs]

    if args.json:
        print(json.dumps({"first_trace_s": first_trace_s, "graphs": rows}, indent=2))
        return
    print("| graph | buffers | lower bound | arena | arena/bound | plan s | analysis s (trace + liveness) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['graph']} | {r['buffers']:,} | {r['lower_bound_bytes']:,} | {r['arena_bytes']:,} | "
            f"{r['ratio']:.4f}{'*' if r['optimal'] else ''} | {r['plan_s']:.4f} | "
            f"{r['analysis_s']:.2f} ({r['trace_s']:.2f} + {r['liveness_s']:.3f}) |"
        )
    print(f"\nfirst trace in the process (GPT-2 forward, torch warm-up included): {first_trace_s:.2f} s")


if __name__ == "__main__":
    main()
