"""The `vrampool` command: demo, capture, replay, summary, plan.

Tables are for people and ``--json`` is for machines; progress bars go to stderr, and only when
it is a terminal. Bad input gives one line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, TypeVar

from vrampool.planner import ALGORITHMS, PlanResult, decide, plan

T = TypeVar("T")
MIB = 1 << 20
#: The rows of the demo's table, in order.
DEMO_STRATEGIES = ("buddy", "slab", "best_fit", "hybrid", "hybrid+vm", "plan")
#: The demo's extra row, hybrid+vm with small blocks past 16 KiB left to the mapped best-fit tier:
#: on the demo's traces a slab segment per size class costs more than best-fit's slack there
#: (BENCHMARKS.md, "Replay of real training traces").
TUNED = ("hybrid+vm*", "hybrid+vm", "small_max:64KB")


class CommandError(Exception):
    """A message for stderr and exit code 1."""


def _mib(n: float) -> str:
    return f"{n / MIB:,.1f} MiB"


def _progress(items: Iterable[T], total: int, desc: str, quiet: bool = False) -> Iterable[T]:
    """``items`` under a tqdm bar on stderr, unless ``quiet`` or stderr is not a terminal."""
    if quiet or not sys.stderr.isatty():
        return items
    from tqdm import tqdm

    return tqdm(items, total=total, desc=desc, file=sys.stderr, leave=False)


def format_reports(reports: Sequence[Mapping[str, Any]]) -> str:
    """The replay table: what each strategy reserved beside the lower bound (and beside what
    the recording allocator reserved, when the trace says)."""
    bound = reports[0]["lower_bound_bytes"]
    recorded = reports[0].get("recorded_reserved_bytes")
    columns = f"{'strategy':<10} {'peak reserved':>14} {'reserved/bound':>15} {'peak allocated':>15} {'frag':>5} {'device allocs':>14} {'events/s':>12}"
    if recorded:
        columns += f" {'vs recorded':>12}"
    lines = [columns, "-" * len(columns)]
    for r in reports:
        frag = "-" if r.get("fragmentation") is None else f"{r['fragmentation']:.2f}"
        line = (
            f"{r['strategy']:<10} {_mib(r['peak_reserved_bytes']):>14} {r['peak_reserved_bytes'] / bound if bound else 1.0:>14.3f}x "
            f"{_mib(r['peak_allocated_bytes']):>15} {frag:>5} {r['device_allocs']:>14,} {r['events_per_s']:>12,.0f}"
        )
        if recorded:
            line += f" {r['peak_reserved_bytes'] / recorded:>11.3f}x"
        lines.append(line)
    if recorded:
        lines.append(f"{'recorded':<10} {_mib(recorded):>14} {recorded / bound if bound else 1.0:>14.3f}x   (what the recording allocator reserved)")
    return "\n".join(lines)


def _without_timeline(report: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in report.items() if k != "timeline"}


def replay_command(args: argparse.Namespace) -> int:
    """`vrampool replay`: a table of what each strategy reserved beside the lower bound, or JSON
    (without the timelines, which ``--plot`` draws)."""
    from vrampool.capture import Trace
    from vrampool.plot import memory_timeline_svg
    from vrampool.trace import load, recorded_reserved_timeline, repeated, replay_each, strategy_names

    try:
        trace = load(args.trace)
        if args.repeat > 1:
            trace = Trace.from_rows(repeated(trace.rows(), args.repeat))
        names = strategy_names(args.strategy)
        reports = list(_progress(replay_each(trace, names, args.conf), len(names), "replay", args.json))
    except (OSError, ValueError) as e:
        raise CommandError(f"{args.trace}: {e}") from None
    if args.plot:
        svg = memory_timeline_svg(reports, f"{Path(args.trace).name}: memory over the replay", recorded_reserved_timeline(trace))
        _write(Path(args.plot), svg)
    if args.json:
        out = [_without_timeline(r) for r in reports]
        print(json.dumps(out if args.strategy == "all" else out[0]))
        return 0
    print(f"{args.trace}: {reports[0]['events']:,} events, lower bound {_mib(reports[0]['lower_bound_bytes'])}\n")
    print(format_reports(reports))
    if args.plot:
        print(f"\nplot: {args.plot}")
    return 0


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise CommandError(f"cannot write {path}: {e}") from None


def capture_command(args: argparse.Namespace) -> int:
    """`vrampool capture`: records a built-in model's CPU training steps as a trace file."""
    from vrampool.workloads import capture_workload

    output = Path(args.output or f"{args.model}-trace.jsonl")
    trace = capture_workload(args.model, args.steps, args.seed, lambda b: _progress(b, args.steps, f"capture {args.model}", args.json), args.scale)
    try:
        trace.write(output)
    except OSError as e:
        raise CommandError(f"cannot write {output}: {e}") from None
    figures = {"model": args.model, "steps": args.steps, "scale": args.scale, "output": str(output), "events": len(trace.events), "peak_live_bytes": trace.peak_allocated_bytes()}
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"{output}: {args.steps} steps of {args.model}, {len(trace.rows()):,} buffers, peak live {_mib(figures['peak_live_bytes'])}")
    return 0


def summary_command(args: argparse.Namespace) -> int:
    """`vrampool summary`: what a trace holds, before replaying it."""
    from vrampool.trace import summary

    try:
        s = summary(args.trace)
    except (OSError, ValueError) as e:
        raise CommandError(f"{args.trace}: {e}") from None
    if args.json:
        print(json.dumps(s))
        return 0
    print(f"{args.trace}")
    print(f"  events          {s['events']:,} ({s['buffers']:,} buffers, {s['steps']} steps, {s['streams']} streams)")
    print(f"  peak live       {_mib(s['peak_live_bytes'])}" + (f"  (recorded allocator reserved {_mib(s['recorded_reserved_bytes'])})" if s["recorded_reserved_bytes"] else ""))
    print(f"  sizes           min {s['size_bytes']['min']:,} B, median {s['size_bytes']['median']:,} B, max {_mib(s['size_bytes']['max'])}")
    print(f"  lifetimes       median {s['lifetime_events']['median']:,} events, p90 {s['lifetime_events']['p90']:,}, max {s['lifetime_events']['max']:,}; {s['buffers_across_steps']:,} buffers live across a step")
    print("  by tier         " + ", ".join(f"{tier}: {t['buffers']:,} buffers, {_mib(t['bytes'])}" for tier, t in s["tiers"].items()))
    print("  by size (<= power of two)")
    for size, count in s["size_histogram"].items():
        print(f"    {int(size):>14,} B  {count:>7,}")
    return 0


def plan_command(args: argparse.Namespace) -> int:
    """`vrampool plan`: prints the figures (or JSON) and writes the plan CSV if asked. With
    `--capacity`, decides that capacity instead: exit 0 with the plan if it fits, 2 if it is proven
    not to or no plan was found in the budget (the message says which)."""
    options = dict(algorithm=args.algorithm, budget_ms=args.budget_ms, alignment=args.alignment)
    try:
        if args.capacity is None:
            result: Optional[PlanResult] = plan(args.input, **options)
        else:
            decision = decide(args.input, args.capacity, **options)
            result = decision.plan
    except (OSError, ValueError) as e:
        raise CommandError(str(e)) from None
    if result is None:
        if decision.status == "infeasible":
            message = f"proven infeasible: no plan fits in {decision.capacity:,} B"
        else:
            message = f"no plan found in the budget ({args.budget_ms} ms) within {decision.capacity:,} B, and no proof that none fits"
        print(json.dumps({"status": decision.status, "capacity": decision.capacity}) if args.json else message)
        return 2
    if args.output:
        _write(Path(args.output), result.to_csv())
    if args.json:
        report = result.to_json()
        if args.capacity is not None:
            report.update(status="fits", capacity=args.capacity)
        print(json.dumps(report))
    else:
        gap = result.arena_bytes / result.lower_bound_bytes if result.lower_bound_bytes else 1.0
        print(f"buffers      {len(result.buffers):,}")
        print(f"arena        {result.arena_bytes:,} B" + (f"  (fits in {args.capacity:,} B)" if args.capacity is not None else ""))
        print(f"lower bound  {result.lower_bound_bytes:,} B  (arena / bound = {gap:.4f}{', optimal' if result.optimal else ''})")
        if result.best_bound_bytes > result.lower_bound_bytes:
            print(f"best bound   {result.best_bound_bytes:,} B  (proven: no plan fits below it)")
        print(f"algorithm    {result.algorithm}, {result.seconds:.3f} s")
    return 0


def demo_command(args: argparse.Namespace) -> int:
    """`vrampool demo`: captures the small GPT's and the CNN's training on the CPU, replays each
    through every strategy and the plan, prints the tables and writes the plots."""
    import torch

    # Small models gain little from intra-op threads, and on a shared machine extra threads only
    # fight over cores: one keeps the demo's time steady.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _demo(args)
    except ValueError as e:
        raise CommandError(str(e)) from None
    finally:
        torch.set_num_threads(threads)
    if torch.cuda.is_available():
        gpu_comparison(args.steps, args.scale)
    return 0


def _demo(args: argparse.Namespace) -> None:
    from vrampool.plot import memory_timeline_svg, segment_map_svg
    from vrampool.trace import check_conf, peak_segments, replay_each
    from vrampool.workloads import capture_workload

    check_conf(args.conf)
    out = Path(args.out)
    print(f"vrampool demo: {args.steps} training steps of each model, captured on the CPU and replayed on the simulated device\n")
    for model in ("gpt", "cnn"):
        what = "a small GPT, sequence length varying per step" if model == "gpt" else "a small CNN, batch size varying per step"
        trace = capture_workload(model, args.steps, args.seed, lambda b, m=model: _progress(b, args.steps, f"capture {m}"), args.scale)
        _write(out / f"{model}-trace.jsonl", trace.to_jsonl())
        runs = [(name, name, args.conf) for name in DEMO_STRATEGIES] + [(TUNED[0], TUNED[1], ",".join(filter(None, (TUNED[2], args.conf))))]
        reports = []
        for label, name, conf in _progress(runs, len(runs), f"replay {model}"):
            reports.append({**next(replay_each(trace, name, conf)), "strategy": label})
        print(f"{model}: {what}: {len(trace.rows()):,} buffers, {reports[0]['events']:,} events, lower bound {_mib(reports[0]['lower_bound_bytes'])}")
        print(format_reports(reports))
        print(f"{TUNED[0]}: {TUNED[1]} with {TUNED[2]}\n")
        _write(out / f"{model}-memory.svg", memory_timeline_svg(reports, f"{model}: memory over {args.steps} training steps"))
        segments = peak_segments(trace, "hybrid+vm", args.conf)
        _write(out / f"{model}-segments.svg", segment_map_svg(segments, f"{model}: hybrid+vm segments at the peak"))
    print(f"plots and traces: {out}/ (<model>-memory.svg, <model>-segments.svg, <model>-trace.jsonl)")


def gpu_comparison(steps: int, scale: int = 1) -> None:
    """Trains each model (batches times ``scale``) on CUDA with PyTorch's allocator and with
    vrampool's, each in a fresh process (an allocator is chosen before the first CUDA tensor),
    and prints both peaks."""
    print("\nOn the GPU: the same training with each allocator\n")
    print(f"{'model':<6} {'allocator':<10} {'peak reserved':>14} {'peak allocated':>15} {'seconds':>8}")
    for model in ("gpt", "cnn"):
        for allocator in ("pytorch", "vrampool"):
            code = f"import json, vrampool.workloads as w; print(json.dumps(w.measure_cuda({model!r}, {allocator!r}, {steps}, scale={scale})))"
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                print(f"{model:<6} {allocator:<10} failed: {last}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{model:<6} {allocator:<10} {_mib(r['peak_reserved_bytes']):>14} {_mib(r['peak_allocated_bytes']):>15} {r['seconds']:>8.2f}")


def _parser() -> argparse.ArgumentParser:
    from vrampool.trace import ALL, STRATEGIES, VM_SUFFIX
    from vrampool.workloads import MODELS

    parser = argparse.ArgumentParser(prog="vrampool", description="GPU memory pool tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    trace_help = "trace file: JSON lines, id,lower,upper,size[,stream] CSV, or a PyTorch memory snapshot pickle"

    p = sub.add_parser("demo", help="capture a small GPT's and a CNN's training on the CPU and compare the strategies")
    p.add_argument("--steps", type=int, default=12, help="training steps of each model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="vrampool-demo", help="directory for the plots and traces")
    # Eight times the usual batches: a few hundred MiB live, where 2 MiB segment granularity no
    # longer decides the figures, still captured in well under a minute.
    p.add_argument("--scale", type=int, default=8, help="batches this many times the usual (more memory, more CPU time)")
    p.add_argument("--conf", default="", help="pool options for every strategy, as in VRAMPOOL_CONF (e.g. small_max:16KB)")

    p = sub.add_parser("capture", help="record a built-in model's CPU training steps as a trace")
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=int, default=1, help="batches this many times the usual (more memory, more CPU time)")
    p.add_argument("--output", help="trace file (.jsonl, or .csv for rows); default <model>-trace.jsonl")
    p.add_argument("--json", action="store_true", help="print JSON instead of a line for people")

    p = sub.add_parser("replay", help="replay a trace through the strategies and the static plan")
    p.add_argument("trace", help=trace_help)
    names = STRATEGIES + tuple(s + VM_SUFFIX for s in STRATEGIES) + ("plan", "all")
    p.add_argument("--strategy", default="hybrid", choices=names, help=f"one row, or all ({', '.join(ALL)})")
    p.add_argument("--conf", default="", help="other pool options, as in VRAMPOOL_CONF (e.g. round_up_divisions:4)")
    p.add_argument("--json", action="store_true", help="print JSON (a list when several strategies run)")
    p.add_argument("--plot", help="write an SVG of allocated and reserved bytes over the replay")
    p.add_argument("--repeat", type=int, default=1, help="replay the trace this many times back to back (a warm pool, for events/s)")

    p = sub.add_parser("summary", help="what a trace holds: events, buffers, sizes by tier, lifetimes")
    p.add_argument("trace", help=trace_help)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("plan", help="plan buffer lifetimes (id,lower,upper,size CSV) into one arena")
    p.add_argument("--input", required=True, help="CSV in MiniMalloc's format")
    p.add_argument("--algorithm", default="auto", choices=ALGORITHMS)
    p.add_argument("--budget-ms", type=int, default=5000, help="time for the exact search")
    p.add_argument("--alignment", type=int, default=1)
    p.add_argument("--capacity", type=int, metavar="BYTES", help="decide this arena size instead: a plan within it, or why not")
    p.add_argument("--output", help="write the plan as id,lower,upper,size,offset CSV")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


COMMANDS = {"demo": demo_command, "capture": capture_command, "replay": replay_command, "summary": summary_command, "plan": plan_command}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    for option in ("steps", "repeat", "scale"):
        if getattr(args, option, 1) < 1:
            print(f"vrampool {args.command}: --{option} must be at least 1", file=sys.stderr)
            return 1
    try:
        return COMMANDS[args.command](args)
    except CommandError as e:
        print(f"vrampool {args.command}: {e}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        print(f"vrampool {args.command}: needs PyTorch (pip install torch)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
