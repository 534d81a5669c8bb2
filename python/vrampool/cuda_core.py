"""A ``cuda.core`` ``MemoryResource`` that serves buffers from a vrampool pool.

Needs cuda-core 1.2 or newer (``pip install 'vrampool[cuda]'``); ``import vrampool`` does not
import it, only this module does.

>>> from cuda.core import Device                          # doctest: +SKIP
>>> from vrampool.cuda_core import PoolMemoryResource
>>> dev = Device(0); dev.set_current()                    # doctest: +SKIP
>>> mr = PoolMemoryResource(device=0)                     # doctest: +SKIP
>>> buf = mr.allocate(1 << 20, stream=dev.default_stream) # doctest: +SKIP
>>> buf.close()                                           # doctest: +SKIP

A buffer of a resource over a pool made with ``ipc=True`` pickles to a child started with
``spawn`` (:mod:`vrampool.ipc`): it opens there as a ``Buffer`` over the same memory, owned by
the :class:`vrampool.ipc.ImportedBuffer` that maps it (closing the buffer unmaps it). cuda.core's
own buffers keep cuda.core's pickling.

On the simulated device (host memory) the resource is host-accessible and not
device-accessible, so cuda.core's ``Buffer`` works on it without a GPU or driver:

>>> import numpy as np, vrampool
>>> mr = PoolMemoryResource(vrampool.DevicePool("sim", capacity=1 << 30))
>>> buf = mr.allocate(64)
>>> np.from_dlpack(buf).shape
(64,)
>>> buf.close()
"""

from __future__ import annotations

import copyreg
from typing import Any, Dict, Optional, Tuple

try:
    from cuda.core import Buffer, MemoryResource, Stream
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "vrampool.cuda_core needs cuda-core 1.2 or newer with cuda-bindings "
        "(pip install 'vrampool[cuda]')"
    ) from e

from vrampool._native import InvalidFreeError, NativeBuffer
from vrampool.ipc import BufferDescriptor, ImportedBuffer, PoolHandle, export_buffer, open_pickled
from vrampool.pool import DevicePool, shared_pool
from vrampool.streams import stream_handle

__all__ = ["PoolMemoryResource"]


class PoolMemoryResource(MemoryResource):
    """A ``cuda.core`` memory resource over a :class:`vrampool.DevicePool`.

    ``pool``: the pool to serve from; default: the shared pool of CUDA device ``device``
    (:func:`vrampool.shared_pool`). ``allocate(size, *, stream)`` returns a cuda.core ``Buffer``
    whose ``close()`` (or collection) calls ``deallocate(ptr, size, *, stream)``: the block goes
    back to the pool, ordered after ``stream``'s work when that is not the block's own stream.
    Streams may be cuda.core ``Stream`` objects or anything else
    :func:`vrampool.streams.stream_handle` takes.

    The resource holds each block's ``DeviceBuffer`` until ``deallocate``; the buffers it hands
    out hold the resource.
    """

    def __init__(self, pool: Optional[DevicePool] = None, *, device: int = 0) -> None:
        super().__init__()
        if pool is not None and not isinstance(pool, DevicePool):
            raise TypeError(f"pool must be a vrampool.DevicePool, not {type(pool).__name__}")
        self._pool = pool if pool is not None else shared_pool(device)
        self._live: Dict[int, NativeBuffer] = {}

    @property
    def pool(self) -> DevicePool:
        return self._pool

    def allocate(self, size: int, *, stream: Any = None) -> Buffer:
        """A cuda.core ``Buffer`` of ``size`` bytes, allocated in order on ``stream`` (None:
        the legacy default stream)."""
        block = self._pool.allocate(size, stream_handle(stream))
        self._live[block.ptr] = block
        try:
            if self.is_device_accessible and isinstance(stream, Stream):
                # The buffer's own deallocation is then ordered on the allocation stream.
                return Buffer.from_handle(block.ptr, block.size, mr=self, stream=stream)
            return Buffer.from_handle(block.ptr, block.size, mr=self)
        except BaseException:
            del self._live[block.ptr]
            block.free()
            raise

    def deallocate(self, ptr: Any, size: int, *, stream: Any = None) -> None:
        """Gives back a block ``allocate`` handed out; ``stream`` is the stream that used it last.
        A pointer this resource did not hand out, or a wrong size, raises ``InvalidFreeError``
        and changes nothing."""
        address = int(ptr)
        block = self._live.get(address)
        if block is None:
            raise InvalidFreeError(f"invalid free of {address:#x}: not a live block of this resource")
        if size != block.size:
            raise InvalidFreeError(f"invalid free of {address:#x}: size {size} given, the block has {block.size}")
        handle = stream_handle(stream)  # a bad stream raises before anything changes
        if self._live.pop(address, None) is None:
            raise InvalidFreeError(f"invalid free of {address:#x}: freed meanwhile by another thread")
        block.free(handle)

    @property
    def is_device_accessible(self) -> bool:
        """True for a CUDA pool; False on the simulated device."""
        return self._pool.memory_kind == "device"

    @property
    def is_host_accessible(self) -> bool:
        """True only on the host-backed simulated device (CUDA device memory is not)."""
        return self._pool.memory_kind == "host"

    @property
    def device_id(self) -> int:
        """The CUDA device ordinal; -1 on the simulated device (no CUDA device)."""
        return self._pool.device if self.is_device_accessible else -1

    @property
    def live_blocks(self) -> int:
        """Blocks handed out and not yet deallocated."""
        return len(self._live)

    def __repr__(self) -> str:
        return f"PoolMemoryResource({self._pool!r}, live_blocks={len(self._live)})"


def _reduce_buffer(buffer: Buffer) -> Tuple[Any, ...]:
    if isinstance(buffer.owner, ImportedBuffer):
        raise TypeError(f"{buffer!r} is imported from another process: pass the exporter's buffer (or its descriptor) on instead")
    mr = buffer.memory_resource
    if not isinstance(mr, PoolMemoryResource):
        # cuda.core's own resources share their own way (and a closed buffer, which has no
        # resource any more, is refused there).
        return buffer.__reduce__()
    block = mr._live.get(int(buffer.handle))
    if block is None:
        raise InvalidFreeError(f"{buffer!r} is no live block of {mr!r}: it cannot be shared")
    descriptor = export_buffer(block)
    return (_open_as_buffer, (descriptor.handle, descriptor))


def _open_as_buffer(handle: PoolHandle, descriptor: BufferDescriptor) -> Buffer:
    imported = open_pickled(handle, descriptor)
    return Buffer.from_handle(imported.ptr, imported.size, owner=imported)


copyreg.pickle(Buffer, _reduce_buffer)
