"""The replay of allocation traces through each strategy, the models of other allocators and the
static plan.

A trace is a file (JSON lines, the ``id,lower,upper,size[,stream]`` CSV, or a PyTorch memory
snapshot pickle: see :mod:`vrampool.whatif.traces`), a :class:`~vrampool.whatif.traces.Trace`, or
rows ``(id, lower, upper, size[, stream])``: one buffer a row, live on ``[lower, upper)``.
Replaying turns the rows into events (at each time, frees before allocations, ties broken by id)
and feeds them to a pool on the address-only simulated device, or hands them to the static planner.

>>> from vrampool.whatif.replay import replay
>>> r = replay([(0, 0, 2, 1 << 20), (1, 1, 3, 1 << 20), (2, 2, 4, 1 << 20)])
>>> r["strategy"], r["lower_bound_bytes"]
('default', 2097152)
"""

from __future__ import annotations

import bisect
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from vrampool._native import (
    ALIGNMENT,
    ALLOCATOR_MODELS,
    LARGE_MIN,
    SMALL_MAX,
    allocator_options,
    conf_pairs,
    live_bytes,
    replay_trace,
    row_conf,
)
from vrampool._native import STRATEGIES as _STRATEGIES
from vrampool._native import peak_segments as _peak_segments
from vrampool.whatif.traces import Trace, TraceLike, TraceRow, load

if TYPE_CHECKING:
    from vrampool.ahead import Plan

#: The figures of one replay.
Report = Dict[str, Any]

#: The pool's strategies. A name ending in ``+vm`` grows by mapping virtual memory (the
#: ``expandable`` option); plain names use plain segments, as on a device without it.
STRATEGIES = tuple(_STRATEGIES)
VM_SUFFIX = "+vm"
#: What ``vrampool.torch.install()`` and ``DevicePool(0)`` give on a GPU: the pool's default
#: configuration (hybrid, growing its middle tier by mapping 2 MiB chunks of virtual memory).
DEFAULT = "default"
#: Models of the allocators people run today (``vrampool_whatif::peers``): PyTorch's caching
#: allocator (plain and with ``expandable_segments:True``), RMM's pool, CuPy's pool, and the
#: driver's ``cudaMallocAsync`` pool (approximate: its internals are not public).
PEERS = tuple(ALLOCATOR_MODELS)
TORCH = "torch"
#: The static planner's row: every buffer placed in one arena ahead of time.
PLAN = "plan"
#: ``default`` served by a plan made ahead of one step at its largest shape (:mod:`vrampool.ahead`,
#: ``DevicePool(plan=)``): see :func:`ahead_plan`.
AHEAD = "ahead"
#: ``ahead="largest"``: the plan of the replayed trace's own largest step.
LARGEST = "largest"
#: The rows a replay shows unless told otherwise: vrampool as installed, beside PyTorch's allocator.
COMPARE = (DEFAULT, TORCH, TORCH + "+expandable")
#: What ``strategy="all"`` replays, in order (``hybrid+vm`` is ``default``'s strategy: not repeated).
ALL = (DEFAULT,) + PEERS + STRATEGIES + (PLAN,)

#: The keys of every report (``vrampool replay --json`` prints these, among others).
REPORT_KEYS = ("strategy", "peak_reserved_bytes", "peak_allocated_bytes", "lower_bound_bytes", "events", "events_per_s")
#: Timeline points each replay samples for the plots.
SAMPLES = 1000
#: The planner's time for its exact search, per trace: replays should take seconds, not minutes.
PLAN_BUDGET_MS = 500


def repeated(rows: Sequence[TraceRow], times: int) -> List[TraceRow]:
    """The rows ``times`` times over, each copy after the last with fresh ids: a long trace on
    which a pool runs warm, for measuring events per second."""
    if times < 1:
        raise ValueError(f"times must be at least 1, got {times}")
    span = max((r[2] for r in rows), default=0)
    ids = max((r[0] for r in rows), default=0) + 1
    return [(i + k * ids, lo + k * span, up + k * span, size, stream) for k in range(times) for i, lo, up, size, stream in rows]


def strategy_names(strategy: Union[str, Sequence[str]]) -> List[str]:
    """The rows a ``strategy`` argument asks for: a name, names separated by commas, ``"all"``
    (:data:`ALL`), ``"compare"`` (:data:`COMPARE`) or a list."""
    if strategy == "all":
        return list(ALL)
    if strategy == "compare":
        return list(COMPARE)
    names = [n.strip() for n in strategy.split(",") if n.strip()] if isinstance(strategy, str) else list(strategy)
    for name in names:
        if name not in (DEFAULT, PLAN, AHEAD) + PEERS and name.removesuffix(VM_SUFFIX) not in STRATEGIES:
            choices = ", ".join((DEFAULT,) + PEERS + STRATEGIES + ("NAME" + VM_SUFFIX, PLAN, AHEAD, "compare", "all"))
            raise ValueError(f"unknown strategy {name!r}; choose one of {choices}")
    if not names:
        raise ValueError("no strategy named")
    return names


def pool_conf(name: str, conf: str = "") -> str:
    """The ``VRAMPOOL_CONF`` text of a pool row: ``default`` is the pool's defaults; other names
    set their strategy, with virtual-memory growth on for ``+vm`` names and off otherwise; then
    ``conf``, which may not change those (``strategy:slab`` for the row ``best_fit`` is a
    ``ValueError``: the row would run as slab under best_fit's name)."""
    return row_conf(name, conf)


def _owner(name: str) -> str:
    """Whose options a row takes: the pool's, or its allocator model's."""
    return name if name in PEERS else "pool"


def split_conf(names: Sequence[str], conf: str) -> Dict[str, str]:
    """Each row's share of ``conf``: the pool's options go to the pool rows, each allocator
    model's (``PYTORCH_CUDA_ALLOC_CONF`` keys for ``torch``...) to that model's rows. A key no row
    takes is a ``ValueError`` that lists the keys each row takes; a share that would change what
    a row's name says (``strategy:slab`` for ``best_fit``, ``expandable_segments:True`` for
    ``torch``) is refused by the replay itself."""
    pairs = conf_pairs(conf)
    owners = {_owner(n) for n in names if n != PLAN}
    keys = {owner: set(allocator_options(owner)) for owner in owners}
    for key, _ in pairs:
        if not any(key in k for k in keys.values()):
            valid = "; ".join(f"{owner}: {', '.join(allocator_options(owner))}" for owner in sorted(owners))
            raise ValueError(f"unknown option `{key}` for {', '.join(sorted(owners)) or 'the plan'} (valid: {valid or 'none'})")
    return {n: ",".join(f"{k}:{v}" for k, v in pairs if k in keys.get(_owner(n), ())) for n in names}


def check_conf(conf: str, names: Sequence[str] = (DEFAULT,)) -> None:
    """Raises ``ValueError`` if ``conf`` is no valid configuration of the rows (before long work)."""
    shares = split_conf(names, conf)
    replay_trace([], [(n, shares[n]) for n in names if n not in (PLAN, AHEAD)], 0)


def ahead_plan(step: Union[str, Path, "Plan", TraceLike], trace: Optional[TraceLike] = None) -> "Plan":
    """The plan of the ``ahead`` row: for ``"largest"``, of ``trace``'s own largest step; a plan
    (a :class:`vrampool.ahead.Plan`, or one saved by ``vrampool plan --trace --save``: a ``.json``
    file) as it is; else of the largest step of the trace ``step``. The step is the one
    :func:`vrampool.whatif.ahead.from_trace` picks: the largest by peak live bytes among those that leave
    the fewest buffers live (a capture's first step also makes the parameters and the optimizer's
    state, which a plan must not hold)."""
    from vrampool.ahead import Plan
    from vrampool.whatif.ahead import from_trace

    if isinstance(step, Plan):
        return step
    if isinstance(step, (str, Path)) and Path(step).suffix == ".json":
        return Plan.load(step)
    if isinstance(step, str) and step == LARGEST:
        if trace is None:
            raise ValueError(f"ahead={LARGEST!r} plans the replayed trace's largest step: give the trace")
        return from_trace(load(trace), source=str(trace) if isinstance(trace, (str, Path)) else "the replayed trace")
    return from_trace(load(step), source=str(step) if isinstance(step, (str, Path)) else "trace")


def replay_each(
    trace: TraceLike,
    strategy: Union[str, Sequence[str]] = "all",
    conf: str = "",
    samples: int = SAMPLES,
    capacity: Optional[int] = None,
    repeat: int = 1,
    ahead: Union[None, str, Path, "Plan", TraceLike] = None,
) -> Iterator[Report]:
    """Yields one report per row (see :func:`replay`) as each finishes, for progress bars.
    ``repeat`` replays the trace that many times back to back on the same pool or model (a warm
    one, for events per second) in the memory of one copy; the plan's row is the same arena for
    any. ``ahead`` adds the row ``ahead`` with the plan :func:`ahead_plan` makes of it (the row
    named without ``ahead`` plans the trace's largest step): the pool as installed, served by the
    plan as ``vrampool.torch.install(plan=...)`` serves it: a plan with a first step of its own
    (:attr:`vrampool.ahead.Plan.first`) set at the first allocation, any other at the trace's first
    ``step`` event (the end of the first optimizer step; in a trace without one, at the first
    allocation), its steps ended at each ``step`` event; each copy of a repeated replay sets it
    again."""
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be a positive int, got {repeat!r}")
    names = strategy_names(strategy)
    if ahead is not None and AHEAD not in names:
        names.append(AHEAD)
    shares = split_conf(names, conf)
    loaded = load(trace)
    rows = loaded.rows()
    recorded = loaded.peak_reserved_bytes()
    if AHEAD in names:
        plan = ahead_plan(LARGEST if ahead is None else ahead, loaded)
        planned = {"ahead": (list(plan.rows), list(plan.offsets), plan.alignment, plan.first), "steps": [t for t, e in enumerate(loaded.events) if e.op == "step"]}
    for name in names:
        if name == PLAN:
            report = _plan_report(rows, samples, capacity)
            report["timeline"] = _repeated_timeline(report["timeline"], report["events"], repeat, samples)
            report["events"] *= repeat
            # The arena is reserved once, before the first pass.
            report["last_pass_device_allocs"] = report["device_allocs"] if repeat == 1 else 0
        else:
            report = replay_trace(rows, [(name, shares[name])], samples, capacity, repeat, **(planned if name == AHEAD else {}))[0]
            report["strategy"] = name
        if recorded is not None:
            report["recorded_reserved_bytes"] = recorded
        yield report


def replay(
    trace: TraceLike,
    strategy: Union[str, Sequence[str]] = DEFAULT,
    conf: str = "",
    samples: int = SAMPLES,
    capacity: Optional[int] = None,
) -> Union[Report, List[Report]]:
    """Replays a trace through ``strategy``: ``default`` (the pool as installed), a pool strategy
    (``slab``, ``best_fit``, ``buddy``, ``hybrid``, any of them with ``+vm`` for virtual-memory
    growth), an allocator model (``torch``, ``torch+expandable``, ``rmm``, ``cupy``, ``async``),
    ``plan`` (the static planner's arena), ``ahead`` (``default`` served by a plan made ahead of the
    trace's largest step: see :func:`replay_each`), ``"compare"`` (:data:`COMPARE`), ``"all"``
    (:data:`ALL`), or several of those (a list, or names separated by commas). ``conf`` sets
    options: the pool's in ``VRAMPOOL_CONF`` form (e.g. ``"round_up_divisions:4"``) and each
    model's own (``"max_split_size_mb:256"`` for ``torch``); each row takes the keys it knows.
    ``capacity`` limits the simulated device's memory: a row that runs out of memory (after its
    allocator's own release and retry) stops there, with ``out_of_memory`` set.

    Returns a dict for one name and a list of dicts otherwise, with the keys ``strategy``,
    ``peak_reserved_bytes``, ``peak_allocated_bytes``, ``lower_bound_bytes``, ``events``,
    ``events_per_s``, ``seconds``, ``device_allocs`` and ``device_frees`` (segments or map calls,
    and frees or unmap calls), ``first_pass_peak_reserved_bytes``, ``last_pass_device_allocs`` and
    ``last_pass_device_frees`` (the steady state of a repeated replay), ``fragmentation`` (at the moment of most
    allocated, None for the plan), ``approximate``, ``out_of_memory`` and ``timeline``
    (``event``, ``allocated_bytes`` and ``reserved_bytes`` lists of up to ``samples`` points). For
    a trace from a PyTorch snapshot or an event log, ``recorded_reserved_bytes`` is what that
    allocator reserved at its peak.
    """
    reports = list(replay_each(trace, strategy, conf, samples, capacity))
    return reports[0] if len(reports) == 1 and isinstance(strategy, str) and strategy not in ("all", "compare") and "," not in strategy else reports


def _repeated_timeline(timeline: Dict[str, List[int]], events: int, repeat: int, samples: int) -> Dict[str, List[int]]:
    """One pass's timeline (of ``events`` events) laid ``repeat`` times end to end, thinned to at
    most ``samples`` points as a replay's own timeline is."""
    if repeat == 1 or not samples:
        return timeline
    keys = list(timeline)  # event, then the figures at it
    points = [(k * events + p[0], *p[1:]) for k in range(repeat) for p in zip(*timeline.values())]
    stride = -(-len(points) // samples)
    kept = points[stride - 1 :: stride]
    if points and (not kept or kept[-1] is not points[-1]):
        kept.append(points[-1])
    return {key: [p[i] for p in kept] for i, key in enumerate(keys)}


def _plan_report(rows: List[TraceRow], samples: int, capacity: Optional[int] = None) -> Report:
    """The static plan as a replay row: one arena of the plan's size, reserved from the start."""
    from vrampool.planner import plan

    start = time.perf_counter()
    result = plan([r[:4] for r in rows], budget_ms=PLAN_BUDGET_MS, alignment=ALIGNMENT)
    seconds = time.perf_counter() - start
    events = 2 * len(rows)
    lower_bound, points, live = live_bytes(rows, samples)
    # The planner's bound counts sizes rounded to the alignment, as a pool's allocated bytes do;
    # the report's bound is the requested bytes', as in every other row.
    return {
        "strategy": PLAN,
        "peak_reserved_bytes": result.arena_bytes,
        "peak_allocated_bytes": result.lower_bound_bytes,
        "lower_bound_bytes": lower_bound,
        "events": events,
        "seconds": seconds,
        "events_per_s": events / seconds if seconds > 0 else 0.0,
        "device_allocs": 1,
        "device_frees": 0,
        "first_pass_peak_reserved_bytes": result.arena_bytes,
        "last_pass_device_allocs": 1,
        "last_pass_device_frees": 0,
        "fragmentation": None,
        "approximate": False,
        # The arena is reserved whole before the first event.
        "out_of_memory": {"event": 0, "requested_bytes": result.arena_bytes, "allocated_bytes": 0, "reserved_bytes": 0, "largest_free_bytes": 0}
        if capacity is not None and result.arena_bytes > capacity
        else None,
        "timeline": {"event": points, "allocated_bytes": live, "reserved_bytes": [result.arena_bytes] * len(points)},
    }


def live_bytes_timeline(rows: Iterable[TraceRow], samples: int = SAMPLES) -> Tuple[List[int], List[int]]:
    """Requested bytes live after evenly spaced event indices, as the replay samples them."""
    _, points, live = live_bytes(list(rows), samples)
    return points, live


def recorded_reserved_timeline(trace: Trace) -> Tuple[List[int], List[int]]:
    """What the recording allocator reserved, as ``(replay event index, bytes)`` steps: the
    trace's times mapped onto the replay's event count (step markers make no events)."""
    if not trace.reserved:
        return [], []
    made = [0]  # made[t]: replay events before trace time t
    for e in trace.events:
        made.append(made[-1] + (e.op != "step"))
    return [made[min(t, len(made) - 1)] for t, _ in trace.reserved], [b for _, b in trace.reserved]


def peak_segments(trace: TraceLike, strategy: str = "hybrid", conf: str = "") -> List[Dict[str, Any]]:
    """The segments (``DevicePool.snapshot()["segments"]``) of a pool that has replayed
    ``trace`` up to its moment of most live bytes: the segment map at the peak."""
    name = strategy_names(strategy)[0]
    if name == PLAN or name in PEERS:
        raise ValueError(f"{name} has no vrampool segments: pick a pool strategy")
    return _peak_segments(load(trace).rows(), name, conf)


def summary(trace: TraceLike) -> Dict[str, Any]:
    """A trace's figures: events, buffers, steps, peak live bytes, a size histogram by the
    hybrid's tiers (and by power of two), and buffer lifetimes in events."""
    loaded = load(trace)
    rows = loaded.rows()
    sizes = sorted(r[3] for r in rows)
    lifetimes = sorted(r[2] - r[1] for r in rows)
    small, large = f"slab (<= {SMALL_MAX >> 20} MiB)", f"buddy (>= {LARGE_MIN >> 20} MiB)"
    tiers = {small: 0, "best_fit": 0, large: 0}
    tier_bytes = dict.fromkeys(tiers, 0)
    powers: Dict[int, int] = {}
    for size in sizes:
        tier = small if size <= SMALL_MAX else large if size >= LARGE_MIN else "best_fit"
        tiers[tier] += 1
        tier_bytes[tier] += size
        power = 1 << (size - 1).bit_length()
        powers[power] = powers.get(power, 0) + 1

    def quantile(q: float) -> int:
        return lifetimes[min(len(lifetimes) - 1, int(q * len(lifetimes)))] if lifetimes else 0

    step_times = [t for t, e in enumerate(loaded.events) if e.op == "step"]
    steps = len(step_times)
    across = sum(bisect.bisect_left(step_times, r[2]) > bisect.bisect_left(step_times, r[1]) for r in rows)
    return {
        "events": sum(e.op != "step" for e in loaded.events),
        "buffers": len(rows),
        "steps": steps,
        "streams": len({r[4] for r in rows}),
        "peak_live_bytes": loaded.peak_allocated_bytes(),
        "recorded_reserved_bytes": loaded.peak_reserved_bytes(),
        "total_bytes": sum(sizes),
        "size_bytes": {"min": sizes[0] if sizes else 0, "median": int(statistics.median(sizes)) if sizes else 0, "max": sizes[-1] if sizes else 0},
        "tiers": {name: {"buffers": tiers[name], "bytes": tier_bytes[name]} for name in tiers},
        "size_histogram": {str(k): v for k, v in sorted(powers.items())},
        "lifetime_events": {"median": quantile(0.5), "p90": quantile(0.9), "max": lifetimes[-1] if lifetimes else 0},
        "buffers_across_steps": across,
    }
