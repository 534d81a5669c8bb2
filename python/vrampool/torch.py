"""vrampool as PyTorch's CUDA allocator, and PyTorch-style statistics of it.

Two ways in, both through ``torch.cuda.memory.CUDAPluggableAllocator`` over the C ABI that the
extension module ``vrampool._native`` exports (``vrampool_malloc``, ``vrampool_free`` and every
optional hook PyTorch offers):

- :func:`install` makes vrampool serve every CUDA allocation of the process. It must run before
  the first CUDA tensor (PyTorch cannot change its allocator after that)::

      import vrampool.torch
      vrampool.torch.install(round_up_divisions=4)    # or VRAMPOOL_CONF="round_up_divisions:4"
      model = Model().cuda()

- :func:`pool` routes one region of code through vrampool (``torch.cuda.MemPool``, PyTorch 2.5
  or newer) while PyTorch's own caching allocator serves the rest::

      with vrampool.torch.pool():
          activations = model(batch)

Under :func:`install`, :func:`planned` turns on the planned arena: the first iteration of each
signature is recorded, and later iterations that allocate the same sequence are served from one
arena at planned offsets (falling back to the pool on divergence); :func:`step` marks the
iterations::

      with vrampool.torch.planned():
          for x, y in loader:
              vrampool.torch.step(key=x.shape)
              train_step(x, y)

Under :func:`install`, :func:`region` gives the tensors made inside it a tag whose GPU memory
:func:`pause` gives back and :func:`resume` takes again at the same addresses (RL post-training,
as vLLM's sleep mode and ``torch_memory_saver``: see ``docs/pause-resume.md``)::

      with vrampool.torch.region("kv_cache"):
          cache = torch.empty(n, device="cuda")
      vrampool.torch.pause("kv_cache")
      vrampool.torch.resume("kv_cache")

PyTorch's own statistics do not work under a pluggable allocator, so this module mirrors them:
:func:`memory_stats` (PyTorch's key names), :func:`memory_allocated`, :func:`memory_reserved`,
:func:`max_memory_allocated`, :func:`max_memory_reserved`, :func:`reset_peak_memory_stats`,
:func:`memory_summary`, :func:`empty_cache`, :func:`memory_snapshot` (the dict format of
``torch.cuda.memory._snapshot()``, which ``torch.cuda._memory_viz`` and the memory visualiser
read) and :func:`last_oom` (why the last allocation failed and what to try).

Configuration: ``VRAMPOOL_CONF`` (``strategy:hybrid,limit:0.9,small_max:1MB``, in the spirit of
``PYTORCH_CUDA_ALLOC_CONF``), then the keyword arguments of :func:`install`, :func:`pool` or
:func:`configure`, which must come before the first allocation. The keys are :data:`OPTIONS`,
read by the core as the text is (:mod:`vrampool.options`): every option of
:class:`vrampool.DevicePool` (``strategy``, ``small_max``, ``large_min``, ``alignment``,
``round_up_divisions``, ``limit``: bytes, or a fraction of the device written with a point,
``record_events``, ``expandable``, ``reclaim``, ``scrub``, ``track_leaks``), and ``device``
(``cuda``, or ``sim`` for the simulated device: tests only) with ``sim_capacity``.

An allocation that fails raises ``RuntimeError("CUDA out of memory. ...")`` under :func:`install`
(PyTorch turns a null from a pluggable allocator into a tensor at address 0, so the C ABI throws a
C++ exception instead); inside :func:`pool` PyTorch's caching allocator gets the null and raises
its own ``torch.OutOfMemoryError``. Either way :func:`last_oom` explains it.

This module imports torch only inside the functions that need it: ``import vrampool.torch`` works
without torch, and the statistics work without it too.

>>> import vrampool.torch as vt
>>> vt.memory_allocated(0) >= 0
True
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from vrampool._native import (
    ABI_SYMBOLS,
    abi_pause,
    abi_planned,
    abi_planned_stats,
    abi_planned_step,
    abi_raise_on_failure,
    abi_region,
    abi_reset_peak_stats,
    abi_resume,
    abi_set_ahead,
    abi_snapshot,
    abi_stats,
    abi_tags,
    abi_trim,
)
from vrampool._native import configuration as _configuration
from vrampool._native import configure as _configure
from vrampool._native import last_error as _last_error
from vrampool._native import last_oom as _last_oom
from vrampool.options import ALLOCATOR_KEYS, conf_text
from vrampool.streams import as_int
from vrampool.summary import format_size, format_summary
from vrampool.tags import PauseReport, TagInfo, tag_infos

if TYPE_CHECKING:
    from vrampool.ahead import Plan

__all__ = [
    "OomReport",
    "allocator",
    "configuration",
    "configure",
    "empty_cache",
    "hooks",
    "install",
    "is_installed",
    "last_error",
    "last_oom",
    "library_path",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_summary",
    "pause",
    "planned",
    "planned_stats",
    "pool",
    "region",
    "reset_peak_memory_stats",
    "resume",
    "set_plan",
    "step",
    "tags",
]

Device = Union[int, str, Any, None]  # an ordinal, "cuda:1", a torch.device, or None (current)

#: Configuration keys (the core's): the pool's, then the allocator's own.
OPTIONS = tuple(ALLOCATOR_KEYS)

#: Each optional hook of ``CUDAPluggableAllocator``: the setter names PyTorch versions use for it.
_SETTERS: Dict[str, Tuple[str, ...]] = {
    "init": ("set_init_fn", "_set_init_fn"),
    "reset": ("set_reset_fn", "_set_reset_fn"),
    "memory_fraction": ("set_memory_fraction_fn", "_set_memory_fraction_fn"),
    "base_alloc": ("set_base_alloc_fn", "_set_base_alloc_fn"),
    "record_stream": ("set_record_stream_fn", "_set_record_stream_fn"),
    "begin_allocate_to_pool": ("set_begin_allocate_to_pool", "_set_begin_allocate_to_pool", "set_begin_allocate_to_pool_fn"),
    "end_allocate_to_pool": ("set_end_allocate_to_pool_fn", "_set_end_allocate_to_pool_fn", "set_end_allocate_to_pool"),
    "release_pool": ("set_release_pool", "_set_release_pool", "set_release_pool_fn"),
}

_lock = threading.RLock()
_allocator: Any = None
_hooks: Dict[str, str] = {}
_installed = False
#: A plan that :func:`install` sets at the end of the next optimizer step.
_pending_plan: Optional["Plan"] = None


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised in a subprocess test
        raise ImportError("vrampool.torch needs PyTorch for this; the statistics work without it") from e
    return torch


def configure(**conf: Any) -> str:
    """Sets the configuration of the pools vrampool makes for PyTorch, over ``VRAMPOOL_CONF``.

    Must come before the first allocation (a later call that would change it raises
    ``ValueError``). Returns the configuration text in force.
    """
    return _configure(conf_text(conf))


def configuration() -> Dict[str, Any]:
    """The configuration in force, the devices that have a pool, and whether failures raise."""
    return dict(_configuration())


def library_path() -> str:
    """The shared object PyTorch loads the allocator from: the extension module itself."""
    return os.path.abspath(importlib.util.find_spec("vrampool._native").origin)


def allocator() -> Any:
    """The ``torch.cuda.memory.CUDAPluggableAllocator`` over vrampool's C ABI, with every
    optional hook this PyTorch offers set (made once per process)."""
    global _allocator
    with _lock:
        if _allocator is None:
            torch = _torch()
            path = library_path()
            alloc = torch.cuda.memory.CUDAPluggableAllocator(path, ABI_SYMBOLS["torch_malloc"], "vrampool_free")
            lib = ctypes.CDLL(path)
            native = alloc.allocator()
            for hook, names in _SETTERS.items():
                name = next((n for n in names if hasattr(native, n)), None)
                if name is None:
                    continue  # this PyTorch has no such hook
                address = ctypes.cast(getattr(lib, ABI_SYMBOLS[hook]), ctypes.c_void_p).value
                getattr(native, name)(address)
                _hooks[hook] = name
            _allocator = alloc
        return _allocator


def hooks() -> Dict[str, str]:
    """The optional hooks set on :func:`allocator`, each with the PyTorch setter used."""
    return dict(_hooks)


def is_installed() -> bool:
    """Whether :func:`install` made vrampool PyTorch's CUDA allocator in this process."""
    return _installed


def install(*, plan: Optional[Union["Plan", str, Path]] = None, **conf: Any) -> Any:
    """Makes vrampool PyTorch's CUDA allocator for the rest of the process; returns the
    ``CUDAPluggableAllocator``. Keyword arguments configure it (see the module's doc).

    ``plan`` (a :class:`vrampool.ahead.Plan`, such as :func:`vrampool.whatif.ahead.capture` makes, or the path of a
    saved one) serves every training step by a plan made ahead at the largest shape. It is checked
    now. A plan with a first step of its own (``plan.first``, as :func:`vrampool.whatif.ahead.from_trace`
    makes from a trace that begins with the model's weights) is set on the current device at once,
    so that the weights, the first step and the optimizer's state are the plan's too; any other is
    set at the end of the next optimizer step, once the weights and the optimizer's state exist:
    those live across steps, and in the plan's bytes they would keep them taken (:func:`set_plan`
    sets a plan at once).

    Must run before the first CUDA tensor: PyTorch cannot change its allocator once CUDA is
    initialised, and this raises ``RuntimeError`` then. A second call returns the same allocator
    (and refuses a configuration that would change it).
    """
    global _installed, _pending_plan
    torch = _torch()
    if plan is not None:
        from vrampool.ahead import as_plan

        plan = as_plan(plan)  # a bad file is refused before anything changes
    with _lock:
        if _installed:
            if conf:
                configure(**conf)
            if plan is not None:  # the weights may exist by now: set at the next optimizer step
                _pending_plan = _checked_plan(plan).without_first_step()
            return _allocator
        if torch.cuda.is_initialized():
            raise RuntimeError(
                "vrampool.torch.install() must run before the first CUDA tensor: CUDA is already "
                "initialised in this process, and PyTorch cannot change its allocator after that. "
                "Call install() at the start of the program, before any .cuda() or device='cuda' "
                "allocation, or route one region through vrampool with vrampool.torch.pool()."
            )
        configure(**conf)
        pending = _checked_plan(plan) if plan is not None else None
        alloc = allocator()
        # PyTorch takes a pluggable allocator's null for a valid pointer: throw instead.
        abi_raise_on_failure(True)
        try:
            torch.cuda.memory.change_current_allocator(alloc)
        except BaseException:
            abi_raise_on_failure(False)
            raise
        _installed = True
        _pending_plan = pending if pending is None or not pending.first else None
        _mark_optimizer_steps()
        if pending is not None and pending.first:
            set_plan(pending)
        _refuse_cuda_sharing()
        return alloc


def _mark_optimizer_steps() -> None:
    """Ends the planned arena's iteration at every optimizer step (PyTorch's global hook), so that
    the ``steady`` option (on by default) serves a training loop's steps from one arena with no
    change to its code. Each iteration then picks its plan by its first allocation. Inside
    :func:`planned`, the caller's :func:`step` marks the boundaries instead."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from vrampool.planned import AUTO_KEY

    def step_ended(optimizer: Any, args: Any, kwargs: Any) -> None:
        global _pending_plan
        if not abi_planned():
            abi_planned_step(AUTO_KEY)
        with _lock:
            plan, _pending_plan = _pending_plan, None
        if plan is None:
            return
        try:
            set_plan(plan)
        except ValueError:
            # Buffers the steady arena served are still live (kept from an earlier loop): their
            # bytes are the arena's. Try again at the next optimizer step.
            with _lock:
                _pending_plan = _pending_plan or plan

    register_optimizer_step_post_hook(step_ended)


#: What ``torch.multiprocessing`` meets when it would share a CUDA tensor under :func:`install`.
CUDA_SHARING_REFUSED = (
    "vrampool: torch.multiprocessing cannot share a CUDA tensor under vrampool.torch.install(): "
    "PyTorch shares CUDA memory through its own allocator's IPC handles, which a pluggable allocator "
    "cannot give. Share a vrampool.DevicePool(0, ipc=True) buffer instead (vrampool.ipc), send the "
    "tensor through the CPU, or keep PyTorch's allocator in this process (vrampool.torch.pool() for a region)"
)


def _refuse_cuda_sharing() -> None:
    """Makes ``torch.multiprocessing``'s pickler refuse CUDA tensors and storages with
    :data:`CUDA_SHARING_REFUSED` (PyTorch's own refusal is an internal message of its pluggable
    allocator, raised only in the receiving process); everything else pickles as before."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing.reductions as reductions  # registers PyTorch's reducers first

    def refusing(reduce: Any) -> Any:
        def reduce_unless_cuda(obj: Any) -> Any:
            if getattr(obj, "is_cuda", False):
                raise RuntimeError(CUDA_SHARING_REFUSED)
            return reduce(obj)

        return reduce_unless_cuda

    for cls, reduce in list(ForkingPickler._extra_reducers.items()):
        if reduce in (reductions.reduce_tensor, reductions.reduce_storage, reductions.reduce_typed_storage, reductions.reduce_typed_storage_child):
            ForkingPickler.register(cls, refusing(reduce))


@contextlib.contextmanager
def pool(**conf: Any) -> Iterator[Any]:
    """Routes the allocations of the current thread inside the ``with`` block through vrampool,
    with ``torch.cuda.MemPool(allocator)`` and ``torch.cuda.use_mem_pool`` (PyTorch 2.5 or newer);
    yields the ``MemPool``. PyTorch's caching allocator still serves everything outside, and caches
    inside the pool: ``torch.cuda.empty_cache()`` (or :func:`empty_cache`) hands its free segments
    back to vrampool. Tensors made inside keep their memory after the block; the pool's memory goes
    back when they and the ``MemPool`` are gone.
    """
    torch = _torch()
    if _installed:
        raise RuntimeError(
            "vrampool.torch.pool() routes one region through vrampool while PyTorch's allocator serves "
            "the rest; after install() vrampool serves every allocation already"
        )
    if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
        raise RuntimeError(f"vrampool.torch.pool() needs torch.cuda.MemPool (PyTorch 2.5 or newer); this is PyTorch {torch.__version__}")
    if conf:
        configure(**conf)
    mem_pool = torch.cuda.MemPool(allocator().allocator())
    with torch.cuda.use_mem_pool(mem_pool):
        yield mem_pool


# ---- the planned arena: a mode of the allocator ----


@contextlib.contextmanager
def planned() -> Iterator[None]:
    """Serves the allocations inside the block through the planned arena of each device (see
    :class:`vrampool.PlannedPool`): the first iteration of a signature runs on the pool and is
    recorded, later ones that repeat its allocation sequence exactly come from one arena at the
    planned offsets. Call :func:`step` between iterations. Meant for :func:`install`, where every
    tensor comes from vrampool; tensors made inside may outlive the block."""
    previous = abi_planned()
    abi_planned(True)
    try:
        yield
    finally:
        abi_planned(previous)


def step(key: Any = None) -> None:
    """An iteration boundary for the planned arena; ``key`` is the next iteration's signature
    (e.g. its input shapes; hashed by ``repr``), and plans are kept per key."""
    from vrampool.planned import signature_key

    abi_planned_step(signature_key(key))


def planned_stats(device: Device = None) -> Optional[Dict[str, Any]]:
    """The planned arena's figures on ``device`` (as :meth:`vrampool.PlannedPool.stats` gives
    them), or None before its first planned allocation."""
    return abi_planned_stats(_device_index(device))


# ---- tagged regions, paused and resumed (RL post-training: vLLM's sleep mode, torch_memory_saver) ----


@contextlib.contextmanager
def region(tag: str, device: Device = None) -> Iterator[None]:
    """Under :func:`install`, the tensors allocated inside the ``with`` block belong to ``tag``
    on ``device``, whose memory :func:`pause` gives back and :func:`resume` takes again at the same
    addresses (``torch_memory_saver.region``). Regions nest; other tensors belong to no tag."""
    index = _device_index(device)
    abi_region(index, tag, True)
    try:
        yield
    finally:
        abi_region(index, tag, False)


def pause(tag: Optional[str] = None, *, backup: bool = False, device: Device = None) -> PauseReport:
    """Gives ``tag``'s GPU memory back (every tag's for None), keeping every tensor's address and
    the CUDA graphs that use them; with ``backup``, their bytes go to host memory first and come
    back on :func:`resume`. Tensors of a paused tag must not be used until then (see
    :meth:`vrampool.DevicePool.pause`)."""
    return PauseReport(*abi_pause(_device_index(device), tag, backup))


def resume(tag: Optional[str] = None, *, cached: bool = True, device: Device = None) -> int:
    """Maps memory again under ``tag``'s tensors (every tag's for None) and restores the backup
    if one was kept; returns the bytes mapped (see :meth:`vrampool.DevicePool.resume`)."""
    return abi_resume(_device_index(device), tag, cached)


def tags(device: Device = None) -> List[TagInfo]:
    """``device``'s tags and their memory now."""
    return tag_infos(abi_tags(_device_index(device)))


# ---- plans made ahead at the largest shape ----


def _checked_plan(plan: Union["Plan", str, Path]) -> "Plan":
    """``plan`` (or the plan saved at a path), refused unless aligned to the pools' blocks."""
    from vrampool.ahead import as_plan

    plan = as_plan(plan)
    alignment = int(_configuration()["alignment"])
    if plan.alignment % alignment:
        raise ValueError(f"the plan's offsets are aligned to {plan.alignment} B, the pool's blocks to {alignment} B: plan at alignment={alignment}")
    return plan


def set_plan(plan: Optional[Union["Plan", str, Path]], device: Device = None) -> None:
    """Serves every step on ``device`` (default: the current one) from now on by ``plan`` (a
    :class:`vrampool.ahead.Plan` or the path of a saved one; None: back to the steady arena), as
    :meth:`vrampool.DevicePool.set_plan` does; its regions are taken now (the device's pool is
    made if it is not yet). Steps end at each optimizer step. Set it once what lives across steps
    exists (an inference server's weights, say); :func:`install` ``(plan=...)`` waits for the end
    of the first optimizer step."""
    index = _device_index(device)
    if plan is None:
        abi_set_ahead(index, None, None)
        return
    checked = _checked_plan(plan)
    abi_set_ahead(index, list(checked.rows), list(checked.offsets), checked.alignment, checked.first)


# ---- statistics, mirrored under PyTorch's names ----


#: The device ordinals the C ABI serves (PyTorch's ``DeviceIndex`` is an ``int8_t``).
MAX_DEVICES = 128


def _device_index(device: Device) -> int:
    """A device ordinal from what PyTorch's memory functions take; ``ValueError`` for one that
    names no device (as PyTorch refuses it), and ``TypeError`` for what is no device at all.

    >>> _device_index(None), _device_index(2), _device_index("cuda:1"), _device_index("cuda")
    (0, 2, 1, 0)
    >>> _device_index(-1)
    Traceback (most recent call last):
    ...
    ValueError: invalid device -1: not a device ordinal (0 to 127)
    """
    index = _device_ordinal(device)
    limit = _device_limit()
    if not 0 <= index < limit:
        raise ValueError(f"invalid device {device!r}: not a device ordinal (0 to {limit - 1})")
    return index


def _device_limit() -> int:
    """How many devices there are: CUDA's count where torch sees CUDA devices and vrampool serves
    CUDA, else every ordinal the C ABI serves (the simulated device has as many as asked for)."""
    torch = sys.modules.get("torch")
    if torch is not None and _configuration()["device"] == "cuda":
        try:
            count = int(torch.cuda.device_count())
        except Exception:  # a broken driver: torch's own calls will say so
            count = 0
        if count > 0:
            return min(count, MAX_DEVICES)
    return MAX_DEVICES


def _device_ordinal(device: Device) -> int:
    if device is None or (isinstance(device, str) and device == "cuda"):
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
        return 0
    if isinstance(device, bool):
        raise TypeError("device must be an int, a 'cuda:N' string or a torch.device")
    number = as_int(device)
    if number is not None:
        return number
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda" or not index.isdigit():
            raise ValueError(f"not a CUDA device: {device!r}")
        return int(index)
    index = getattr(device, "index", None)
    if getattr(device, "type", None) == "cuda":
        return _device_ordinal(None) if index is None else int(index)
    raise TypeError(f"device must be an int, a 'cuda:N' string or a torch.device, not {device!r}")


def memory_stats(device: Device = None) -> "OrderedDict[str, Union[int, float]]":
    """The device's figures under PyTorch's key names (``allocated_bytes.all.current``,
    ``reserved_bytes.all.peak``, ``num_alloc_retries``, ``num_ooms``, ...) and vrampool's own
    (``fragmentation``, ``largest_free_bytes``, ``capacity_bytes``, ...), sorted by key as
    ``torch.cuda.memory_stats`` sorts them. Zeros before the device's first allocation."""
    stats = abi_stats(_device_index(device))
    return OrderedDict(sorted(stats.items()))


def memory_allocated(device: Device = None) -> int:
    """Bytes in blocks handed out (``torch.cuda.memory_allocated``)."""
    return int(abi_stats(_device_index(device))["allocated_bytes.all.current"])


def max_memory_allocated(device: Device = None) -> int:
    """The most bytes in blocks handed out at once since the start or the last
    :func:`reset_peak_memory_stats` (``torch.cuda.max_memory_allocated``). With private pools
    (CUDA graphs, ``torch.cuda.MemPool``), each pool's peak, added up: an upper bound."""
    return int(abi_stats(_device_index(device))["allocated_bytes.all.peak"])


def memory_reserved(device: Device = None) -> int:
    """Bytes held from the device (``torch.cuda.memory_reserved``)."""
    return int(abi_stats(_device_index(device))["reserved_bytes.all.current"])


def max_memory_reserved(device: Device = None) -> int:
    """The most bytes held from the device at once since the start or the last
    :func:`reset_peak_memory_stats` (``torch.cuda.max_memory_reserved``); with private pools, as
    :func:`max_memory_allocated` adds them up."""
    return int(abi_stats(_device_index(device))["reserved_bytes.all.peak"])


def reset_peak_memory_stats(device: Device = None) -> None:
    """Starts the peaks over from the current values."""
    abi_reset_peak_stats(_device_index(device))


def memory_summary(device: Device = None, abbreviated: bool = False) -> str:
    """A table of the device's figures laid out like ``torch.cuda.memory_summary()``; the strategy
    tiers' segments follow unless ``abbreviated``."""
    index = _device_index(device)
    segments = None if abbreviated else [s for s in abi_snapshot()["segments"] if s["device"] == index]
    return format_summary(abi_stats(index), segments, title=f"vrampool memory summary, device {index}")


def empty_cache() -> int:
    """Gives every wholly free segment back to the device (``torch.cuda.empty_cache``); returns
    the bytes vrampool gave back. PyTorch's own cache is emptied first where CUDA is initialised
    (under :func:`pool` that hands its free segments back to vrampool)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return int(abi_trim())


def memory_snapshot() -> Dict[str, Any]:
    """Every segment of every device in the format of ``torch.cuda.memory._snapshot()``, which
    ``torch.cuda._memory_viz`` and the memory visualiser read (as ``DevicePool.snapshot()``).

    Segments carry ``device``, ``address``, ``total_size``, ``allocated_size``, ``active_size``,
    ``requested_size``, ``stream``, ``segment_type`` (``small`` for the slab tier), ``segment_pool_id``
    (``(0, 0)``, or a private pool's id), ``is_expandable`` (a mapped run of an expandable
    segment), ``frames`` and ``blocks``, which cover the segment in address order:
    ``active_allocated`` (in use), ``active_pending_free`` (freed, waiting for another stream) and
    ``inactive`` (free, or ``cached``: kept at its size). Each also says which ``strategy`` tier it
    belongs to, and ``vrampool_paused`` whether its memory is paused (:func:`pause`).
    ``device_traces`` holds an empty list per device (vrampool records no stack traces).
    """
    return dict(abi_snapshot(_device_count()))


def _device_count() -> int:
    torch = sys.modules.get("torch")
    try:
        return int(torch.cuda.device_count()) if torch is not None else 0
    except Exception:  # a broken driver: the snapshot still lists vrampool's devices
        return 0


# ---- failures ----


@dataclass(frozen=True)
class OomReport:
    """Why the last allocation failed for want of memory, and what to try (``hints``)."""

    device: int
    stream: int
    requested: int
    allocated: int
    reserved: int
    #: Reserved but unallocated bytes, and the largest single free block among them.
    free: int
    largest_free: int
    #: 1 - largest_free / free: 0 when the free memory is one block.
    fragmentation: float
    #: What the device reported free (0 when unknown).
    device_free: int
    #: What the steady arena holds of ``reserved``, the bytes of its live buffers (counted in
    #: ``allocated``) and their count.
    arena: int
    arena_live: int
    arena_buffers: int
    limit: Optional[int]
    #: The most the pool may reserve (the limit, or the device's memory).
    capacity: int
    #: The request exceeds what the pool may ever reserve.
    too_large: bool
    strategy: str
    round_up_divisions: int
    num_ooms: int
    message: str
    hints: Tuple[str, ...]

    def __str__(self) -> str:
        return "\n".join([self.message, "What to try:"] + [f"  - {h}" for h in self.hints])


def _hints(r: Mapping[str, Any]) -> Tuple[str, ...]:
    req, free, largest = r["requested"], r["free"], r["largest_free"]
    hints = []
    if r["arena_buffers"] > 0 and r["arena"] - r["arena_live"] > 0:
        one = r["arena_buffers"] == 1
        buffers, keep, them = ("buffer", "keeps", "it") if one else ("buffers", "keep", "them")
        hints.append(
            f"{r['arena_buffers']} live {buffers} ({format_size(r['arena_live'])}) {keep} the steady arena's "
            f"{format_size(r['arena'])} from the pool: free {them} (a tensor kept from the last step, such as a loss "
            "kept for logging, or outputs) and the arena goes back to the pool, which torch.cuda.empty_cache() then "
            f"gives to the device; empty_cache() cannot while {them} live{'s' if one else ''}"
        )
    if r["too_large"]:
        if r["limit"] is not None:
            hints.append(
                f"the request ({format_size(req)}) is more than the pool may ever reserve ({format_size(r['capacity'])}): "
                "raise the limit (limit: in VRAMPOOL_CONF or install(limit=...), or "
                "torch.cuda.set_per_process_memory_fraction)"
            )
        else:
            hints.append(f"the request ({format_size(req)}) is more than the device holds: split the tensor")
    if free >= req and largest < req:
        hints.append(
            f"{format_size(free)} is reserved but unallocated, in pieces of at most {format_size(largest)} "
            f"(fragmentation {100 * r['fragmentation']:.0f} %): free long-lived tensors before the peak, or call "
            "torch.cuda.empty_cache() between phases of different shapes"
        )
    if r["round_up_divisions"] == 0 and (free >= req or r["fragmentation"] > 0.25):
        hints.append("pad requests to fewer distinct sizes: round_up_divisions:4 (VRAMPOOL_CONF, or install(round_up_divisions=4))")
    if r["strategy"] == "buddy":
        hints.append("the buddy strategy rounds every block to a power of two: strategy:hybrid or best_fit wastes less")
    if r["limit"] is not None and not r["too_large"]:
        hints.append(f"the pool is capped at {format_size(r['capacity'])}: raise the limit (limit:, or set_per_process_memory_fraction)")
    if 0 < r["device_free"] < req:
        hints.append(
            f"the device reports only {format_size(r['device_free'])} free: other processes or PyTorch's own cache "
            "hold the rest (torch.cuda.empty_cache() returns PyTorch's; nvidia-smi shows other processes)"
        )
    hints.append("use a smaller batch (or shorter sequences), activation checkpointing, or lower precision")
    return tuple(hints)


def last_oom() -> Optional[OomReport]:
    """The last allocation (any thread, any device) that failed for want of memory, with its
    figures and what to try; None if none has."""
    r = _last_oom()
    if r is None:
        return None
    return OomReport(**r, hints=_hints(r))


def last_error() -> Optional[str]:
    """The message of the last failed or refused call into vrampool's C ABI (a failed
    allocation, a free of a pointer that is not vrampool's, a bad fraction, ...), or None."""
    return _last_error()
