"""An allocator for ``cupy.cuda.set_allocator`` that serves CuPy's arrays from vrampool.

CuPy is an optional extra (``pip install 'vrampool[cupy]'``); it is imported when an allocation
is made, not when this module is.

>>> import cupy, vrampool.cupy                           # doctest: +SKIP
>>> cupy.cuda.set_allocator(vrampool.cupy.malloc)        # the shared pool of each device
>>> x = cupy.arange(10)                                  # served by vrampool
>>> vrampool.cupy.install(vrampool.DevicePool(0))        # or one pool of your own

Each allocation is a :class:`vrampool.DeviceBuffer` on CuPy's current stream, wrapped in
``cupy.cuda.UnownedMemory`` whose ``owner`` is the buffer: the block goes back to the pool when
CuPy drops the memory (the buffer is collected).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from vrampool._native import InvalidSizeError, OutOfMemoryError, WrongDeviceError
from vrampool.pool import DevicePool, shared_pool

__all__ = ["allocator", "install", "malloc"]


def allocator(pool: Optional[DevicePool] = None) -> Callable[[int], Any]:
    """A function for ``cupy.cuda.set_allocator``: ``nbytes -> cupy.cuda.MemoryPointer``.

    ``pool``: the pool to serve from (it must be on CuPy's current device when called);
    default: the shared pool of the current device (:func:`vrampool.shared_pool`).
    """
    if pool is not None and not isinstance(pool, DevicePool):
        raise TypeError(f"pool must be a vrampool.DevicePool, not {type(pool).__name__}")

    def vrampool_malloc(nbytes: int) -> Any:
        import cupy

        device = cupy.cuda.runtime.getDevice()
        if nbytes == 0:
            # CuPy asks for empty arrays too; a null pointer serves them.
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, device), 0)
        source = pool if pool is not None else shared_pool(device)
        if source.memory_kind == "device" and source.device != device:
            raise WrongDeviceError(f"the pool is on device {source.device}; CuPy's current device is {device}")
        try:
            buf = source.allocate(nbytes, stream=cupy.cuda.get_current_stream().ptr)
        except InvalidSizeError as e:
            # More than the pool may ever hold: to CuPy's users that is out of memory.
            raise OutOfMemoryError(str(e)) from e
        memory = cupy.cuda.UnownedMemory(buf.ptr, nbytes, buf, device)
        return cupy.cuda.MemoryPointer(memory, 0)

    return vrampool_malloc


#: ``cupy.cuda.set_allocator(vrampool.cupy.malloc)``: each device's shared pool.
malloc = allocator()


def install(pool: Optional[DevicePool] = None) -> None:
    """``cupy.cuda.set_allocator(allocator(pool))``; ``cupy.cuda.set_allocator()`` undoes it."""
    import cupy

    cupy.cuda.set_allocator(allocator(pool))
