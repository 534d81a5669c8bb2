"""Allocation traces and their replay through each strategy.

The trace format is the planner's CSV, ``id,lower,upper,size``, with an optional ``stream``
column: one buffer a row, live on ``[lower, upper)``, the times being event indices or any
monotone clock. Replaying turns the rows into events (at each time, frees before allocations,
ties broken by id) and feeds them to a pool on the address-only simulated device.

>>> from vrampool.trace import replay
>>> r = replay([(0, 0, 2, 1 << 20), (1, 1, 3, 1 << 20), (2, 2, 4, 1 << 20)])
>>> r["strategy"], r["lower_bound_bytes"]
('hybrid', 2097152)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence, Tuple, Union

from vrampool import _native

#: One buffer: (id, lower, upper, size, stream).
TraceRow = Tuple[int, int, int, int, int]
#: The figures of one replay.
Report = Dict[str, Any]
STRATEGIES = ("slab", "best_fit", "buddy", "hybrid")

#: The keys of every report (``vrampool replay --json`` prints these, among others).
REPORT_KEYS = ("strategy", "peak_reserved_bytes", "peak_allocated_bytes", "lower_bound_bytes", "events", "events_per_s")


def read_trace(path: Union[str, Path]) -> List[TraceRow]:
    """The buffers of a trace CSV file, as ``(id, lower, upper, size, stream)`` rows (stream 0
    where the file has no stream column). Raises ``ValueError`` naming the line of bad input."""
    return _native.read_trace_csv(Path(path).read_text())


def _rows(trace: Union[str, Path, Iterable[Sequence[int]]]) -> List[TraceRow]:
    if isinstance(trace, (str, Path)):
        return read_trace(trace)
    rows = []
    for number, row in enumerate(trace):
        row = tuple(int(v) for v in row)
        if len(row) == 4:
            row = row + (0,)
        elif len(row) != 5:
            raise ValueError(f"row {number}: expected (id, lower, upper, size[, stream]), got {len(row)} values")
        if min(row) < 0:
            raise ValueError(f"row {number}: negative value in {row}")
        rows.append(row)
    return rows


def replay(
    trace: Union[str, Path, Iterable[Sequence[int]]],
    strategy: str = "hybrid",
    conf: str = "",
) -> Union[Report, List[Report]]:
    """Replays a trace (a CSV path, or ``(id, lower, upper, size[, stream])`` rows) through
    ``strategy``; ``"all"`` replays it through every strategy. ``conf`` sets other pool options
    in ``VRAMPOOL_CONF`` form (e.g. ``"round_up_divisions:4"``).

    Returns a dict for one strategy and a list of dicts for ``"all"``, with the keys
    ``strategy``, ``peak_reserved_bytes``, ``peak_allocated_bytes``, ``lower_bound_bytes``,
    ``events``, ``events_per_s``, ``seconds`` and ``device_allocs``.
    """
    reports = _native.replay_trace(_rows(trace), strategy, conf)
    return reports if strategy.lower() == "all" else reports[0]
