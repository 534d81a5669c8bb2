"""Plans made ahead at a step's largest shape: the rule for models whose shapes change.

Plan one step once, statically, at its largest shape (the longest sequence, the largest batch).
A pool given the plan serves every step by it from the very first: a step's i-th allocation takes
the plan's i-th offset when it fits there (the same stream, at most the planned size, none of
those bytes in use now), so a smaller step's buffers sit inside the plan. One whose bytes are
still in use goes to the pool alone; the first of another stream or a larger size ends the
plan's part in that step and the rest of the step goes to the pool (counted in
``steady_stats()["fallbacks"]``). The arena, one region per stream, is taken when the plan is
set. A step ends once everything it allocated is freed, or once its part of the plan is used up
and only what the plan keeps past the step is live (or, under :func:`vrampool.torch.install`,
at each optimizer step).

A :class:`Plan` comes from rows (:func:`plan_step`); the what-if makes one from a captured trace
(:func:`vrampool.whatif.ahead.from_trace`) or from a training step run under fake tensors
(:func:`vrampool.whatif.ahead.capture`: no GPU, no memory). It is saved and loaded as a checked file (:meth:`Plan.save`,
:meth:`Plan.load`), and set with ``DevicePool(plan=...)``, :meth:`vrampool.DevicePool.set_plan`
or ``vrampool.torch.install(plan=...)``.

>>> import os, tempfile
>>> import vrampool
>>> from vrampool.ahead import Plan, plan_step
>>> MIB = 1 << 20
>>> # One step at its largest shape: (stream, size, lower, upper) per buffer, in allocation order.
>>> plan = plan_step([(0, 8 * MIB, 0, 3), (0, 4 * MIB, 1, 2), (0, 8 * MIB, 2, 4)])
>>> plan.arena_bytes // MIB, plan.lower_bound_bytes // MIB
(16, 16)
>>> path = os.path.join(tempfile.mkdtemp(), "plan.json")
>>> plan.save(path)
>>> Plan.load(path) == plan
True
>>> pool = vrampool.DevicePool("sim", capacity=1 << 30, plan=path)
>>> a = pool.allocate(6 * MIB)                 # a smaller step: each buffer at its planned offset
>>> b = pool.allocate(3 * MIB)
>>> b.free()
>>> c = pool.allocate(5 * MIB)
>>> a.free(); c.free()                         # everything freed: the step ends
>>> s = pool.steady_stats()
>>> s["planned_allocations"], s["fallbacks"], s["arena_bytes"] // MIB
(3, 0, 16)

The file is JSON, a buffer a line::

    {
     "format": "vrampool-plan-ahead",
     "version": 2,
     "sha256": "<hex>",
     "plan": {
      "alignment": 512, "arena_bytes": ..., "lower_bound_bytes": ..., "source": "g.jsonl", "step": 1,
      "first": 0,
      "buffers": [
       [stream, size, lower, upper, offset],
       ...
      ]
     }
    }

``sha256`` is of the ``plan`` object written canonically (keys sorted, no spaces:
``json.dumps(plan, sort_keys=True, separators=(",", ":"))``). :meth:`Plan.load` refuses, with a
``ValueError`` that says why, a file that is not JSON or is cut short, another format or version,
a checksum that does not match, and a plan that the planner's validator refuses (misaligned
offsets, two buffers live at once sharing a byte) or whose figures are not its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple, Union

from vrampool._native import ALIGNMENT, check_ahead, plan_ahead
from vrampool.inputs import quote, read_text
from vrampool.streams import as_int

__all__ = ["ALIGNMENT", "BUDGET_MS", "FORMAT", "VERSION", "Plan", "StepRow", "as_plan", "plan_step"]

#: One buffer of a step: (stream, size, lower, upper), live on ``[lower, upper)``.
StepRow = Tuple[int, int, int, int]
#: The planner's search time per stream beyond its heuristics.
BUDGET_MS = 100
#: The file's ``format`` and ``version`` (version 1, without ``first``, is read too).
FORMAT = "vrampool-plan-ahead"
VERSION = 2
_READS = (1, 2)
#: The largest alignment a pool takes (1 GiB).
_MAX_ALIGNMENT = 1 << 30


def _natural(value: Any, what: str, low: int = 0) -> int:
    """``value`` (any integer type but a bool) as an int in ``[low, 2**64)``; a ``TypeError`` or
    ``ValueError`` naming ``what``."""
    number = as_int(value)
    if number is None:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not low <= number < 1 << 64:
        raise ValueError(f"{what} must be an int in [{low}, 2**64), got {number}")
    return number


def _step_rows(rows: Iterable[Sequence[int]]) -> Tuple[StepRow, ...]:
    """Rows checked for types and ranges (the planner checks the rest and says which buffer)."""
    if isinstance(rows, (str, bytes, Path)):
        raise TypeError("rows are (stream, size, lower, upper) tuples, not a file name: Plan.load reads a plan file")
    checked = []
    for i, row in enumerate(rows):
        if not isinstance(row, (tuple, list)) or len(row) != 4:
            raise ValueError(f"row {i}: a step's buffer is (stream, size, lower, upper), got {quote(row)}")
        stream, size, lower, upper = (_natural(v, f"row {i}: {name}") for v, name in zip(row, ("stream", "size", "lower", "upper")))
        if size == 0:
            raise ValueError(f"row {i}: size must be at least 1 byte")
        if upper <= lower:
            raise ValueError(f"row {i}: upper ({upper}) must exceed lower ({lower})")
        checked.append((stream, size, lower, upper))
    return tuple(checked)


def _alignment(value: Any) -> int:
    alignment = _natural(value, "alignment", 1)
    if alignment & (alignment - 1) or not ALIGNMENT <= alignment <= _MAX_ALIGNMENT:
        raise ValueError(f"alignment must be a power of two from {ALIGNMENT} B to 1 GiB (as a pool's is), got {alignment}")
    return alignment


@dataclasses.dataclass(frozen=True)
class Plan:
    """One step planned ahead: ``offsets[i]`` is where the step's i-th allocation (``rows[i]``:
    stream, size, lower, upper) lies in its stream's region, each a multiple of ``alignment``.

    Made, the plan is checked by the planner's validator (no two buffers of a stream live at once
    share a byte; every offset aligned), which also gives ``arena_bytes`` (every region together)
    and ``lower_bound_bytes`` (the most bytes live at once, per stream, summed): a ``ValueError``
    says why a plan is refused. ``source`` and ``step`` say where the step came from (a trace's
    file and its step's index, ``"rows"``, ``"capture of fn"``).

    ``first`` rows (0: none) serve the first step alone and the rest every step after it: a
    run's first step also makes what lives across steps (the weights, the optimizer's state),
    and planned beside the largest step on one timeline, those live in the arena too, at bytes
    no later step's buffer takes. A pool set with such a plan before the run's first allocation
    makes no device call for them.

    Streams are the handles the pool is called with; a trace's and a capture's are its own
    numbers (0: the default stream, where a capture puts everything).
    """

    rows: Tuple[StepRow, ...]
    offsets: Tuple[int, ...]
    alignment: int = ALIGNMENT
    source: str = "rows"
    step: Optional[int] = None
    first: int = 0
    arena_bytes: int = dataclasses.field(init=False)
    lower_bound_bytes: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        rows = _step_rows(self.rows)
        offsets = tuple(_natural(v, f"offset {i}") for i, v in enumerate(self.offsets))
        alignment = _alignment(self.alignment)
        if not isinstance(self.source, str):
            raise TypeError(f"source must be a str, not {type(self.source).__name__}")
        if self.step is not None:
            _natural(self.step, "step")
        if not rows:
            raise ValueError("a plan needs at least one buffer")
        first = _natural(self.first, "first")
        arena, bound = check_ahead(list(rows), list(offsets), alignment, first)
        for name, value in (("rows", rows), ("offsets", offsets), ("first", first), ("arena_bytes", arena), ("lower_bound_bytes", bound)):
            object.__setattr__(self, name, value)

    def without_first_step(self) -> "Plan":
        """The plan of the steps after the first alone, at the same offsets (the first step's
        bytes left unused): for a run whose weights exist before the plan is set."""
        if not self.first:
            return self
        return Plan(self.rows[self.first :], self.offsets[self.first :], self.alignment, self.source, self.step)

    def to_dict(self) -> Dict[str, Any]:
        """The ``plan`` object of the file (see the module's docstring)."""
        return {
            "alignment": self.alignment,
            "arena_bytes": self.arena_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "source": self.source,
            "step": self.step,
            "first": self.first,
            "buffers": [[*row, offset] for row, offset in zip(self.rows, self.offsets)],
        }

    def save(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the plan to ``path`` (JSON, see the module's docstring), a buffer a line."""
        payload = self.to_dict()
        head = {"format": FORMAT, "version": VERSION, "sha256": _checksum(payload)}
        fields = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in head.items()]
        plan = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in payload.items() if k != "buffers"]
        buffers = ",\n".join(f"   {json.dumps(b)}" for b in payload["buffers"])
        plan.append(f'  "buffers": [\n{buffers}\n  ]')
        Path(path).write_text("{\n" + ",\n".join([*fields, ' "plan": {\n' + ",\n".join(plan) + "\n }"]) + "\n}\n")

    @classmethod
    def load(cls, path: Union[str, "os.PathLike[str]"]) -> "Plan":
        """The plan saved at ``path``. Raises ``ValueError`` (naming the file) for anything but an
        intact plan file of this version whose plan the validator accepts, ``OSError`` where the
        file cannot be read."""
        try:
            return cls._from_document(json.loads(read_text(path)))
        except (ValueError, TypeError, RecursionError) as e:
            why = "not JSON, or cut short" if isinstance(e, json.JSONDecodeError) else "nested too deeply" if isinstance(e, RecursionError) else e
            raise ValueError(f"{path}: not a usable vrampool plan: {why}") from None

    @classmethod
    def _from_document(cls, document: Any) -> "Plan":
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            found = document.get("format") if isinstance(document, dict) else None
            raise ValueError(f"the file's format is {quote(found)}, not {FORMAT!r}")
        version = document.get("version")
        if version not in _READS or isinstance(version, bool):
            raise ValueError(f"version {quote(version)}; this vrampool reads versions {_READS[0]} to {VERSION}")
        payload = document.get("plan")
        if not isinstance(payload, dict):
            raise ValueError("no plan object")
        if document.get("sha256") != _checksum(payload):
            raise ValueError("its checksum does not match: the file was changed or damaged")
        buffers = payload.get("buffers")
        if not isinstance(buffers, list) or not all(isinstance(b, list) and len(b) == 5 for b in buffers):
            raise ValueError("buffers must be a list of [stream, size, lower, upper, offset]")
        plan = cls(
            rows=tuple(tuple(b[:4]) for b in buffers),  # type: ignore[misc]
            offsets=tuple(b[4] for b in buffers),
            alignment=payload.get("alignment"),  # type: ignore[arg-type]
            source=payload.get("source"),  # type: ignore[arg-type]
            step=payload.get("step"),
            first=payload.get("first", 0) if version == 1 else payload.get("first"),  # type: ignore[arg-type]
        )
        for name in ("arena_bytes", "lower_bound_bytes"):
            if payload.get(name) != getattr(plan, name):
                raise ValueError(f"it says {name} is {quote(payload.get(name))}, the plan needs {getattr(plan, name)}")
        return plan


def _checksum(payload: Dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def as_plan(plan: Union[Plan, str, "os.PathLike[str]"]) -> Plan:
    """``plan`` itself, or the plan saved at a path (:meth:`Plan.load`)."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        return Plan.load(os.fspath(plan))
    raise TypeError(f"plan must be a vrampool.ahead.Plan or the path of a saved one, not {type(plan).__name__}")


def plan_step(
    rows: Iterable[Sequence[int]],
    alignment: int = ALIGNMENT,
    budget_ms: int = BUDGET_MS,
    *,
    source: str = "rows",
    step: Optional[int] = None,
    first: int = 0,
) -> Plan:
    """Plans one step: ``rows`` are its buffers ``(stream, size, lower, upper)`` in the order of
    their allocations, live on ``[lower, upper)`` in any unit of time; a region per stream, each
    searched for at most ``budget_ms`` beyond the planner's heuristics. With ``first``, the first
    ``first`` rows are a run's first step and the rest its largest, on one timeline (see
    :class:`Plan`)."""
    checked = _step_rows(rows)
    if not checked:
        raise ValueError("the step has no buffers to plan")
    budget = _natural(budget_ms, "budget_ms")
    offsets = plan_ahead(list(checked), _alignment(alignment), budget)
    return Plan(checked, tuple(offsets), alignment, source, step, first)
