"""The `vrampool` command."""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from vrampool.planner import ALGORITHMS, plan
from vrampool.pool import DevicePool

STRATEGIES = ("slab", "best_fit", "buddy", "hybrid")


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _varying_batches(seed: int, steps: int) -> List[List[int]]:
    """Each step's tensor sizes: a recommender-like loop whose batch size changes every step (the
    course notes' story), with small bias/norm tensors beside large activations."""
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        batch = rng.choice([96, 128, 160, 200, 256])
        sizes = []
        for _layer in range(12):
            sizes.append(batch * rng.choice([1024, 2048, 4096]) * 4)  # activations
            sizes.append(rng.choice([512, 2048, 4096, 16384]))  # biases, norms
            sizes.append(batch * 64 * 4)  # small per-row tensors
        out.append(sizes)
    return out


def demo(seed: int = 0, steps: int = 40) -> int:
    """Runs the same varying-batch workload through each strategy on the simulated device and
    prints what each reserved."""
    workload = _varying_batches(seed, steps)
    print(f"vrampool demo: {steps} steps of a varying-batch training loop on the simulated device\n")
    header = f"{'strategy':<10} {'peak allocated':>16} {'peak reserved':>16} {'reserved/alloc':>15} {'device allocs':>14} {'fast-path hits':>15}"
    print(header)
    print("-" * len(header))
    for strategy in STRATEGIES:
        with DevicePool("sim", capacity=64 << 30, strategy=strategy, host_backed=False) as pool:
            for sizes in workload:
                live = [pool.allocate(s) for s in sizes]
                # Activations die in reverse order (the backward pass), small tensors in between.
                for buf in reversed(live):
                    pool.deallocate(buf)
            s = pool.stats()
            ratio = s["reserved_bytes.all.peak"] / max(1, s["allocated_bytes.all.peak"])
            print(
                f"{strategy:<10} {_mib(s['allocated_bytes.all.peak']):>16} {_mib(s['reserved_bytes.all.peak']):>16} "
                f"{ratio:>15.2f} {s['num_device_alloc']:>14} {s['fast_path_hits']:>15}"
            )
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="vrampool", description="GPU memory pool tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="compare the strategies on a training-like workload")
    p_demo.add_argument("--seed", type=int, default=0)
    p_demo.add_argument("--steps", type=int, default=40)
    p_plan = sub.add_parser("plan", help="plan buffer lifetimes (id,lower,upper,size CSV) into one arena")
    p_plan.add_argument("--input", required=True, help="CSV in MiniMalloc's format")
    p_plan.add_argument("--algorithm", default="auto", choices=ALGORITHMS)
    p_plan.add_argument("--budget-ms", type=int, default=5000, help="time for the exact search")
    p_plan.add_argument("--alignment", type=int, default=1)
    p_plan.add_argument("--output", help="write the plan as id,lower,upper,size,offset CSV")
    p_plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p_replay = sub.add_parser("replay", help="replay an allocation trace (id,lower,upper,size[,stream] CSV) through the strategies")
    p_replay.add_argument("trace", help="trace CSV: one buffer a row, live on [lower, upper)")
    p_replay.add_argument("--strategy", default="hybrid", choices=STRATEGIES + ("all",))
    p_replay.add_argument("--conf", default="", help="other pool options, as in VRAMPOOL_CONF (e.g. round_up_divisions:4)")
    p_replay.add_argument("--json", action="store_true", help="print JSON (a list when several strategies run)")
    args = parser.parse_args(argv)
    if args.command == "replay":
        return replay_command(args)
    if args.command == "demo":
        return demo(args.seed, args.steps)
    if args.command == "plan":
        return plan_command(args)
    return 2


def plan_command(args: argparse.Namespace) -> int:
    """`vrampool plan`: prints the figures (or JSON) and writes the plan CSV if asked."""
    try:
        result = plan(args.input, algorithm=args.algorithm, budget_ms=args.budget_ms, alignment=args.alignment)
    except (OSError, ValueError) as e:
        print(f"vrampool plan: {e}", file=sys.stderr)
        return 1
    if args.output:
        Path(args.output).write_text(result.to_csv())
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        gap = result.arena_bytes / result.lower_bound_bytes if result.lower_bound_bytes else 1.0
        print(f"buffers      {len(result.buffers):,}")
        print(f"arena        {result.arena_bytes:,} B")
        print(f"lower bound  {result.lower_bound_bytes:,} B  (arena / bound = {gap:.4f}{', optimal' if result.optimal else ''})")
        print(f"algorithm    {result.algorithm}, {result.seconds:.3f} s")
    return 0


def replay_command(args: argparse.Namespace) -> int:
    """`vrampool replay`: a table of what each strategy reserved beside the lower bound, or JSON."""
    from vrampool.trace import replay

    try:
        result = replay(args.trace, strategy=args.strategy, conf=args.conf)
    except (OSError, ValueError) as e:
        print(f"vrampool replay: {args.trace}: {e}", file=sys.stderr)
        return 1
    reports = result if isinstance(result, list) else [result]
    if args.json:
        print(json.dumps(result))
        return 0
    bound = reports[0]["lower_bound_bytes"]
    print(f"{args.trace}: {reports[0]['events']:,} events, lower bound {_mib(bound)}\n")
    header = (
        f"{'strategy':<10} {'peak allocated':>16} {'peak reserved':>16} {'reserved/bound':>15} "
        f"{'device allocs':>14} {'events/s':>14}"
    )
    print(header)
    print("-" * len(header))
    for r in reports:
        ratio = r["peak_reserved_bytes"] / bound if bound else 1.0
        print(
            f"{r['strategy']:<10} {_mib(r['peak_allocated_bytes']):>16} {_mib(r['peak_reserved_bytes']):>16} "
            f"{ratio:>15.3f} {r['device_allocs']:>14,} {r['events_per_s']:>14,.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
