"""`DevicePool`: raw device buffers from a vrampool pool."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Union

from vrampool._native import InvalidFreeError, NativeBuffer, NativePool, PoolClosedError, WrongDeviceError, conf_pairs, parse_size
from vrampool.options import POOL_KEYS, conf_text, pool_pairs
from vrampool.planned import PlannedPool
from vrampool.streams import as_int, stream_handle
from vrampool.summary import format_summary
from vrampool.tags import PauseReport, TagInfo, tag_infos

if TYPE_CHECKING:
    from vrampool.ahead import Plan
    from vrampool.ipc import BufferDescriptor, PoolHandle

#: A block of device memory (the native class itself: its methods run in Rust, and a Python
#: subclass would need the native allocate to build it).
#:
#: ``ptr``, ``size`` (the bytes asked for), ``device``, ``stream`` (the raw handle), ``freed``;
#: ``close()`` / ``free(stream=None)`` and ``with pool.allocate(n) as buf:`` free it, and so does
#: collection: exactly once whichever comes first. ``__cuda_array_interface__`` (v3, with the
#: stream) and ``__dlpack__`` / ``__dlpack_device__`` give a 1-D uint8 view without a copy; a
#: DLPack consumer keeps the memory alive (a free asked for meanwhile waits for it). DLPack
#: names CUDA memory kDLCUDA; the simulated device's memory is host memory, so it is kDLCPU
#: there and numpy takes it zero-copy (the address-only simulation exports nothing).
#:
#: >>> pool = DevicePool("sim", capacity=1 << 30)
#: >>> with pool.allocate(16) as buf:
#: ...     buf.__cuda_array_interface__["shape"]
#: (16,)
#: >>> buf.freed
#: True
DeviceBuffer = NativeBuffer

_DEFAULT_SIM_CAPACITY = 16 << 30


def _check_size(name: str, value: Any) -> int:
    number = as_int(value)
    if number is None:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    value = number
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    if value >= 1 << 64:
        raise ValueError(f"{name} of {value} bytes is larger than any device")
    return value


class DevicePool:
    """A pool of device memory: small blocks from slabs, the middle best-fit, large blocks buddy.

    ``device`` is a CUDA device ordinal, or ``"sim"`` for the simulated device (host memory when
    ``host_backed``, so tests can write through the pointers; ``ordinal`` models several GPUs).
    Thread-safe; a call holds the GIL (it takes a microsecond or so). Streams may be given as anything
    :func:`vrampool.streams.stream_handle` takes (an int handle, a ``CUstream``, an object with
    ``__cuda_stream__``, a ``torch.cuda.Stream``).

    ``scrub`` zero-fills memory so that one user's data never reaches the next (shared GPUs):
    ``"on_free"`` fills each block when it is freed (before any reuse), ``"on_alloc"`` just
    before it is handed out; ``"off"`` (the default) fills nothing. ``track_leaks`` records when
    (and from which Python stack, for blocks from :meth:`allocate`) each live block was
    allocated, for :meth:`leak_report`; off by default, so allocation pays nothing for it.
    ``reclaim`` (on by default) empties the block caches before the pool grows and, when the
    growth would take it past the most it ever reserved, first gives the segments and expandable
    chunks that no block uses back to the device, so one tier's or one step's cached memory does
    not stay reserved beside another's growth;
    ``reclaim=False`` keeps every cached segment, as PyTorch's caching allocator does, at the
    price of a higher peak. ``steady`` (on by default) serves a workload that repeats itself from
    one planned arena once each step has been seen (a step ends once nothing allocated is live,
    or at PyTorch's optimizer step under :func:`vrampool.torch.install`): after warm-up no device
    call and no sync. Its calls take one lock; ``steady=False`` leaves the pool's lock-free paths
    alone, for many threads that never repeat a step.
    ``ipc=True`` makes every segment shareable with other processes (:mod:`vrampool.ipc`:
    :meth:`ipc_handle`, :meth:`export`, and buffers that pickle for ``spawn`` children); it
    turns expandable segments off. ``ipc_handles`` picks the handles: ``"auto"`` (the default)
    shares by file descriptor where the device has virtual-memory management and by legacy IPC
    handle elsewhere; ``"legacy"`` always by legacy IPC handle (``cuIpcGetMemHandle`` of
    ``cuMemAlloc`` segments), which Numba's arrays need (:mod:`vrampool.numba`).

    ``plan`` (a :class:`vrampool.ahead.Plan`, or the path of a saved one) serves every step from
    a plan made ahead at the largest shape, from the first step on: see :meth:`set_plan`.

    ``conf`` takes pool options as ``VRAMPOOL_CONF`` writes them (``"ipc:true,limit:0.5"``),
    applied before the keywords. The options are ``VRAMPOOL_CONF``'s keys, read by the core as
    that text is (:mod:`vrampool.options`): sizes are bytes (an int, or a string such as ``"64KB"``); ``limit``
    is bytes (an int) or a fraction of the device's memory in (0, 1] (a float: ``1.0`` is the
    whole device, ``1`` one byte); None leaves an option at its default.

    >>> with DevicePool("sim", capacity=1 << 30, strategy="best_fit") as pool:
    ...     buf = pool.allocate(1 << 20)
    ...     pool.stats()["allocated_bytes.all.current"] >= 1 << 20
    True
    """

    def __init__(
        self,
        device: Union[int, str] = "sim",
        *,
        capacity: Optional[int] = None,
        strategy: Optional[str] = "hybrid",
        host_backed: bool = True,
        ordinal: Optional[int] = None,
        small_max: Optional[Union[int, str]] = None,
        large_min: Optional[Union[int, str]] = None,
        alignment: Optional[Union[int, str]] = None,
        round_up_divisions: Optional[int] = None,
        limit: Optional[Union[int, float, str]] = None,
        record_events: bool = False,
        expandable: Optional[bool] = None,
        reclaim: Optional[bool] = None,
        steady: Optional[bool] = None,
        scrub: Optional[str] = "off",
        track_leaks: bool = False,
        ipc: Optional[bool] = None,
        ipc_handles: Optional[str] = None,
        conf: str = "",
        plan: Optional[Union["Plan", str, os.PathLike]] = None,
    ) -> None:
        options = {
            "strategy": strategy,
            "small_max": small_max,
            "large_min": large_min,
            "alignment": alignment,
            "round_up_divisions": round_up_divisions,
            "limit": limit,
            "record_events": record_events,
            "expandable": expandable,
            "reclaim": reclaim,
            "steady": steady,
            "scrub": scrub,
            "track_leaks": track_leaks,
            "ipc": ipc,
            "ipc_handles": ipc_handles,
        }
        conf = ",".join(part for part in (conf, conf_text(options, POOL_KEYS)) if part)
        # ptr -> the Python stack that allocated it (track_leaks only). Entries of blocks freed
        # without `deallocate` (buffer.free(), collection) are dropped in batches.
        self._stacks: Optional[Dict[int, traceback.StackSummary]] = {} if track_leaks is True else None
        self._stacks_lock = threading.Lock()
        self._stacks_prune_at = 1024
        if device == "sim":
            cap = _DEFAULT_SIM_CAPACITY if capacity is None else _check_size("capacity", capacity)
            if ordinal is not None and (isinstance(ordinal, bool) or not isinstance(ordinal, int) or not 0 <= ordinal < 1 << 31):
                raise ValueError(f"ordinal must be a device ordinal >= 0, got {ordinal!r}")
            self._native = NativePool(cap, conf, host_backed, ordinal or 0)
        elif isinstance(device, int) and not isinstance(device, bool) and device >= 0:
            if capacity is not None:
                raise ValueError("capacity is for the simulated device; use limit= on a GPU")
            if ordinal is not None:
                raise ValueError("ordinal is for the simulated device; a GPU pool's device is its ordinal")
            self._native = NativePool.cuda(device, conf)
        else:
            raise ValueError(f"device must be 'sim' or a CUDA device ordinal >= 0, got {device!r}")
        self._conf = conf
        if plan is not None:
            self.set_plan(plan)

    def allocate(self, nbytes: int, stream: Any = None) -> DeviceBuffer:
        """A buffer of at least ``nbytes`` bytes for use on ``stream`` (None: the legacy default
        stream).

        >>> pool = DevicePool("sim", capacity=1 << 30)
        >>> buf = pool.allocate(4096, stream=7)
        >>> (buf.size, buf.stream, buf.ptr % 512)
        (4096, 7, 0)
        """
        buf = self._native.allocate(_check_size("nbytes", nbytes), stream_handle(stream))
        if self._stacks is not None:
            self._remember_stack(buf.ptr, traceback.extract_stack(sys._getframe(1)))
        return buf

    def _remember_stack(self, ptr: int, stack: traceback.StackSummary) -> None:
        stacks = self._stacks
        assert stacks is not None
        with self._stacks_lock:
            stacks[ptr] = stack
            if len(stacks) > self._stacks_prune_at:
                live = {block[0] for block in self._native.live_blocks()}
                for p in [p for p in stacks if p not in live]:
                    del stacks[p]
                self._stacks_prune_at = max(1024, 2 * len(stacks))

    def deallocate(self, buffer: DeviceBuffer, stream: Any = None) -> None:
        """Frees ``buffer``. ``stream``, when given, is the stream that used it last: its memory
        is then reused only after that stream's work. Freeing twice raises ``InvalidFreeError``,
        a buffer of another pool ``ValueError`` (``WrongDeviceError`` if on another device).

        >>> pool = DevicePool("sim", capacity=1 << 30)
        >>> buf = pool.allocate(100)
        >>> pool.deallocate(buf)
        >>> pool.deallocate(buf)
        Traceback (most recent call last):
        ...
        vrampool.InvalidFreeError: DeviceBuffer(ptr=..., size=100, device=0, stream=0) was already freed
        """
        self._check_live(buffer, "deallocate", "was already freed")
        buffer.free(None if stream is None else stream_handle(stream))
        if self._stacks is not None:
            with self._stacks_lock:
                self._stacks.pop(buffer.ptr, None)

    def _check_live(self, buffer: Any, call: str, freed: str) -> None:
        """Raises unless ``buffer`` is a live buffer of this open pool."""
        if not isinstance(buffer, NativeBuffer):
            raise TypeError(f"{call} takes a DeviceBuffer, not {type(buffer).__name__}")
        self._check_own(buffer)
        if self.closed:
            raise PoolClosedError("the pool is closed")
        if buffer.freed:
            raise InvalidFreeError(f"{buffer!r} {freed}")

    def record_stream(self, buffer: DeviceBuffer, stream: Any) -> None:
        """Marks ``buffer`` as used on ``stream`` too (``Tensor.record_stream``): once freed, its
        memory is not reused until ``stream`` has passed the free.

        >>> pool = DevicePool("sim", capacity=1 << 30)
        >>> buf = pool.allocate(100, stream=1)
        >>> pool.record_stream(buf, 2)
        """
        self._check_live(buffer, "record_stream", "was freed")
        self._native.record_stream(buffer.ptr, stream_handle(stream))

    def ipc_handle(self) -> "PoolHandle":
        """What names this pool to other processes (:class:`vrampool.ipc.ImportedPool`). Only
        a pool made with ``ipc=True`` has one."""
        from vrampool.ipc import pool_handle

        if self.closed:
            raise PoolClosedError("the pool is closed")
        if not self.ipc:
            raise ValueError("this pool was made without ipc=True: its memory cannot be shared with another process")
        return pool_handle(self._native)

    def export(self, buffer: DeviceBuffer) -> "BufferDescriptor":
        """A descriptor of ``buffer`` for another process (:mod:`vrampool.ipc`), which owns a
        file descriptor (``close()`` it once sent). Keep ``buffer`` allocated until every
        importer has closed it."""
        from vrampool.ipc import export_buffer

        self._check_live(buffer, "export", "was freed: a freed buffer cannot be shared")
        return export_buffer(buffer)

    @property
    def ipc(self) -> bool:
        """Whether the pool's memory may be shared with other processes (``ipc=True``)."""
        return self._native.ipc

    def stats(self) -> Dict[str, Union[int, float]]:
        """Counters under PyTorch's key names (``allocated_bytes.all.current``, ...).

        >>> pool = DevicePool("sim", capacity=1 << 30)
        >>> pool.stats()["allocation.all.current"]
        0
        """
        return self._native.stats()

    def reset_peak_stats(self) -> None:
        """Sets every peak to its current value (``torch.cuda.reset_peak_memory_stats``).

        >>> pool = DevicePool("sim", capacity=1 << 30)
        >>> pool.deallocate(pool.allocate(1 << 20))
        >>> pool.reset_peak_stats()
        >>> pool.stats()["allocated_bytes.all.peak"]
        0
        """
        self._native.reset_peak_stats()

    def snapshot(self) -> Dict[str, Any]:
        """Segments and their blocks in the format of ``torch.cuda.memory._snapshot()`` (as
        :func:`vrampool.torch.memory_snapshot` gives them, which ``torch.cuda._memory_viz``
        reads): ``segments``, each with ``address``, ``total_size``, ``allocated_size``,
        ``active_size``, ``requested_size``, ``stream``, ``segment_type``, ``segment_pool_id``,
        ``is_expandable``, vrampool's ``strategy`` (the tier) and ``vrampool_paused`` (a tag's segment
        whose memory :meth:`pause` gave back), and ``blocks`` covering it in address
        order (``address``, ``size``, ``requested_size``, ``state``: ``active_allocated``,
        ``active_pending_free`` or ``inactive``, and vrampool's ``cached``: an inactive block kept
        at its size in a cache rather than free); ``device_traces`` (empty: vrampool records no
        stack traces); ``allocator_settings``.

        >>> pool = DevicePool("sim", capacity=1 << 30)
        >>> buf = pool.allocate(1000)
        >>> [b["requested_size"] for s in pool.snapshot()["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
        [1000]
        """
        return self._native.snapshot()

    def memory_summary(self) -> str:
        """A readable table of the figures (like ``torch.cuda.memory_summary``): allocated,
        active, requested and reserved bytes (current, peak, totals), allocations and segments,
        free memory and fragmentation, OOMs and retries, and per strategy tier the segments and
        blocks of ``snapshot()``.

        >>> pool = DevicePool("sim", capacity=1 << 30)
        >>> buf = pool.allocate(1 << 20)
        >>> print(pool.memory_summary())  # doctest: +ELLIPSIS
        |====...
        | Allocated memory      |    1.00 MiB |    1.00 MiB |    1.00 MiB |         0 B |
        ...
        """
        title = f"vrampool memory summary: {self.strategy} pool on {self._device_name()}"
        return format_summary(self.stats(), self.snapshot()["segments"], title)

    def trim(self) -> int:
        """Gives every wholly free segment back to the device (``torch.cuda.empty_cache``);
        returns the bytes released.

        >>> pool = DevicePool("sim", capacity=1 << 30)
        >>> pool.deallocate(pool.allocate(1 << 20))
        >>> pool.trim() > 0, pool.stats()["reserved_bytes.all.current"]
        (True, 0)
        """
        return self._native.trim()

    empty_cache = trim

    @contextlib.contextmanager
    def region(self, tag: str) -> Iterator[None]:
        """Allocations made inside the ``with`` block belong to ``tag``, whose memory
        :meth:`pause` and :meth:`resume` give back and take again (as ``torch_memory_saver``'s
        ``region``). Regions nest; the rest of the pool's memory belongs to no tag. A tag's
        memory is best-fit over virtual-memory mappings whatever the pool's strategy; a device
        without virtual-memory management, or a pool made with ``ipc=True``, raises
        :class:`vrampool.PauseError`.

        >>> pool = DevicePool("sim", capacity=1 << 30)
        >>> with pool.region("kv"):
        ...     kv = pool.allocate(1 << 20)
        >>> pool.pause("kv").released
        2097152
        >>> pool.resume("kv")
        2097152
        """
        self._native.region_begin(tag)
        try:
            yield
        finally:
            self._native.region_end(tag)

    def pause(self, tag: Optional[str] = None, *, backup: bool = False) -> PauseReport:
        """Gives ``tag``'s physical memory back to the device (every tag's for None), keeping
        every address. Waits first for the streams that used it (each alone, no device-wide
        sync); with ``backup``, copies its live buffers to host memory for :meth:`resume` to
        write back. Meanwhile allocations in the tag raise :class:`vrampool.PausedError`, its
        buffers must not be touched, and frees of them are honoured (the memory comes back
        free); other tags and untagged memory work as usual. If the device refuses an unmap,
        the tag stays paused with what was given back, and pausing again finishes."""
        return PauseReport(*self._native.pause(tag, backup))

    def resume(self, tag: Optional[str] = None, *, cached: bool = True) -> int:
        """Maps memory again at ``tag``'s addresses (every tag's for None) and writes back the
        backup if the pause kept one; returns the bytes mapped. With ``cached=False``, memory
        that held no live buffer stays with the device until the tag needs it. If the device
        cannot give the memory (it is full), :class:`vrampool.PausedError`: nothing stays
        mapped, the tag stays paused, and a later resume can succeed."""
        return self._native.resume(tag, cached)

    def tags(self) -> List[TagInfo]:
        """Every tag, in the order its region was first opened."""
        return tag_infos(self._native.tags())

    def take_events(self) -> List[Tuple[int, str, int, int, int]]:
        """The allocations, frees and segment calls recorded since the last call, for a pool
        made with ``record_events=True``, as ``(time_ns, kind, addr, size, stream)`` tuples
        (``kind``: ``alloc``, ``free``, ``segment_alloc``, ``segment_free``);
        :func:`vrampool.whatif.traces.from_event_log` turns them into a trace."""
        return self._native.take_events()

    def leak_report(self) -> List[Dict[str, Any]]:
        """The blocks still live, by address: dicts with ``ptr``, ``size`` (the block's),
        ``requested``, ``stream``, ``age_s`` (seconds since allocation) and ``stack`` (the
        :class:`traceback.StackSummary` of the :meth:`allocate` call; ``"".join(stack.format())``
        prints it). ``age_s`` and ``stack`` are None unless the pool was made with
        ``track_leaks=True``.

        >>> pool = DevicePool("sim", capacity=1 << 30, track_leaks=True)
        >>> leak = pool.allocate(10)
        >>> [(b["requested"], b["age_s"] >= 0, b["stack"][-1].name) for b in pool.leak_report()]
        [(10, True, '<module>')]
        """
        return self._report(self._native.live_blocks())

    def close(self) -> List[Dict[str, Any]]:
        """Closes the pool; returns the blocks still live (leaks), as :meth:`leak_report` does.
        Later allocations and frees raise ``PoolClosedError`` (the figures stay readable), as does
        a close in a child of ``fork()``. Free memory the device refuses to take back is a
        ``DeviceError`` naming the bytes kept, the pool closed all the same; ``close()`` again
        tries to give them back (and returns ``[]``).

        >>> pool = DevicePool("sim", capacity=1 << 30)
        >>> leak = pool.allocate(10)
        >>> [b["requested"] for b in pool.close()]
        [10]
        """
        return self._report(self._native.close())

    def _report(self, blocks: List[Any]) -> List[Dict[str, Any]]:
        stacks = self._stacks if self._stacks is not None else {}
        with self._stacks_lock:
            return [
                {
                    "ptr": p,
                    "size": s,
                    "requested": r,
                    "stream": st,
                    "age_s": None if age is None else age / 1e9,
                    "stack": stacks.get(p),
                }
                for p, s, r, st, age in blocks
            ]

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def strategy(self) -> str:
        return self._native.strategy

    @property
    def device(self) -> int:
        """The device ordinal (the simulated device's own, for ``"sim"``)."""
        return self._native.device

    @property
    def memory_kind(self) -> str:
        """``"device"`` (CUDA memory), ``"host"`` (host-backed simulated device) or ``"none"``
        (address-only simulated device: the pointers lead nowhere)."""
        return self._native.memory_kind

    def steady_stats(self) -> Optional[Dict[str, Any]]:
        """The steady arena's figures (None for a pool made with ``steady=False``):
        ``planned_allocations`` (served from the arena), ``dynamic_allocations`` (from the pool),
        ``fallbacks`` (iterations that left their schedule), ``recorded_iterations``,
        ``replayed_iterations``, ``arena_bytes``, ``arena_live`` and ``arena_live_bytes`` (its live
        buffers), and ``plans``, one dict per schedule (``arena_bytes``, ``lower_bound_bytes``,
        ``arena_buffers``, ``dynamic_buffers``, ``events``, ``planner``).

        >>> pool = DevicePool("sim", capacity=1 << 30)
        >>> for _ in range(3):
        ...     bufs = [pool.allocate(4096 * (i + 1)) for i in range(8)]
        ...     for buf in bufs:
        ...         buf.free()
        >>> s = pool.steady_stats()
        >>> (s["recorded_iterations"], s["replayed_iterations"], s["planned_allocations"])
        (1, 2, 16)
        """
        return self._native.steady_stats()

    def set_plan(self, plan: Optional[Union["Plan", str, os.PathLike]]) -> None:
        """Serves every step from now on by ``plan`` (a :class:`vrampool.ahead.Plan`, or the path
        of a saved one), made ahead at the step's largest shape; None goes back to the steady
        arena. A step's i-th allocation takes the plan's i-th offset where it fits (same stream,
        at most the planned size, none of those bytes in use); the first that does not fit sends
        the rest of that step to the pool (``steady_stats()["fallbacks"]``). A step ends once
        everything it allocated is freed, or once its part of the plan is used up and only what
        the plan keeps past the step is live. Allocate what lives across steps (weights, optimizer
        state) before setting a plan without a first step (``plan.first``); a plan with one
        serves them too, set before them.

        The plan's regions (one per stream, ``plan.arena_bytes`` in all) are taken now:
        ``OutOfMemoryError`` where they do not fit. Raises ``ValueError`` for a plan aligned to less
        than the pool's blocks, and while buffers of the steady arena are live.

        >>> from vrampool.ahead import plan_step
        >>> pool = DevicePool("sim", capacity=1 << 30)
        >>> pool.set_plan(plan_step([(0, 4096, 0, 2), (0, 4096, 1, 2)]))   # (stream, size, lower, upper)
        >>> a, b = pool.allocate(4000), pool.allocate(1000)
        >>> b.ptr - a.ptr, pool.steady_stats()["planned_allocations"]
        (4096, 2)
        """
        if plan is None:
            self._native.set_ahead(None, None)
            return
        from vrampool.ahead import ALIGNMENT, as_plan

        plan = as_plan(plan)
        # The core's block alignment: the last `alignment` of the pool's text, else its default.
        alignment = next((parse_size(v) for k, v in reversed(conf_pairs(self._conf)) if k == "alignment"), ALIGNMENT)
        if plan.alignment % alignment:
            raise ValueError(f"the plan's offsets are aligned to {plan.alignment} B, the pool's blocks to {alignment} B: plan at alignment={alignment}")
        self._native.set_ahead(list(plan.rows), list(plan.offsets), plan.alignment, plan.first)

    def planned(self, *, budget_ms: int = 10) -> "PlannedPool":
        """A planned arena over this pool (static plan, dynamic fallback, plans per signature):
        see :class:`vrampool.PlannedPool`."""
        return PlannedPool(self, budget_ms=budget_ms)

    def mem_info(self) -> Tuple[int, int]:
        """What the device reports: (free bytes, total bytes)."""
        return self._native.mem_info()

    def _device_name(self) -> str:
        return f"cuda:{self.device}" if self.memory_kind == "device" else f"sim:{self.device}"

    def _check_own(self, buffer: NativeBuffer) -> None:
        if buffer.belongs_to(self._native):
            return
        if buffer.device != self.device:
            raise WrongDeviceError(f"{buffer!r} is on device {buffer.device}; this pool is on device {self.device}")
        raise ValueError(f"{buffer!r} belongs to another pool")

    def __enter__(self) -> "DevicePool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"DevicePool(strategy={self.strategy!r}, allocated={s['allocated_bytes.all.current']}, "
            f"reserved={s['reserved_bytes.all.current']}{', closed' if self.closed else ''})"
        )


_shared: Dict[int, DevicePool] = {}
_shared_lock = threading.Lock()


def shared_pool(device: int = 0) -> DevicePool:
    """The process-wide pool of CUDA device ``device``, made on first use: the one the CuPy
    allocator, the Numba plugin and the cuda.core resource use unless given a pool. It takes
    the pool keys of ``VRAMPOOL_CONF`` (``VRAMPOOL_CONF=ipc:true``), and the defaults for the rest.

    >>> import vrampool.pool as p
    >>> p.set_shared_pool(0, DevicePool("sim", capacity=1 << 30))
    >>> p.shared_pool(0).memory_kind
    'host'
    >>> p.set_shared_pool(0, None)
    """
    pool = _shared.get(device)
    if pool is None:
        with _shared_lock:
            pool = _shared.get(device)
            if pool is None:
                conf = pool_pairs(os.environ.get("VRAMPOOL_CONF", ""))
                pool = _shared[device] = DevicePool(device, strategy=None, scrub=None, conf=conf)
    return pool


def set_shared_pool(device: int, pool: Optional[DevicePool]) -> None:
    """Makes ``pool`` the shared pool of ``device`` (None: forget it; the next use makes one)."""
    with _shared_lock:
        if pool is None:
            _shared.pop(device, None)
        else:
            _shared[device] = pool
