"""The static planner: tensor lifetimes in, offsets in one arena out.

>>> import vrampool
>>> result = vrampool.plan([(0, 0, 2, 100), (1, 1, 3, 50), (2, 2, 4, 100)])
>>> result.arena_bytes, result.lower_bound_bytes
(150, 150)
>>> vrampool.decide([(0, 0, 2, 100), (1, 1, 3, 50)], capacity=149).status
'infeasible'
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable, List, Literal, Optional, Sequence, Tuple, Union

from vrampool._native import decide_buffers, plan_buffers, plan_to_csv, read_buffers_csv
from vrampool.inputs import read_text

#: One buffer: (id, lower, upper, size): live on [lower, upper), size bytes.
Row = Tuple[int, int, int, int]
ALGORITHMS = ("auto", "greedy-by-size", "best-fit", "exact")


@dataclasses.dataclass(frozen=True)
class PlanResult:
    """A plan: ``offsets[i]`` is where buffer ``buffers[i]`` lives in the arena."""

    buffers: List[Row]
    offsets: List[int]
    arena_bytes: int
    lower_bound_bytes: int
    #: The best lower bound known: ``lower_bound_bytes``, or more where the exact search proved
    #: that no smaller arena fits; equal to ``arena_bytes`` when the plan is optimal.
    best_bound_bytes: int
    algorithm: str
    seconds: float
    optimal: bool

    def to_json(self) -> dict:
        """The figures and the buffers with their offsets, for ``vrampool plan --json``."""
        return {
            "arena_bytes": self.arena_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "best_bound_bytes": self.best_bound_bytes,
            "algorithm": self.algorithm,
            "seconds": self.seconds,
            "optimal": self.optimal,
            "buffers": [
                {"id": i, "lower": lo, "upper": up, "size": size, "offset": off}
                for (i, lo, up, size), off in zip(self.buffers, self.offsets)
            ],
        }

    def to_csv(self) -> str:
        """MiniMalloc's output format ``id,lower,upper,size,offset`` (checked before writing)."""
        return plan_to_csv(self.buffers, self.offsets)


def read_csv(path: Union[str, Path]) -> List[Row]:
    """Buffers from an ``id,lower,upper,size`` CSV file (MiniMalloc's format)."""
    return read_buffers_csv(read_text(path))


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether the buffers fit in ``capacity`` bytes: ``fits`` (with ``plan``), ``infeasible``
    (proven: no plan fits) or ``unknown`` (the budget ran out first)."""

    status: Literal["fits", "infeasible", "unknown"]
    capacity: int
    plan: Optional[PlanResult]


def _options(algorithm: str, budget_ms: int, alignment: int) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    for name, value in (("budget_ms", budget_ms), ("alignment", alignment)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "alignment" else 0):
            raise ValueError(f"{name} must be a {'positive' if name == 'alignment' else 'non-negative'} int, got {value!r}")


def _rows(buffers: Union[str, Path, Iterable[Sequence[int]]]) -> List[Row]:
    if isinstance(buffers, (str, Path)):
        return read_csv(buffers)
    rows = []
    for row in buffers:
        if len(row) != 4 or not all(isinstance(v, int) and not isinstance(v, bool) for v in row):
            raise ValueError(f"a buffer is (id, lower, upper, size) ints, got {row!r}")
        if any(v < 0 for v in row):
            raise ValueError(f"negative value in buffer {row!r}")
        if any(v >= 1 << 64 for v in row):
            raise ValueError(f"value above 2**64 - 1 in buffer {row!r}")
        rows.append(tuple(row))
    return rows


def plan(
    buffers: Union[str, Path, Iterable[Sequence[int]]],
    *,
    algorithm: str = "auto",
    budget_ms: int = 5000,
    alignment: int = 1,
) -> PlanResult:
    """Offsets for ``buffers`` (rows ``(id, lower, upper, size)`` or a CSV path) in one arena.

    ``auto`` runs greedy by size and best fit, then, short of the lower bound, an exact search
    for at most ``budget_ms``; the result is checked by an independent validator.
    """
    _options(algorithm, budget_ms, alignment)
    rows = _rows(buffers)
    result = plan_buffers(rows, algorithm, budget_ms, alignment)
    return PlanResult(buffers=list(rows), **result)


def decide(
    buffers: Union[str, Path, Iterable[Sequence[int]]],
    capacity: int,
    *,
    algorithm: str = "auto",
    budget_ms: int = 5000,
    alignment: int = 1,
) -> Decision:
    """Whether ``buffers`` fit in an arena of ``capacity`` bytes, as MiniMalloc decides it.

    The heuristics first, then (``auto``, ``exact``) the exact search at that capacity for at most
    ``budget_ms``. A capacity of zero, or below the largest (aligned) buffer, raises ``ValueError``.
    """
    _options(algorithm, budget_ms, alignment)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or not 0 < capacity < 1 << 64:
        raise ValueError(f"capacity must be a positive int below 2**64, got {capacity!r}")
    rows = _rows(buffers)
    result = decide_buffers(rows, capacity, algorithm, budget_ms, alignment)
    status = result.pop("status")
    return Decision(status=status, capacity=capacity, plan=PlanResult(buffers=list(rows), **result) if result else None)
