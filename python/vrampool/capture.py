"""Allocation traces of real PyTorch workloads, captured on the CPU.

A ``TorchDispatchMode`` sees every op's outputs; each output whose storage is new (not one of
the op's inputs' storages: views and in-place ops allocate nothing) is an allocation, and a weak
reference to the storage reports its free when PyTorch drops it. So a training step on the CPU
gives the same sequence of allocation sizes and lifetimes that it would give on a GPU, without
one.

The trace format is JSON lines, one event a line, in order (the line's index is its time)::

    {"op": "alloc", "id": 7, "size": 16384, "stream": 0}
    {"op": "free", "id": 7}
    {"op": "step"}                 # an iteration boundary (optional)

``Trace.rows()`` turns the events into the planner's and replay's ``id,lower,upper,size,stream``
rows (a buffer never freed lives to the end of the trace).

>>> import torch
>>> from vrampool.capture import capture
>>> trace = capture(lambda: torch.ones(256) * 2)    # ones, then the product; both die
>>> [(e.op, e.size) for e in trace.events]
[('alloc', 1024), ('alloc', 1024), ('free', 1024), ('free', 1024)]
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

#: One buffer of a trace: (id, lower, upper, size, stream), live on [lower, upper).
TraceRow = Tuple[int, int, int, int, int]
OPS = ("alloc", "free", "step")


@dataclasses.dataclass(frozen=True)
class Event:
    """One allocation (``alloc``), its free (``free``, same id and size), or an iteration
    boundary (``step``, id and size 0)."""

    op: str
    id: int = 0
    size: int = 0
    stream: int = 0


@dataclasses.dataclass
class Trace:
    """The events of one run, in order."""

    events: List[Event] = dataclasses.field(default_factory=list)

    def rows(self) -> List[TraceRow]:
        """``(id, lower, upper, size, stream)`` per buffer; times are event indices, and a
        buffer never freed lives until the end of the trace."""
        born: Dict[int, Tuple[int, Event]] = {}
        rows: List[TraceRow] = []
        for time, e in enumerate(self.events):
            if e.op == "alloc":
                born[e.id] = (time, e)
            elif e.op == "free" and e.id in born:
                lower, a = born.pop(e.id)
                rows.append((a.id, lower, time, a.size, a.stream))
        end = len(self.events)
        rows.extend((a.id, lower, end, a.size, a.stream) for lower, a in born.values())
        rows.sort(key=lambda r: (r[1], r[0]))
        return rows

    def steps(self) -> List["Trace"]:
        """The trace cut at its ``step`` events (those stay out of the pieces)."""
        pieces, current = [], []
        for e in self.events:
            if e.op == "step":
                pieces.append(Trace(current))
                current = []
            else:
                current.append(e)
        pieces.append(Trace(current))
        return [p for p in pieces if p.events]

    def peak_allocated_bytes(self) -> int:
        """The most bytes live at once: the lower bound of any allocator's peak."""
        live = peak = 0
        for e in self.events:
            live += e.size if e.op == "alloc" else -e.size if e.op == "free" else 0
            peak = max(peak, live)
        return peak

    def to_jsonl(self) -> str:
        """The trace in the JSON-lines format of this module's docstring."""
        lines = []
        for e in self.events:
            if e.op == "step":
                lines.append('{"op": "step"}')
            elif e.op == "free":
                lines.append(json.dumps({"op": "free", "id": e.id}))
            else:
                lines.append(json.dumps({"op": "alloc", "id": e.id, "size": e.size, "stream": e.stream}))
        return "\n".join(lines) + "\n"

    def write(self, path: Union[str, Path]) -> None:
        """Writes JSON lines, or the ``id,lower,upper,size,stream`` CSV if the name ends ``.csv``."""
        path = Path(path)
        if path.suffix == ".csv":
            body = "".join(f"{i},{lo},{up},{size},{stream}\n" for i, lo, up, size, stream in self.rows())
            path.write_text("id,lower,upper,size,stream\n" + body)
        else:
            path.write_text(self.to_jsonl())

    @classmethod
    def from_jsonl(cls, text: str) -> "Trace":
        """Parses JSON lines; raises ``ValueError`` naming the line of bad input (unknown op,
        missing or negative id/size, a free of an id that is not live, an id allocated twice)."""
        events: List[Event] = []
        sizes: Dict[int, Tuple[int, int]] = {}
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError("not a JSON object")
                op = obj.get("op")
                if op not in OPS:
                    raise ValueError(f"op must be one of {OPS}, got {op!r}")
                if op == "step":
                    events.append(Event("step"))
                    continue
                ident = _natural(obj, "id")
                if op == "alloc":
                    size, stream = _natural(obj, "size"), _natural(obj, "stream", 0)
                    if ident in sizes:
                        raise ValueError(f"id {ident} allocated again while live")
                    sizes[ident] = (size, stream)
                    events.append(Event("alloc", ident, size, stream))
                else:
                    if ident not in sizes:
                        raise ValueError(f"free of id {ident}, which is not live")
                    size, stream = sizes.pop(ident)
                    events.append(Event("free", ident, size, stream))
            except (json.JSONDecodeError, ValueError, TypeError) as e:
                raise ValueError(f"line {number}: {e}") from None
        return cls(events)

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[int]]) -> "Trace":
        """Events from ``(id, lower, upper, size[, stream])`` rows: at each time frees come
        before allocations, ties broken by id (as replay orders them)."""
        timed = []
        for row in rows:
            ident, lower, upper, size = (int(v) for v in row[:4])
            stream = int(row[4]) if len(row) > 4 else 0
            timed.append((lower, 1, ident, Event("alloc", ident, size, stream)))
            timed.append((upper, 0, ident, Event("free", ident, size, stream)))
        timed.sort(key=lambda t: t[:3])
        return cls([t[3] for t in timed])


def _natural(obj: Dict[str, Any], key: str, default: Optional[int] = None) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer, got {value!r}")
    return value


def read(path: Union[str, Path]) -> Trace:
    """A trace from a file: JSON lines, or the ``id,lower,upper,size[,stream]`` CSV (``.csv``)."""
    path = Path(path)
    if path.suffix == ".csv":
        from vrampool.trace import read_trace

        return Trace.from_rows(read_trace(path))
    return Trace.from_jsonl(path.read_text())


def _storage_tracker_class() -> type:
    """Built on first use so that importing this module doesn't import torch."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class StorageTracker(TorchDispatchMode):
        """Reports every new storage an op creates to ``on_alloc(id, size)`` and its death to
        ``on_free(id, size)``."""

        def __init__(self, on_alloc: Callable[[int, int], None], on_free: Callable[[int, int], None]) -> None:
            super().__init__()
            self._on_alloc, self._on_free = on_alloc, on_free
            self._live: Dict[int, Any] = {}  # storage address (_cdata) -> weak reference
            self._next_id = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if _real(t, torch)}
            for t in tree_flatten(out)[0]:
                if _real(t, torch):
                    storage = t.untyped_storage()
                    key = storage._cdata
                    if key not in inputs and key not in self._live and storage.nbytes() > 0:
                        self._track(storage, key)
            return out

        def _track(self, storage: Any, key: int) -> None:
            self._next_id += 1
            ident, size = self._next_id, storage.nbytes()

            def died(_ref: Any) -> None:
                if self._live.pop(key, None) is not None:
                    self._on_free(ident, size)

            self._live[key] = weakref.ref(storage, died)
            self._on_alloc(ident, size)

    return StorageTracker


def _real(t: Any, torch: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type != "meta"


def storage_tracker(on_alloc: Callable[[int, int], None], on_free: Callable[[int, int], None]) -> Any:
    """A ``TorchDispatchMode`` (use it in a ``with``) that calls ``on_alloc(id, size)`` for each
    storage created inside it and ``on_free(id, size)`` when that storage dies."""
    return _storage_tracker_class()(on_alloc, on_free)


class Recorder:
    """Collects a ``Trace`` from a ``storage_tracker``; ``step()`` marks iteration boundaries."""

    def __init__(self) -> None:
        self.trace = Trace()

    def on_alloc(self, ident: int, size: int) -> None:
        self.trace.events.append(Event("alloc", ident, size))

    def on_free(self, ident: int, size: int) -> None:
        self.trace.events.append(Event("free", ident, size))

    def step(self) -> None:
        self.trace.events.append(Event("step"))

    def tracker(self) -> Any:
        return storage_tracker(self.on_alloc, self.on_free)


def capture(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Trace:
    """Runs ``fn(*args, **kwargs)`` and returns the allocations it made (its result is dropped
    before the capture ends, so what it returned is freed in the trace too)."""
    recorder = Recorder()
    with recorder.tracker():
        fn(*args, **kwargs)
    return recorder.trace


def training_steps(
    model: Any,
    batches: Iterable[Tuple[Any, Any]],
    loss_fn: Callable[[Any, Any], Any],
    optimizer: Any,
) -> Iterator[None]:
    """Runs one training step (forward, loss, backward, optimizer step, zero_grad) per
    ``(input, target)`` batch, yielding after each: the loop that ``capture_training`` and the
    planned arena's tests drive under a ``storage_tracker``."""
    for inputs, target in batches:
        loss = loss_fn(model(inputs), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
        yield


def capture_training(
    model: Any,
    batches: Iterable[Tuple[Any, Any]],
    loss_fn: Optional[Callable[[Any, Any], Any]] = None,
    optimizer: Any = None,
) -> Trace:
    """The trace of training ``model`` on the CPU over ``batches`` (pairs of input and target),
    with a ``step`` event after each iteration. ``loss_fn`` defaults to cross-entropy and
    ``optimizer`` to Adam (whose state is allocated in the first step, as on a GPU)."""
    import torch

    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=1e-3)
    recorder = Recorder()
    with recorder.tracker():
        for _ in training_steps(model, batches, loss_fn, optimizer):
            recorder.step()
    return recorder.trace
