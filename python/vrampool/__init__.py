"""vrampool: a GPU memory pool with a Rust core.

>>> import vrampool
>>> pool = vrampool.DevicePool("sim", capacity=1 << 30)
>>> buf = pool.allocate(4096)
>>> buf.size
4096
>>> pool.deallocate(buf)
>>> pool.stats()["allocated_bytes.all.current"]
0

Integrations, each importing its library only when used: ``vrampool.cuda_core`` (a cuda.core
``MemoryResource``), ``vrampool.cupy`` (an allocator for ``cupy.cuda.set_allocator``),
``vrampool.numba`` (an External Memory Management plugin:
``NUMBA_CUDA_MEMORY_MANAGER=vrampool.numba``). Buffers speak ``__cuda_array_interface__`` and
DLPack, so torch, CuPy, Numba and numpy (on the simulated device) take them without a copy.
"""

from vrampool import ipc  # registers DeviceBuffer's pickling
from vrampool._native import (
    DeviceError,
    InvalidFreeError,
    InvalidSizeError,
    OutOfMemoryError,
    PausedError,
    PauseError,
    PoolClosedError,
    WrongDeviceError,
    __version__,
)
from vrampool.planned import PlannedPool
from vrampool.planner import Decision, PlanResult, decide, plan
from vrampool.pool import DeviceBuffer, DevicePool, set_shared_pool, shared_pool
from vrampool.streams import stream_handle

__all__ = [
    "Decision",
    "DeviceBuffer",
    "DeviceError",
    "DevicePool",
    "InvalidFreeError",
    "InvalidSizeError",
    "OutOfMemoryError",
    "PauseError",
    "PausedError",
    "PlanResult",
    "PlannedPool",
    "PoolClosedError",
    "WrongDeviceError",
    "__version__",
    "decide",
    "ipc",
    "plan",
    "set_shared_pool",
    "shared_pool",
    "stream_handle",
]
