"""A Numba External Memory Management (EMM) plugin that serves device arrays from vrampool.

Numba is an optional extra (``pip install 'vrampool[numba]'``); this module imports it only
when the plugin class is asked for.

Select it before Numba's CUDA context is made, either way::

    NUMBA_CUDA_MEMORY_MANAGER=vrampool.numba python train.py

    import vrampool.numba
    vrampool.numba.install()

Each device's allocations come from its shared pool (:func:`vrampool.shared_pool`; use
:func:`vrampool.pool.set_shared_pool` first to pick one of your own). Host allocations stay
Numba's (``HostOnlyCUDAMemoryManager``). IPC handles are not supported: blocks are parts of
larger segments.
"""

from __future__ import annotations

import ctypes
from typing import Any

from vrampool._native import InvalidSizeError, OutOfMemoryError, PoolClosedError
from vrampool.pool import DevicePool, shared_pool

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

        def initialize(self) -> None:
            self._pool = shared_pool(self.context.device.id)

        @property
        def pool(self) -> DevicePool:
            if self._pool is None:
                self.initialize()
            return self._pool

        def memalloc(self, size: int) -> Any:
            if size == 0:
                return cuda.MemoryPointer(self.context, _device_pointer(0), 0)
            try:
                buf = self.pool.allocate(size)
            except InvalidSizeError as e:
                # More than the pool may ever hold: to Numba's users that is out of memory.
                raise OutOfMemoryError(str(e)) from e
            return cuda.MemoryPointer(self.context, _device_pointer(buf.ptr), size, finalizer=_finalizer(buf))

        def get_memory_info(self) -> Any:
            # The device's free memory, plus what the pool holds cached: both can back an allocation.
            free, total = self.pool.mem_info()
            s = self.pool.stats()
            cached = s["reserved_bytes.all.current"] - s["allocated_bytes.all.current"]
            return cuda.MemoryInfo(free=min(total, free + max(0, cached)), total=total)

        def get_ipc_handle(self, memory: Any) -> Any:
            raise NotImplementedError("vrampool blocks are parts of larger segments: no IPC handles")

        def reset(self) -> None:
            super().reset()
            if not self.pool.closed:
                self.pool.trim()

        @property
        def interface_version(self) -> int:
            return 1

    _class = VrampoolMemoryManager
    return _class


def _finalizer(buf: Any) -> Any:
    def finalizer() -> None:
        try:
            buf.free()
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
