"""A Numba External Memory Management (EMM) plugin that serves device arrays from vrampool.

Numba is an optional extra (``pip install 'vrampool[numba]'``); this module imports it only
when the plugin class is asked for.

Select it before Numba's CUDA context is made, either way::

    NUMBA_CUDA_MEMORY_MANAGER=vrampool.numba python train.py

    import vrampool.numba
    vrampool.numba.install()

Each device's allocations come from its shared pool (:func:`vrampool.shared_pool`; use
:func:`vrampool.pool.set_shared_pool` first to pick one of your own). Host allocations stay
Numba's (``HostOnlyCUDAMemoryManager``).

Numba's IPC (``DeviceNDArray.get_ipc_handle()``, ``cuda.open_ipc_array``) opens legacy
``cuIpcOpenMemHandle`` handles: it works when the pool shares its segments by legacy handle
(``VRAMPOOL_CONF=ipc:true,ipc_handles:legacy``). An array is part of a larger segment, so its
handle names the segment and carries the array's offset, as CuPy's and PyTorch's do; an
``IpcHandle`` (or ``get_ipc_handle()``) passes the offset on, but the bare 64 handle bytes given to
``open_ipc_array`` open the segment's start unless its ``offset`` argument is given.

A freed array's memory is reused only once the work queued before its free on the legacy
default stream and on every blocking stream (Numba's streams are blocking) has completed, as
Numba's own manager, whose ``cuMemFree`` waits, guarantees: Numba's free names no stream, so
the plugin orders each free after an event on the legacy default stream, which waits for the
blocking streams. A non-blocking stream does not wait for the legacy default stream: work
queued on one before a free is not covered, so synchronize such a stream before dropping the
arrays its work reads or writes.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from vrampool._native import InvalidSizeError, OutOfMemoryError, PoolClosedError
from vrampool.pool import DevicePool, shared_pool
from vrampool.streams import LEGACY_DEFAULT_STREAM

__all__ = ["install"]  # and VrampoolMemoryManager, made on first use (it needs numba)

_class: Any = None


def _manager_class() -> Any:
    global _class
    if _class is not None:
        return _class
    from numba import cuda

    class VrampoolMemoryManager(cuda.HostOnlyCUDAMemoryManager):  # type: ignore[misc, name-defined]
        """Numba's device allocations from vrampool (EMM interface version 1)."""

        _pool: Any = None
        #: A stream of this context that no one else uses (kept alive here), and its handle: the
        #: plugin's blocks, whose last users the pool cannot know, are allocated on it, so they
        #: stay apart from the blocks others free to streams they use.
        _own_stream: Any = None
        _own_handle = 0

        def initialize(self) -> None:
            self._pool = shared_pool(_ordinal(self.context.device))

        @property
        def pool(self) -> DevicePool:
            if self._pool is None:
                self.initialize()
            return self._pool

        def memalloc(self, size: int) -> Any:
            if size == 0:
                return cuda.MemoryPointer(self.context, _device_pointer(0), 0)
            if self._own_stream is None:
                self._own_stream = self.context.create_stream()
                self._own_handle = int(self._own_stream)
            try:
                buf = self._allocate(size)
            except InvalidSizeError as e:
                # More than the pool may ever hold: to Numba's users that is out of memory.
                raise OutOfMemoryError(str(e)) from e
            return cuda.MemoryPointer(self.context, _device_pointer(buf.ptr), size, finalizer=_finalizer(buf))

        def _allocate(self, size: int) -> Any:
            try:
                return self.pool.allocate(size, self._own_handle)
            except OutOfMemoryError:
                # Freed blocks may still wait for their events: once the device is idle they
                # are free, as Numba's own manager finds its memory after cuMemFree's wait.
                self.context.synchronize()
                return self.pool.allocate(size, self._own_handle)

        def get_memory_info(self) -> Any:
            # The device's free memory, plus what the pool holds cached: both can back an allocation.
            free, total = self.pool.mem_info()
            s = self.pool.stats()
            cached = s["reserved_bytes.all.current"] - s["allocated_bytes.all.current"]
            return cuda.MemoryInfo(free=min(total, free + max(0, cached)), total=total)

        def get_ipc_handle(self, memory: Any) -> Any:
            # Numba's importers open legacy handles, with the array's offset in the allocation.
            pool = self.pool
            if not pool.ipc:
                raise ValueError(f"{pool!r} was made without ipc=True: {_LEGACY_POOL}")
            handle, offset, _ = pool._native.ipc_export_range(int(memory.handle), memory.size)
            if not isinstance(handle, bytes):
                os.close(handle)
                raise ValueError(f"{pool!r} shares by file descriptor, and Numba opens legacy IPC handles: {_LEGACY_POOL}")
            source = self.context.device.get_device_identity()
            return _ipc_handle_class()(memory, _binding_handle(handle), memory.size, source, offset=offset)

        def reset(self) -> None:
            super().reset()
            if not self.pool.closed:
                self.pool.trim()

        @property
        def interface_version(self) -> int:
            return 1

    _class = VrampoolMemoryManager
    return _class


_LEGACY_POOL = (
    "for Numba's IPC handles make the plugin's pool share by legacy IPC handle "
    "(VRAMPOOL_CONF=ipc:true,ipc_handles:legacy, or vrampool.pool.set_shared_pool with "
    "DevicePool(device, ipc=True, ipc_handles='legacy'))"
)


_ipc_class: Any = None


def _ipc_handle_class() -> Any:
    """Numba's ``IpcHandle``, pickled as the handle's 64 bytes: cuda.bindings 13.4 and later
    keep ``CUipcMemHandle`` opaque (no ``reserved``), which Numba's own pickling reads."""
    global _ipc_class
    if _ipc_class is None:
        from numba.cuda.cudadrv import driver

        class VrampoolIpcHandle(driver.IpcHandle):  # type: ignore[misc, name-defined]
            def __reduce__(self) -> Any:
                return (_rebuild_ipc_handle, (_handle_bytes(self.handle), self.size, self.source_info, self.offset))

        _ipc_class = VrampoolIpcHandle
    return _ipc_class


def _rebuild_ipc_handle(raw: bytes, size: int, source_info: Any, offset: int) -> Any:
    return _ipc_handle_class()(None, _binding_handle(raw), size, source_info, offset=offset)


def _binding_handle(raw: bytes) -> Any:
    """A ``CUipcMemHandle`` holding ``raw`` (written through its address: no field to set)."""
    from numba.cuda.cudadrv import driver

    handle = driver.binding.CUipcMemHandle()
    ctypes.memmove(handle.getPtr(), raw, len(raw))
    return handle


def _handle_bytes(handle: Any) -> bytes:
    return ctypes.string_at(handle.getPtr(), 64)


def _ordinal(device: Any) -> int:
    """The ordinal of a context's device: Numba's ``Device`` (``id``), or the raw ``CUdevice``
    of a context wrapped from a third party's (``int()`` of it)."""
    ordinal = getattr(device, "id", None)
    return int(device) if ordinal is None else ordinal


def _finalizer(buf: Any) -> Any:
    def finalizer() -> None:
        try:
            # Reused once the legacy default stream passes this point (see the module's text).
            buf.free(stream=LEGACY_DEFAULT_STREAM)
        except PoolClosedError:
            pass  # the pool went first; its segments go with it

    return finalizer


def _device_pointer(address: int) -> Any:
    from numba.cuda.cudadrv import driver

    binding = getattr(driver, "binding", None)
    if getattr(driver, "USE_NV_BINDING", binding is not None) and binding is not None:
        return binding.CUdeviceptr(address)
    return ctypes.c_uint64(address)


def install() -> None:
    """``numba.cuda.set_memory_manager(VrampoolMemoryManager)``: call before any CUDA work."""
    from numba import cuda

    cuda.set_memory_manager(_manager_class())


def __getattr__(name: str) -> Any:
    # Numba reads `_numba_memory_manager` from the module NUMBA_CUDA_MEMORY_MANAGER names.
    if name in ("_numba_memory_manager", "VrampoolMemoryManager"):
        return _manager_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
