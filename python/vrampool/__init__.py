"""vrampool: a GPU memory pool with a Rust core.

>>> import vrampool
>>> pool = vrampool.DevicePool("sim", capacity=1 << 30)
>>> buf = pool.allocate(4096)
>>> buf.size
4096
>>> pool.deallocate(buf)
>>> pool.stats()["allocated_bytes.all.current"]
0
"""

from vrampool._native import (
    DeviceError,
    InvalidFreeError,
    InvalidSizeError,
    OutOfMemoryError,
    PoolClosedError,
    WrongDeviceError,
    __version__,
)
from vrampool.pool import DeviceBuffer, DevicePool

__all__ = [
    "DeviceBuffer",
    "DeviceError",
    "DevicePool",
    "InvalidFreeError",
    "InvalidSizeError",
    "OutOfMemoryError",
    "PoolClosedError",
    "WrongDeviceError",
    "__version__",
]
