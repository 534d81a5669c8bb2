"""Allocation traces: the trace model (:class:`Trace`, a list of :class:`Event`) and the readers
of trace files. :mod:`vrampool.whatif.capture` records traces of PyTorch code.

The trace format is JSON lines, one event a line, in order (the line's index is its time)::

    {"op": "alloc", "id": 7, "size": 16384, "stream": 0}
    {"op": "free", "id": 7}
    {"op": "step"}                 # an iteration boundary (optional)

``Trace.rows()`` turns the events into the planner's and replay's ``id,lower,upper,size,stream``
rows (a buffer never freed lives to the end of the trace).

Converters build the same ``Trace`` from a PyTorch GPU memory snapshot
(``torch.cuda.memory._snapshot()``, or its pickle: :func:`from_snapshot`) and from vrampool's own
event log (:func:`from_event_log`); :func:`read` takes any of JSON lines, the CSV and a snapshot
pickle, and :func:`load` a file, a ``Trace`` or rows. The profiler's memory events convert
through the snapshot torch builds from them:
``from_snapshot(torch.cuda._memory_viz._profile_to_snapshot(prof))`` (a private torch function)
for a ``torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)``.

>>> from vrampool.whatif.traces import Trace
>>> trace = Trace.from_rows([(7, 0, 2, 1024), (8, 1, 3, 512)])   # (id, lower, upper, size)
>>> [(e.op, e.id) for e in trace.events]
[('alloc', 7), ('alloc', 8), ('free', 7), ('free', 8)]
>>> trace.peak_allocated_bytes(), trace.rows()
(1536, [(7, 0, 2, 1024, 0), (8, 1, 3, 512, 0)])
"""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from vrampool._native import read_trace_csv
from vrampool.inputs import quote, read_text

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
    """The events of one run, in order. ``reserved`` holds, for a trace converted from a
    PyTorch snapshot or a vrampool event log, what that allocator held from the device:
    ``(time, bytes)`` after each change, times being indices into ``events``."""

    events: List[Event] = dataclasses.field(default_factory=list)
    reserved: List[Tuple[int, int]] = dataclasses.field(default_factory=list)
    #: Which allocator recorded it: ``"pytorch"`` (a snapshot), ``"vrampool"`` (an event log), or None.
    recorded_by: Optional[str] = None
    #: The snapshot's allocator mapped expandable segments (``expandable_segments:True``).
    recorded_expandable: bool = False

    def peak_reserved_bytes(self) -> Optional[int]:
        """The most the recording allocator reserved, or None when the trace doesn't say."""
        return max(b for _, b in self.reserved) if self.reserved else None

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
                    raise ValueError(f"op must be one of {OPS}, got {quote(op)}")
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
            except RecursionError:
                raise ValueError(f"line {number}: JSON nested too deeply") from None
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
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise ValueError(f"{key} must be an integer in [0, 2**64), got {quote(value)}")
    return value


def read(path: Union[str, Path]) -> Trace:
    """A trace from a file: a PyTorch memory snapshot pickle (``.pickle``/``.pkl``, or pickled
    content), the ``id,lower,upper,size[,stream]`` CSV (``.csv``, or a first line that is not
    JSON), or JSON lines. Raises ``ValueError`` naming the line or field of bad input."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(1)
    if path.suffix in (".pickle", ".pkl") or head == b"\x80":  # protocol 2+ opens with PROTO
        return from_snapshot(load_snapshot(path.read_bytes()))
    text = read_text(path)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if path.suffix == ".csv" or (first and not first.startswith("{")):
        return Trace.from_rows(read_trace_csv(text))
    return Trace.from_jsonl(text)


class _PlainUnpickler(pickle.Unpickler):
    """Loads only plain containers and scalars: a snapshot needs no classes, and refusing them
    keeps a hostile pickle from running code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a memory snapshot holds only dicts, lists and scalars")


def load_snapshot(data: Union[bytes, str, Path]) -> Dict[str, Any]:
    """A ``torch.cuda.memory._snapshot()`` dict from its pickle (bytes or a path)."""
    if not isinstance(data, bytes):
        data = Path(data).read_bytes()
    try:
        snapshot = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # pickle raises many kinds on corrupt input
        raise ValueError(f"not a memory snapshot pickle: {e}") from None
    if not isinstance(snapshot, dict):
        raise ValueError(f"not a memory snapshot: the pickle holds a {type(snapshot).__name__}, not a dict")
    return snapshot


class _AddressTrace:
    """Builds a ``Trace`` from events keyed by address (as allocators log them): each allocation
    gets a fresh id, since addresses are reused; a free of an address allocated before the
    record began becomes an allocation at the start."""

    def __init__(self) -> None:
        self.events: List[Event] = []
        self.earlier: List[Event] = []  # allocations from before the record, put first
        self.live: Dict[int, Event] = {}  # address -> its allocation
        self.streams: Dict[int, int] = {}  # the log's stream handles -> 0, 1, 2, ...
        self.changes: List[Tuple[int, int]] = []  # (index into events, reserved delta)
        self.next_id = 0

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _stream(self, handle: int) -> int:
        return self.streams.setdefault(handle, len(self.streams))

    def alloc(self, addr: int, size: int, stream: int) -> None:
        if addr in self.live:
            raise ValueError(f"address {addr:#x} allocated again while live")
        event = Event("alloc", self._new_id(), size, self._stream(stream))
        self.live[addr] = event
        self.events.append(event)

    def free(self, addr: int, size: int, stream: int) -> None:
        event = self.live.pop(addr, None)
        if event is None:
            event = Event("alloc", self._new_id(), size, self._stream(stream))
            self.earlier.append(event)
        self.events.append(Event("free", event.id, event.size, event.stream))

    def reserve(self, delta: int) -> None:
        self.changes.append((len(self.events), delta))

    def apply(self, op: str, entry: Dict[str, Any]) -> None:
        """One event, its ``addr``, ``size`` and ``stream`` read from ``entry``: ``op`` is
        ``alloc``, ``free`` or a segment action of ``_SEGMENT_GROWTH``."""
        addr, size, stream = _natural(entry, "addr"), _natural(entry, "size"), _natural(entry, "stream", 0)
        if op == "alloc":
            if size == 0:
                raise ValueError("size must be at least 1 byte")
            self.alloc(addr, size, stream)
        elif op == "free":
            self.free(addr, size, stream)
        else:
            self.reserve(_SEGMENT_GROWTH[op] * size)

    def finish(self, still_live: Iterable[Tuple[int, int, int]] = (), reserved_at_end: Optional[int] = None) -> Trace:
        """The trace; ``still_live`` are ``(addr, size, stream)`` blocks live at the end (those
        never seen allocated are added at the start), ``reserved_at_end`` what the allocator
        held then (else reserved starts where it never goes below 0)."""
        for addr, size, stream in still_live:
            if addr not in self.live:
                self.earlier.append(Event("alloc", self._new_id(), size, self._stream(stream)))
        shift = len(self.earlier)
        reserved: List[Tuple[int, int]] = []
        if self.changes:
            running, lowest = 0, 0
            for _, delta in self.changes:
                running += delta
                lowest = min(lowest, running)
            level = reserved_at_end - running if reserved_at_end is not None else -lowest
            reserved.append((0, level))
            for index, delta in self.changes:
                level += delta
                reserved.append((index + shift, level))
        return Trace(self.earlier + self.events, reserved)


def _check_reserved_covers_allocated(trace: Trace, before_record: int) -> None:
    """Raises ``ValueError`` where the recorded reserved bytes fall below the bytes that the
    record itself shows live: no allocator holds blocks in memory it has not reserved, so such a
    record contradicts itself (a segment freed while its blocks live, or segments that never
    were). The first ``before_record`` events, allocations from before the record whose time is
    unknown, are left out."""
    if not trace.reserved:
        return
    earlier = {e.id for e in trace.events[:before_record]}
    changes = iter(trace.reserved)
    _, level = next(changes)
    upcoming = next(changes, None)
    live = 0
    for index in range(len(trace.events) + 1):
        while upcoming is not None and upcoming[0] <= index:
            _, level = upcoming
            upcoming = next(changes, None)
        if level < live:
            raise ValueError(f"inconsistent record: at event {index}, {live:,} bytes are live but only {level:,} reserved")
        if before_record <= index < len(trace.events) and trace.events[index].id not in earlier:
            e = trace.events[index]
            live += e.size if e.op == "alloc" else -e.size if e.op == "free" else 0


#: Snapshot actions that move a block or a segment; the rest (snapshot, oom, user_defined,
#: free_requested: the block stays taken until free_completed) carry nothing to replay.
_SEGMENT_GROWTH = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


def from_snapshot(snapshot: Union[Dict[str, Any], str, Path], device: Optional[int] = None) -> Trace:
    """The trace of a PyTorch GPU memory snapshot (``torch.cuda.memory._snapshot()``, or a path
    to its pickle) on ``device`` (default: the device with the most trace entries).

    Blocks are allocated at ``alloc`` and freed at ``free_completed``; blocks freed but
    allocated before the record began, and active blocks of ``segments`` never seen allocated,
    are allocated at the start. ``Trace.reserved`` follows ``segment_alloc``/``segment_free``
    (and ``segment_map``/``segment_unmap``), ending at the snapshot's segments' total.
    Raises ``ValueError`` naming the entry of bad input.
    """
    if not isinstance(snapshot, dict):
        snapshot = load_snapshot(snapshot)
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise ValueError("not a memory snapshot: `device_traces` must be a list of lists (record with torch.cuda.memory._record_memory_history())")
    if device is None:
        device = max(range(len(traces)), key=lambda d: len(traces[d]), default=0)
    if not 0 <= device < len(traces) or not traces[device]:
        raise ValueError(f"the snapshot has no trace entries for device {device}")
    builder = _AddressTrace()
    for index, entry in enumerate(traces[device]):
        where = f"device_traces[{device}][{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a dict, got {type(entry).__name__}")
        action = entry.get("action")
        if not isinstance(action, str):
            raise ValueError(f"{where}: `action` must be a string, got {quote(action)}")
        if action not in ("alloc", "free_completed") and action not in _SEGMENT_GROWTH:
            continue
        try:
            builder.apply("free" if action == "free_completed" else action, entry)
        except ValueError as e:
            raise ValueError(f"{where} ({action}): {e}") from None
    live, total = _snapshot_segments(snapshot.get("segments"), device)
    trace = builder.finish(live, total)
    _check_reserved_covers_allocated(trace, len(builder.earlier))  # `finish` put these first
    trace.recorded_by = "pytorch"
    segments = snapshot.get("segments") or []
    trace.recorded_expandable = any(isinstance(e, dict) and e.get("action") in ("segment_map", "segment_unmap") for e in traces[device]) or any(
        isinstance(seg, dict) and seg.get("is_expandable") for seg in segments
    )
    return trace


def _snapshot_segments(segments: Any, device: int) -> Tuple[List[Tuple[int, int, int]], Optional[int]]:
    """Active ``(addr, size, stream)`` blocks and the reserved total of ``device``'s segments.
    Blocks lie back to back from the segment's ``address``: GPU snapshots give each block its
    ``address`` too, but those torch builds from a memory profile give only sizes."""
    if segments is None:
        return [], None
    if not isinstance(segments, list):
        raise ValueError(f"`segments` must be a list, got {type(segments).__name__}")
    live, total = [], 0
    for index, seg in enumerate(segments):
        if not isinstance(seg, dict):
            raise ValueError(f"segments[{index}]: expected a dict, got {type(seg).__name__}")
        if seg.get("device", device) != device:
            continue
        try:
            total += _natural(seg, "total_size")
            stream, addr = _natural(seg, "stream", 0), _natural(seg, "address", 0)
            for number, block in enumerate(seg.get("blocks", [])):
                if not isinstance(block, dict):
                    raise ValueError(f"blocks[{number}]: expected a dict, got {type(block).__name__}")
                try:
                    addr, size = _natural(block, "address", addr), _natural(block, "size")
                except ValueError as e:
                    raise ValueError(f"blocks[{number}]: {e}") from None
                if str(block.get("state", "")).startswith("active"):
                    live.append((addr, size, stream))
                addr += size
        except ValueError as e:
            raise ValueError(f"segments[{index}]: {e}") from None
    return live, total


#: The event kinds of vrampool's event log (``record_events``), as the Python layer names them.
EVENT_LOG_KINDS = ("alloc", "free", "segment_alloc", "segment_free")


def from_event_log(events: Iterable[Union[Sequence[Any], Dict[str, Any]]]) -> Trace:
    """The trace of a vrampool pool's event log (a pool made with ``record_events``): each
    event a dict with ``kind``, ``addr``, ``size`` and ``stream`` or a ``(time_ns, kind, addr,
    size, stream)`` tuple, ``kind`` one of :data:`EVENT_LOG_KINDS`. ``Trace.reserved`` follows
    the segment events. Raises ``ValueError`` naming the event of bad input."""
    builder = _AddressTrace()
    for index, raw in enumerate(events):
        try:
            if isinstance(raw, dict):
                entry = raw
            elif isinstance(raw, (tuple, list)) and len(raw) == 5:
                entry = dict(zip(("time_ns", "kind", "addr", "size", "stream"), raw))
            else:
                raise ValueError(f"expected a dict or a (time_ns, kind, addr, size, stream) tuple, got {quote(raw)}")
            kind = entry.get("kind")
            if kind not in EVENT_LOG_KINDS:
                raise ValueError(f"kind must be one of {EVENT_LOG_KINDS}, got {quote(kind)}")
            builder.apply(kind, entry)
        except ValueError as e:
            raise ValueError(f"event {index}: {e}") from None
    trace = builder.finish()
    trace.recorded_by = "vrampool"
    return trace


#: What the readers take: a trace file (any format :func:`read` reads), a ``Trace``, or
#: ``(id, lower, upper, size[, stream])`` rows.
TraceLike = Union[str, Path, Trace, Iterable[Sequence[int]]]


def load(trace: TraceLike) -> Trace:
    """A ``Trace`` from a file, a ``Trace`` or rows."""
    if isinstance(trace, Trace):
        return trace
    if isinstance(trace, (str, Path)):
        return read(trace)
    return Trace.from_rows(_rows(trace))


def _rows(trace: Iterable[Sequence[int]]) -> List[TraceRow]:
    rows = []
    for number, row in enumerate(trace):
        row = tuple(int(v) for v in row)
        if len(row) == 4:
            row = row + (0,)
        elif len(row) != 5:
            raise ValueError(f"row {number}: expected (id, lower, upper, size[, stream]), got {len(row)} values")
        if min(row) < 0:
            raise ValueError(f"row {number}: negative value in {row}")
        if max(row) >= 1 << 64:
            raise ValueError(f"row {number}: value above 2**64 - 1 in {row}")
        if row[2] <= row[1]:
            raise ValueError(f"row {number}: upper ({row[2]}) must exceed lower ({row[1]})")
        rows.append(row)
    return rows


def read_trace(path: Union[str, Path]) -> List[TraceRow]:
    """The buffers of a trace file (any format :func:`read` takes), as ``(id, lower, upper, size,
    stream)`` rows (a CSV's as written; other formats' times are event indices). Raises
    ``ValueError`` naming the line of bad input."""
    if Path(path).suffix == ".csv":
        return read_trace_csv(read_text(path))
    return read(path).rows()
