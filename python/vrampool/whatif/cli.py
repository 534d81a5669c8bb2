"""The `vrampool` command: demo, capture, replay, fit, summary, plan.

Tables are for people and ``--json`` is for machines; progress bars go to stderr, and only when
it is a terminal. Bad input (a file, an argument) gives one line on stderr and a nonzero exit
code (2 for a malformed command line, 1 otherwise), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, NoReturn, Optional, Sequence, Tuple, TypeVar

from vrampool.planner import ALGORITHMS, PlanResult, decide, plan

T = TypeVar("T")
MIB = 1 << 20
#: The rows of the demo's table, in order: vrampool as installed beside PyTorch's allocator, the
#: other allocators' models, then the pool's strategies one by one and the static plan.
DEMO_STRATEGIES = ("default", "torch", "torch+expandable", "rmm", "cupy", "async", "slab", "best_fit", "buddy", "hybrid", "ahead", "plan")
#: The demo replays each trace this many times back to back, as a training loop repeats its steps:
#: the table shows the first pass's peak and the last pass's device calls (the steady state).
DEMO_PASSES = 10


class CommandError(Exception):
    """A message for stderr and exit code 1."""


#: What bad input raises on its way through the readers, the pool and torch: each is reported
#: as one line. (Anything else is a bug, reported as one line too, naming its type.)
INPUT_ERRORS = (ValueError, OverflowError, RecursionError, MemoryError, OSError, RuntimeError)
#: An error line is cut to this many characters.
MAX_MESSAGE = 300


def _one_line(message: object) -> str:
    """``message`` on one line of at most :data:`MAX_MESSAGE` characters."""
    text = " ".join(str(message).split())
    return text if len(text) <= MAX_MESSAGE else f"{text[:MAX_MESSAGE]}... ({len(text) - MAX_MESSAGE} more characters)"


def _nonempty(trace: Any) -> Any:
    """``trace`` if it allocates something: an empty trace is an error for every command."""
    if not trace.rows():
        raise ValueError("the trace holds no allocations")
    return trace


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (the usage is in ``--help``)."""

    def error(self, message: str) -> "NoReturn":
        self.exit(2, f"{self.prog}: {_one_line(message)} (see --help)\n")


#: The range of each integer option (its name in ``args``: the option less its dashes).
BOUNDS = {
    "steps": (1, 100_000),
    "repeat": (1, 10**9),
    "scale": (1, 1024),
    "seed": (0, 2**63 - 1),
    "budget_ms": (0, 86_400_000),
    "alignment": (1, 1 << 40),
    "ranks": (1, 4096),
    "batch": (1, 1 << 20),
    "max": (1, 1 << 30),
}


def _out_of_bounds(args: argparse.Namespace) -> Optional[str]:
    """What is wrong with the first integer option out of its range, if one is."""
    for name, (low, high) in BOUNDS.items():
        value = getattr(args, name, None)
        option = "--" + name.replace("_", "-")
        if value is not None and value < low:
            return f"{option} must be at least {low}"
        if value is not None and value > high:
            return f"{option} must be at most {high:,}"
    return None


def _mib(n: float) -> str:
    return f"{n / MIB:,.1f} MiB"


def _size(text: str) -> int:
    """Bytes from a size such as ``80GB`` (binary units, as PyTorch's are)."""
    from vrampool._native import parse_size

    try:
        size = parse_size(text)
    except ValueError as e:
        raise CommandError(f"--memory: {e}") from None
    if size == 0:
        raise CommandError("--memory must be at least 1 byte")
    return size


def _progress(items: Iterable[T], total: Optional[int], desc: str, quiet: bool = False) -> Iterable[T]:
    """``items`` under a tqdm bar on stderr, unless ``quiet`` or stderr is not a terminal."""
    if quiet or not sys.stderr.isatty():
        return items
    from tqdm import tqdm

    return tqdm(items, total=total, desc=desc, file=sys.stderr, leave=False)


def format_reports(reports: Sequence[Mapping[str, Any]], repeat: int = 1) -> str:
    """The replay table: what each row reserved beside the lower bound, beside the ``torch``
    row's figures when there is one (``vs torch``: reserved, and device calls), and beside what
    the recording allocator reserved when the trace says. Rows of models that guess at an
    allocator's internals say ``approximate``; rows that ran out of a limited device's memory
    say ``OOM``. For a trace replayed ``repeat`` times, the peak of the first pass and the
    device calls of the last pass (allocations and frees: the steady state) stand beside the
    totals."""
    bound = reports[0]["lower_bound_bytes"]
    recorded = reports[0].get("recorded_reserved_bytes")
    torch = next((r for r in reports if r["strategy"] == "torch"), None)

    def over(value: float, base: float) -> str:
        return f"{value / base if base else 1.0:.3f}x"

    # (title, width: negative to the left, the cell of a row), the optional columns where they apply.
    columns: List[Tuple[str, int, Callable[[Mapping[str, Any]], str]]] = [
        ("strategy", -18, lambda r: r["strategy"]),
        ("peak reserved", 14, lambda r: _mib(r["peak_reserved_bytes"])),
        ("reserved/bound", 15, lambda r: over(r["peak_reserved_bytes"], bound)),
        *([("vs torch", 9, lambda r: _ratio(r["peak_reserved_bytes"], torch["peak_reserved_bytes"]))] if torch else []),
        *([("pass 1/bound", 13, lambda r: over(r["first_pass_peak_reserved_bytes"], bound))] if repeat > 1 else []),
        ("device allocs", 14, lambda r: f"{r['device_allocs']:,}"),
        *([("vs torch", 9, lambda r: _ratio(r["device_allocs"], torch["device_allocs"]))] if torch else []),
        *([("last pass calls", 16, lambda r: f"{r['last_pass_device_allocs'] + r['last_pass_device_frees']:,}")] if repeat > 1 else []),
        ("peak allocated", 15, lambda r: _mib(r["peak_allocated_bytes"])),
        ("frag", 5, lambda r: "-" if r.get("fragmentation") is None else f"{r['fragmentation']:.2f}"),
        ("events/s", 12, lambda r: f"{r['events_per_s']:,.0f}"),
        *([("vs recorded", 12, lambda r: over(r["peak_reserved_bytes"], recorded))] if recorded else []),
    ]

    def aligned(cells: Sequence[str]) -> str:
        return " ".join(c.ljust(-w) if w < 0 else c.rjust(w) for c, (_, w, _) in zip(cells, columns))

    header = aligned([title for title, _, _ in columns])
    lines = [header, "-" * len(header)]
    for r in reports:
        notes = ("  approximate" if r.get("approximate") else "") + ("  OOM" if r.get("out_of_memory") else "")
        lines.append(aligned([cell(r) for _, _, cell in columns]) + notes)
    if recorded:
        lines.append(f"{'recorded':<18} {_mib(recorded):>14} {recorded / bound if bound else 1.0:>14.3f}x   (what the recording allocator reserved)")
    return "\n".join(lines)


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def _without_timeline(report: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in report.items() if k != "timeline"}


def replay_command(args: argparse.Namespace) -> int:
    """`vrampool replay`: a table of what each row reserved beside the lower bound and PyTorch's
    allocator, or JSON (without the timelines, which ``--plot`` draws). On a PyTorch snapshot, the
    model of PyTorch's allocator (with or without expandable segments, as the snapshot was made)
    is always a row, so its prediction stands beside what PyTorch reserved."""
    from vrampool.whatif.plot import memory_timeline_svg
    from vrampool.whatif.replay import AHEAD, LARGEST, ahead_plan, recorded_reserved_timeline, replay_each, strategy_names
    from vrampool.whatif.traces import load

    capacity = _size(args.memory) if args.memory else None
    ahead = args.ahead
    if ahead is not None and ahead != LARGEST:
        try:
            ahead = ahead_plan(ahead)
        except INPUT_ERRORS as e:
            message = str(e)
            raise CommandError(f"--ahead {message}" if message.startswith(args.ahead) else f"--ahead {args.ahead}: {message}") from None
    try:
        trace = _nonempty(load(args.trace))
        names = strategy_names(args.strategy)
        model = _recording_model(trace)
        if model and model not in names:
            names.append(model)
        if ahead is not None and AHEAD not in names:
            names.append(AHEAD)
        replays = replay_each(trace, names, args.conf, capacity=capacity, repeat=args.repeat, ahead=ahead)
        reports = list(_progress(replays, len(names), "replay", args.json))
    except INPUT_ERRORS as e:
        raise CommandError(f"{args.trace}: {e}") from None
    if args.plot:
        svg = memory_timeline_svg(reports, f"{Path(args.trace).name}: memory over the replay", recorded_reserved_timeline(trace))
        _write(Path(args.plot), svg)
    if args.json:
        out = [_without_timeline(r) for r in reports]
        print(json.dumps(out[0] if len(out) == 1 else out))
        return 0
    print(f"{args.trace}: {reports[0]['events']:,} events, lower bound {_mib(reports[0]['lower_bound_bytes'])}" + (f", device of {_mib(capacity)} (simulated)" if capacity else "") + "\n")
    print(format_reports(reports, args.repeat))
    if model:
        predicted = next(r for r in reports if r["strategy"] == model)
        recorded = predicted["recorded_reserved_bytes"]
        print(f"\nPyTorch reserved {_mib(recorded)}; the {model} model predicts {_mib(predicted['peak_reserved_bytes'])} ({predicted['peak_reserved_bytes'] / recorded:.3f}x)")
    if args.plot:
        print(f"\nplot: {args.plot}")
    return 0


def _recording_model(trace: Any) -> Optional[str]:
    """The model of the allocator that recorded ``trace``: PyTorch's, for a snapshot, with
    expandable segments if the snapshot mapped memory; None for other traces."""
    if trace.recorded_by != "pytorch":
        return None
    return "torch+expandable" if trace.recorded_expandable else "torch"


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise CommandError(f"cannot write {path}: {e}") from None


def _model_prints_to_stderr() -> "contextlib.AbstractContextManager[Any]":
    """While a model's code runs (its module's import, its function, its steps), what it prints
    goes to stderr: stdout carries the command's own output alone (JSON alone with ``--json``)."""
    return contextlib.redirect_stdout(sys.stderr)


def _check_writable(paths: List[Path]) -> None:
    """Refuses output paths that cannot be written before the work (a capture, a plan) that may
    take minutes."""
    for path in paths:
        folder = path.parent
        if path.is_dir():
            raise CommandError(f"cannot write {path}: it is a folder")
        if not folder.is_dir():
            raise CommandError(f"cannot write {path}: no folder {folder}")
        if not os.access(folder, os.W_OK):
            raise CommandError(f"cannot write {path}: the folder {folder} is not writable")


def capture_command(args: argparse.Namespace) -> int:
    """`vrampool capture`: records a model's training steps as a trace file (one per rank with
    ``--ranks``), under fake tensors unless ``--real``."""
    from vrampool.whatif.training import ModelFunctionError
    from vrampool.whatif.workloads import DEMO_MODELS, MODELS

    lengths = _lengths(args.seq)
    steps = args.steps or (12 if args.model in DEMO_MODELS else len(lengths or [1]))
    builtin = args.model in MODELS
    if not builtin and ":" not in args.model:
        raise CommandError(f"--model {args.model!r}: a built-in ({', '.join(MODELS)}) or module:function (path/to/file.py:function)")
    if args.ranks > 1 and not args.parallel:
        raise CommandError("--ranks needs --parallel ddp or --parallel fsdp")
    stem = Path(args.model.split(":")[-1]).name if not builtin else args.model
    output = Path(args.output or f"{stem}-trace.jsonl")
    paths = [output] if args.ranks == 1 else [output.with_name(f"{output.stem}-rank{r}{output.suffix}") for r in range(args.ranks)]
    _check_writable(paths)
    bar = lambda items, what=f"capture {args.model}": _progress(items, steps, what, args.json)  # noqa: E731
    try:
        with _model_prints_to_stderr():
            traces = _capture_traces(args, steps, lengths, builtin, bar)
    except ModelFunctionError as e:
        raise CommandError(str(e)) from None
    except ValueError as e:
        raise CommandError(f"--model {args.model}: {e}") from None
    except (RuntimeError, MemoryError) as e:  # torch's own refusal, at a size past this machine
        raise CommandError(f"{args.model}: {e}") from None
    for trace, path in zip(traces, paths):
        try:
            trace.write(path)
        except OSError as e:
            raise CommandError(f"cannot write {path}: {e}") from None
    figures = [
        {"model": args.model, "steps": steps, "fake": args.fake, "output": str(path), "events": len(t.events), "peak_live_bytes": t.peak_allocated_bytes()}
        for t, path in zip(traces, paths)
    ]
    if args.json:
        print(json.dumps(figures[0] if len(figures) == 1 else figures))
        return 0
    how = "fake tensors" if args.fake else "the CPU, for real"
    for f, t in zip(figures, traces):
        print(f"{f['output']}: {steps} steps of {args.model} on {how}, {len(t.rows()):,} buffers, peak live {_mib(f['peak_live_bytes'])}")
    return 0


def _capture_traces(args: argparse.Namespace, steps: int, lengths: Optional[List[int]], builtin: bool, bar: Any) -> List[Any]:
    """The traces ``capture`` writes: one, or one per rank with ``--parallel``."""
    from vrampool.whatif.cluster import capture_ranks
    from vrampool.whatif.training import capture_model, load_model_function
    from vrampool.whatif.workloads import capture_workload, model_function

    if builtin and not args.parallel:
        return [capture_workload(args.model, steps, args.seed, bar, args.scale, fake=args.fake, batch=args.batch, lengths=lengths)]
    if builtin:
        fn = model_function(args.model, steps, args.seed, args.scale, args.batch, lengths)
    else:
        if args.batch or args.seq or args.scale != 1:
            raise CommandError("--batch, --seq and --scale are for the built-in models: a model function sets its own batch")
        fn = load_model_function(args.model)
    if args.parallel:
        return capture_ranks(fn, args.ranks, args.parallel, steps, fake=args.fake, name=args.model)
    return [capture_model(fn, steps, fake=args.fake, name=args.model, progress=bar)]


def _lengths(text: Optional[str]) -> Optional[List[int]]:
    """``--seq``: one length, or lengths separated by commas."""
    if not text:
        return None
    try:
        lengths = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise CommandError(f"--seq {text!r}: expected lengths separated by commas, e.g. 512,1024") from None
    if not lengths or min(lengths) < 1:
        raise CommandError(f"--seq {text!r}: lengths must be at least 1")
    return lengths


def fit_command(args: argparse.Namespace) -> int:
    """`vrampool fit`: the largest batch size (or sequence length) whose training steps fit in
    ``--memory`` under each allocator, on the simulated device; with ``--parallel``, on every
    rank of ``--ranks``; with ``--over ranks``, the fewest FSDP ranks at which ``--batch`` fits."""
    from vrampool.whatif.cluster import CannotShard
    from vrampool.whatif.fit import DoesNotFit
    from vrampool.whatif.training import ModelFunctionError

    memory = _size(args.memory)
    _check_fit_options(args)
    with _model_prints_to_stderr():
        fn, setting = _fit_function(args)
    label = f"{args.model} {args.size}" if args.size else args.model
    progress, note = _probe_bar(f"fit {label}", args.json)
    try:
        if args.over == "ranks":
            return _fewest_ranks(args, fn, memory, label, setting, progress, note)
        return _fit(args, fn, memory, label, setting, progress, note)
    except CannotShard as e:
        raise CommandError(f"--model {label}: {e}") from None
    except DoesNotFit as e:
        raise CommandError(f"{label} does not fit: {e}") from None
    except (ModelFunctionError, ValueError) as e:
        raise CommandError(str(e)) from None


def _check_fit_options(args: argparse.Namespace) -> None:
    """The combinations of ``fit``'s options that make no question."""
    from vrampool.whatif.workloads import DEMO_MODELS, MODELS

    if args.model in DEMO_MODELS:
        raise CommandError(f"--model {args.model}: fit takes a GPU-scale built-in ({', '.join(m for m in MODELS if m not in DEMO_MODELS)}) or module:function")
    if args.model not in MODELS and ":" not in args.model:
        raise CommandError(f"--model {args.model!r}: a built-in ({', '.join(MODELS)}) or module:function taking the batch size (or sequence length)")
    if args.size and args.model != "llama":
        raise CommandError(f"--size is for --model llama, not {args.model}")
    if args.over == "ranks":
        if args.batch is None:
            raise CommandError("--over ranks needs --batch: the per-rank batch whose fewest ranks it finds")
        if args.parallel != "fsdp":
            raise CommandError("--over ranks needs --parallel fsdp: data-parallel ranks each hold the whole model, so their number changes no rank's memory")
        if args.ranks != 1:
            raise CommandError("--over ranks searches the number of ranks: leave out --ranks (--max bounds it)")
    elif args.ranks > 1 and not args.parallel:
        raise CommandError("--ranks needs --parallel ddp or --parallel fsdp")
    if args.model not in MODELS and (args.seq or (args.batch and args.over != "ranks")):
        raise CommandError("--batch and --seq are for the built-in models: a model function takes the size itself (--batch with --over ranks)")


def _fit_function(args: argparse.Namespace) -> Tuple[Callable[[int], Any], str]:
    """The model function of ``fit``'s search, taking the size searched (the batch with ``--over
    ranks``), and the words for what stays fixed."""
    from vrampool.whatif.training import ModelFunctionError, load_model_function
    from vrampool.whatif.workloads import MODELS, model_function

    if args.model in MODELS:
        model = lambda batch, seq: model_function(args.model, batch=batch, lengths=[seq], size=args.size)()  # noqa: E731
        if args.over == "seq":
            batch = args.batch or 8
            return (lambda size: model(batch, size)), f"batch size {batch}"
        seq = args.seq or 1024
        if args.over == "ranks":
            return (lambda size: model(size, seq)), f"batch size {args.batch}, sequence length {seq}"
        return (lambda size: model(size, seq)), f"sequence length {seq}"
    try:
        fn = load_model_function(args.model)
    except ModelFunctionError as e:
        raise CommandError(str(e)) from None
    if args.over == "ranks":
        return fn, f"batch size {args.batch}"
    return fn, f"the {_FIT_WHAT[args.over]} passed to {args.model}"


#: What ``fit --over`` grows, in words.
_FIT_WHAT = {"batch": "batch size", "seq": "sequence length", "ranks": "ranks"}


def _probe_bar(desc: str, quiet: bool) -> Tuple[Callable[[Iterable[int]], Iterable[int]], Callable[[str], None]]:
    """A progress bar over the probes, and a function that names the capture under way on it."""
    bars: List[Any] = []

    def progress(sizes: Iterable[int]) -> Iterable[int]:
        bars.append(_progress(sizes, None, desc, quiet))
        return bars[-1]

    def note(text: str) -> None:
        if bars and hasattr(bars[-1], "set_description"):
            bars[-1].set_description(f"{desc}: {text}")

    return progress, note


def _fit(args: argparse.Namespace, fn: Callable[[int], Any], memory: int, label: str, setting: str, progress: Any, note: Any) -> int:
    from vrampool.whatif.cluster import fit_cluster
    from vrampool.whatif.fit import fit_model
    from vrampool.whatif.plot import fit_svg

    what = _FIT_WHAT[args.over]
    with _model_prints_to_stderr():
        if args.parallel:
            result = fit_cluster(fn, memory, args.parallel, args.ranks, args.strategy.split(","), steps=args.steps, max_size=args.max, name=label, progress=progress, note=note)
        else:
            result = fit_model(fn, memory, args.strategy.split(","), steps=args.steps, max_size=args.max, progress=progress)
    if args.plot:
        per = " per rank" if args.parallel else ""
        _write(Path(args.plot), fit_svg(result, what, f"{label}: what fits in {_gib(memory)}{per} (simulated)"))
    if args.json:
        cluster = {"parallel": args.parallel, "ranks": args.ranks} if args.parallel else {}
        print(json.dumps({"model": label, "over": args.over, "steps": args.steps, **cluster, **result.to_json()}))
        return 0
    if args.parallel:
        print(f"{label}, {setting}, {args.steps} training steps, {args.parallel.upper()} on {args.ranks:,} ranks, on a simulated device of {_gib(memory)} per rank")
        print(_ranks_captured(result.probes, args.ranks) + "\n")
    else:
        print(f"{label}, {setting}, {args.steps} training steps, on a simulated device of {_gib(memory)}\n")
    print(format_fit(result, what))
    if args.plot:
        print(f"\nplot: {args.plot}")
    return 0


def _ranks_captured(probes: Sequence[Any], world_size: int) -> str:
    """Which ranks were captured, and why: one when they were alike at every probe."""
    captured = sorted({r for p in probes for r in p.captured})
    if len(captured) == 1:
        return f"ranks symmetric (the same parameter shard shapes): rank {captured[0]} captured for all {world_size:,}"
    return f"ranks differ (uneven parameter shards): ranks {', '.join(map(str, captured))} captured, one of each kind; the one that fits least decides"


def _fewest_ranks(args: argparse.Namespace, fn: Callable[[int], Any], memory: int, label: str, setting: str, progress: Any, note: Any) -> int:
    from vrampool.whatif.cluster import MAX_RANKS, fewest_ranks
    from vrampool.whatif.plot import fit_svg

    with _model_prints_to_stderr():
        result = fewest_ranks(fn, memory, args.batch, args.strategy.split(","), steps=args.steps, max_ranks=min(args.max, MAX_RANKS), name=label, progress=progress, note=note)
    answers = {n: f"{f:,} ranks" if f else "none fits" for n, f in result.fewest.items()}
    if args.plot:
        _write(Path(args.plot), fit_svg(result, "ranks", f"{label}: ranks for a batch of {args.batch} in {_gib(memory)} per rank (simulated)", answers))
    if args.json:
        print(json.dumps({"model": label, "over": "ranks", "parallel": "fsdp", "steps": args.steps, **result.to_json()}))
        return 0
    print(f"{label}, {setting} per rank, {args.steps} training steps, FSDP, on a simulated device of {_gib(memory)} per rank")
    print("FSDP shards parameters, gradients and optimizer state over the ranks; activations do not shrink with more ranks\n")
    print(format_fewest_ranks(result))
    if args.plot:
        print(f"\nplot: {args.plot}")
    return 0


def format_fewest_ranks(result: Any) -> str:
    """The ``--over ranks`` table: each allocator's fewest ranks, and what a rank reserved there;
    "no number of ranks fits" where even the most ranks leave too much on a rank."""
    columns = f"{'allocator':<18} {'fewest ranks':>13} {'peak reserved':>14} {'live bytes':>12}"
    lines = [columns, "-" * len(columns)]
    for name in result.allocators:
        at = result.probe(result.fewest[name])
        if at is None:
            most = result.probe(result.bound)
            live = f": at {result.bound:,} ranks a rank still holds {_gib(most.lower_bound_bytes)} live, mostly activations" if most else ""
            lines.append(f"{name:<18} no number of ranks up to {result.bound:,} fits{live}")
            continue
        lines.append(f"{name:<18} {at.world_size:>13,} {_gib(at.peak_reserved_bytes[name]):>14} {_gib(at.lower_bound_bytes):>12}")
    return "\n".join(lines)


def _gib(n: float) -> str:
    """GiB from 1 GiB on, MiB below."""
    return f"{n / (1 << 30):,.2f} GiB" if n >= 1 << 30 else _mib(n)


def format_fit(result: Any, what: str) -> str:
    """The fit table: each allocator's largest size, beside torch's, and what it reserved there."""
    torch = result.largest.get("torch")
    columns = f"{'allocator':<18} {'largest ' + what:>22} {'vs torch':>9} {'peak reserved':>14} {'live bytes':>12}"
    lines = [columns, "-" * len(columns)]
    for name in result.allocators:
        largest = result.largest[name]
        at = result.probe(largest)
        vs = _ratio(largest, torch) if torch else "-"
        reserved = _gib(at.peak_reserved_bytes[name]) if at else "-"
        live = _gib(at.lower_bound_bytes) if at else "-"
        lines.append(f"{name:<18} {largest:>22,} {vs:>9} {reserved:>14} {live:>12}")
    return "\n".join(lines)


def summary_command(args: argparse.Namespace) -> int:
    """`vrampool summary`: what a trace holds, before replaying it."""
    from vrampool.whatif.replay import summary
    from vrampool.whatif.traces import load

    try:
        s = summary(_nonempty(load(args.trace)))
    except INPUT_ERRORS as e:
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
    not to or no plan was found in the budget (the message says which). With `--trace`, plans one
    step of the trace ahead (`plan_ahead_command`)."""
    if args.trace is not None:
        return plan_ahead_command(args)
    if args.save is not None or args.step is not None:
        raise CommandError(f"{'--save' if args.save is not None else '--step'} plans a trace's step ahead: give --trace")
    options = dict(algorithm=args.algorithm, budget_ms=args.budget_ms, alignment=1 if args.alignment is None else args.alignment)
    try:
        if args.capacity is None:
            result: Optional[PlanResult] = plan(args.input, **options)
            if not result.buffers:
                raise ValueError("the input holds no buffers")
        else:
            decision = decide(args.input, args.capacity, **options)
            result = decision.plan
    except INPUT_ERRORS as e:
        message = str(e)
        raise CommandError(message if message.startswith(args.input) else f"{args.input}: {message}") from None
    if result is None:
        if decision.status == "infeasible":
            message = f"proven infeasible: no plan fits in {decision.capacity:,} B"
        elif args.algorithm in ("greedy-by-size", "best-fit"):
            message = (
                f"{args.algorithm}'s plan does not fit in {decision.capacity:,} B; a heuristic searches"
                " no further and proves nothing (--algorithm auto or exact does)"
            )
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


def plan_ahead_command(args: argparse.Namespace) -> int:
    """`vrampool plan --trace T [--step N] [--save PLAN.json]`: plans one step of the trace ahead
    (:func:`vrampool.whatif.ahead.from_trace`), prints its figures (or JSON) and saves it if asked."""
    from vrampool.ahead import ALIGNMENT
    from vrampool.whatif.ahead import from_trace

    for option in ("capacity", "output"):
        if getattr(args, option) is not None:
            raise CommandError(f"--{option} is for --input; a plan ahead is saved with --save")
    if args.save:
        _check_writable([Path(args.save)])
    try:
        ahead = from_trace(args.trace, args.step, ALIGNMENT if args.alignment is None else args.alignment, args.budget_ms)
        if args.save:
            ahead.save(args.save)
    except INPUT_ERRORS as e:
        message = str(e)
        raise CommandError(message if message.startswith(args.trace) else f"{args.trace}: {message}") from None
    figures = {k: v for k, v in ahead.to_dict().items() if k != "buffers"}
    figures.update(buffers=len(ahead.rows), saved=args.save)
    if args.json:
        print(json.dumps(figures))
        return 0
    gap = ahead.arena_bytes / ahead.lower_bound_bytes if ahead.lower_bound_bytes else 1.0
    steps = len(ahead.rows) - ahead.first
    print(f"step         {ahead.step} of {args.trace}, {steps:,} buffers on {len({r[0] for r in ahead.rows})} stream(s)")
    if ahead.first:
        print(f"first step   {ahead.first:,} buffers (the weights and what else it leaves live stay in the arena)")
    print(f"arena        {ahead.arena_bytes:,} B")
    print(f"lower bound  {ahead.lower_bound_bytes:,} B  (arena / bound = {gap:.4f})")
    if args.save:
        print(f"saved        {args.save}  (DevicePool(plan=...), vrampool.torch.install(plan=...))")
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
    from vrampool.whatif.plot import memory_timeline_svg, segment_map_svg
    from vrampool.whatif.replay import check_conf, peak_segments, replay_each, split_conf
    from vrampool.whatif.workloads import capture_workload

    check_conf(args.conf, DEMO_STRATEGIES)
    out = Path(args.out)
    print(f"vrampool demo: {args.steps} training steps of each model, captured on the CPU and replayed on the simulated device")
    print("(default: vrampool as install() and DevicePool(0) set it up; torch, torch+expandable, rmm, cupy, async: models of those allocators)")
    print("(ahead: default served by a plan made ahead of the run's largest step and its first, as install(plan=...) serves it; plan: one arena at offsets planned for the whole run)")
    print("(last pass calls: device allocations and frees in the last pass alone, the cost of every step once warm)\n")
    for model in ("gpt", "cnn"):
        what = "a small GPT, sequence length varying per step" if model == "gpt" else "a small CNN, batch size varying per step"
        trace = capture_workload(model, args.steps, args.seed, lambda b, m=model: _progress(b, args.steps, f"capture {m}"), args.scale)
        _write(out / f"{model}-trace.jsonl", trace.to_jsonl())
        replays = replay_each(trace, DEMO_STRATEGIES, args.conf, repeat=DEMO_PASSES)
        reports = list(_progress(replays, len(DEMO_STRATEGIES), f"replay {model}"))
        events = reports[0]["events"] // DEMO_PASSES
        print(f"{model}: {what}: {len(trace.rows()):,} buffers, {events:,} events a pass, {DEMO_PASSES} passes, lower bound {_mib(reports[0]['lower_bound_bytes'])}")
        print(format_reports(reports, DEMO_PASSES) + "\n")
        title = f"{model}: memory over {DEMO_PASSES} passes of {args.steps} training steps"
        _write(out / f"{model}-memory.svg", memory_timeline_svg(reports, title))
        segments = peak_segments(trace, "default", split_conf(["default"], args.conf)["default"])
        _write(out / f"{model}-segments.svg", segment_map_svg(segments, f"{model}: default pool's segments at the peak"))
    print(f"plots and traces: {out}/ (<model>-memory.svg, <model>-segments.svg, <model>-trace.jsonl)")


def gpu_comparison(steps: int, scale: int = 1) -> None:
    """Trains each model (batches times ``scale``) on CUDA with PyTorch's allocator and with
    vrampool's, each in a fresh process (an allocator is chosen before the first CUDA tensor),
    and prints both peaks."""
    print("\nOn the GPU: the same training with each allocator\n")
    print(f"{'model':<6} {'allocator':<10} {'peak reserved':>14} {'peak allocated':>15} {'seconds':>8}")
    for model in ("gpt", "cnn"):
        for allocator in ("pytorch", "vrampool"):
            code = f"import json, vrampool.whatif.workloads as w; print(json.dumps(w.measure_cuda({model!r}, {allocator!r}, {steps}, scale={scale})))"
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                print(f"{model:<6} {allocator:<10} failed: {last}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{model:<6} {allocator:<10} {_mib(r['peak_reserved_bytes']):>14} {_mib(r['peak_allocated_bytes']):>15} {r['seconds']:>8.2f}")


def _parser() -> argparse.ArgumentParser:
    from vrampool.whatif.replay import ALL, COMPARE, DEFAULT, PEERS, STRATEGIES, VM_SUFFIX
    from vrampool.whatif.workloads import MODELS

    parser = _Parser(prog="vrampool", description="GPU memory pool tools.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    trace_help = "trace file: JSON lines, id,lower,upper,size[,stream] CSV, or a PyTorch memory snapshot pickle"

    p = sub.add_parser("demo", help="capture a small GPT's and a CNN's training on the CPU and compare the strategies")
    p.add_argument("--steps", type=int, default=12, help="training steps of each model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="vrampool-demo", help="directory for the plots and traces")
    # Eight times the usual batches: a few hundred MiB live, where 2 MiB segment granularity no
    # longer decides the figures, still captured in well under a minute.
    p.add_argument("--scale", type=int, default=8, help="batches this many times the usual (more memory, more CPU time)")
    p.add_argument("--conf", default="", help="pool options for every strategy, as in VRAMPOOL_CONF (e.g. small_max:16KB)")

    p = sub.add_parser("capture", help="record a model's training steps as a trace, under fake tensors (no memory needed) or for real")
    p.add_argument("--model", required=True, help=f"a built-in ({', '.join(MODELS)}) or module:function / path/to/file.py:function returning (model, batch) or a training step")
    p.add_argument("--steps", type=int, help="training steps (default 12 for gpt and cnn, else one per --seq length)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=int, default=1, help="gpt and cnn: batches this many times the usual")
    p.add_argument("--batch", type=int, help="gpt2-medium and llama: sequences per batch (default 8)")
    p.add_argument("--seq", help="gpt2-medium and llama: sequence length, or lengths separated by commas, one per step (default 1024)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--fake", dest="fake", action="store_true", default=True, help="under fake tensors: shapes and lifetimes, no compute, no memory (the default)")
    how.add_argument("--real", dest="fake", action="store_false", help="run the steps for real on the CPU (for models with ops fake tensors cannot run)")
    p.add_argument("--parallel", choices=("ddp", "fsdp"), help="ranks of data-parallel or FSDP2 training, through torch's fake process group")
    p.add_argument("--ranks", type=int, default=1, help="with --parallel: the world size (one trace per rank: NAME-rankR.jsonl)")
    p.add_argument("--output", help="trace file (.jsonl, or .csv for rows); default <model>-trace.jsonl")
    p.add_argument("--json", action="store_true", help="print JSON instead of a line for people")

    p = sub.add_parser("replay", help="replay a trace through vrampool, models of PyTorch's, RMM's, CuPy's allocators and the static plan")
    p.add_argument("trace", help=trace_help)
    rows = ", ".join((DEFAULT,) + PEERS + STRATEGIES + ("NAME" + VM_SUFFIX, "plan", "ahead (see --ahead)"))
    p.add_argument(
        "--strategy",
        default="compare",
        help=f"rows, separated by commas: {rows}; compare ({', '.join(COMPARE)}, the default) or all ({', '.join(ALL)})",
    )
    p.add_argument("--conf", default="", help="options: the pool's as in VRAMPOOL_CONF (small_max:64KB) and the models' own (max_split_size_mb:256 for torch); each row takes the keys it knows")
    p.add_argument("--memory", help="the simulated device's memory (e.g. 80GB): a row that runs out says OOM")
    p.add_argument("--json", action="store_true", help="print JSON (a list when several rows run)")
    p.add_argument("--plot", help="write an SVG of allocated and reserved bytes over the replay")
    p.add_argument("--repeat", type=int, default=1, help="replay the trace this many times back to back (a warm pool, for events/s)")
    p.add_argument(
        "--ahead",
        metavar="STEP",
        help="add the row ahead: default served by a plan made ahead of STEP's largest step (a trace, or a plan saved by vrampool plan --save, .json), or of this trace's own largest step (largest)",
    )

    from vrampool.whatif.fit import ALLOCATORS, MAX_SIZE
    from vrampool.whatif.models import LLAMA_SIZES

    p = sub.add_parser("fit", help="the largest batch (or sequence length) whose training steps fit in --memory, under each allocator (simulated); on every rank with --parallel; the fewest ranks with --over ranks")
    p.add_argument("--model", required=True, help="a built-in (gpt2-medium, llama) or module:function taking the batch size (or sequence length)")
    p.add_argument("--size", choices=tuple(LLAMA_SIZES), help="llama: the model's size (default 1b)")
    p.add_argument("--memory", required=True, help="the device's memory (per rank with --parallel), e.g. 80GB (binary units)")
    p.add_argument(
        "--over",
        choices=("batch", "seq", "ranks"),
        default="batch",
        help="grow the batch size (default) or the sequence length; or, with --parallel fsdp and --batch, find the fewest ranks (powers of two) at which it fits",
    )
    p.add_argument("--parallel", choices=("ddp", "fsdp"), help="every rank of data-parallel or FSDP2 training must fit (captured through torch's fake process group)")
    p.add_argument("--ranks", type=int, default=1, help="with --parallel: the world size (one rank captured per kind of shard)")
    p.add_argument("--batch", type=int, help="built-ins with --over seq: sequences per batch (default 8); with --over ranks: the per-rank batch")
    p.add_argument("--seq", type=int, help="built-ins with --over batch: sequence length (default 1024)")
    p.add_argument("--steps", type=int, default=2, help="training steps per try (the second runs on the first one's cache)")
    p.add_argument("--strategy", default=",".join(ALLOCATORS), help=f"allocators, separated by commas (default {','.join(ALLOCATORS)})")
    p.add_argument("--max", type=int, default=MAX_SIZE, help="the largest size tried (with --over ranks: the most ranks, at most 4096)")
    p.add_argument("--json", action="store_true", help="print JSON: each allocator's largest size and every probe")
    p.add_argument("--plot", help="write an SVG of peak reserved against the size, per allocator")

    p = sub.add_parser("summary", help="what a trace holds: events, buffers, sizes by tier, lifetimes")
    p.add_argument("trace", help=trace_help)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("plan", help="plan buffer lifetimes (id,lower,upper,size CSV) into one arena, or a trace's largest step ahead (--trace)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", help="CSV in MiniMalloc's format")
    source.add_argument("--trace", help=f"plan one step of this trace ahead, at its largest shape ({trace_help})")
    p.add_argument("--step", type=int, help="with --trace: the step (from 0; default the largest that frees what it allocates)")
    p.add_argument("--save", metavar="PLAN.json", help="with --trace: write the plan for DevicePool(plan=...) and vrampool.torch.install(plan=...)")
    p.add_argument("--algorithm", default="auto", choices=ALGORITHMS)
    p.add_argument("--budget-ms", type=int, default=5000, help="time for the exact search (per stream, with --trace)")
    p.add_argument("--alignment", type=int, help="offsets' alignment (default 1; 512, the pool's, with --trace)")
    p.add_argument("--capacity", type=int, metavar="BYTES", help="decide this arena size instead: a plan within it, or why not")
    p.add_argument("--output", help="write the plan as id,lower,upper,size,offset CSV")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


COMMANDS = {"demo": demo_command, "capture": capture_command, "replay": replay_command, "fit": fit_command, "summary": summary_command, "plan": plan_command}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    wrong = _out_of_bounds(args)
    if wrong:
        print(f"vrampool {args.command}: {wrong}", file=sys.stderr)
        return 1
    try:
        return COMMANDS[args.command](args)
    except CommandError as e:
        message = str(e)
    except ModuleNotFoundError as e:
        message = "needs PyTorch (pip install torch)" if e.name == "torch" else f"internal error: {e!r} (please report it)"
    except INPUT_ERRORS as e:
        message = str(e)
    except KeyboardInterrupt:
        print(f"vrampool {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: still one line, with what to report
        message = f"internal error: {type(e).__name__}: {e} (please report it)"
    print(f"vrampool {args.command}: {_one_line(message)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
