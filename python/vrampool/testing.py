"""Test-only access: the extension object behind a :class:`~vrampool.DevicePool`, whose
simulated device takes controls that no program should reach through the pool itself
(``sim_write``, ``sim_read``, ``sim_fail_alloc_in``, ``sim_fail_record_in``,
``sim_set_auto_complete``, ``sim_complete_stream``, ``sim_counters``, ``live_blocks``).

>>> from vrampool import DevicePool
>>> from vrampool.testing import native
>>> pool = DevicePool("sim", capacity=1 << 20)
>>> buf = pool.allocate(4)
>>> native(pool).sim_write(buf.ptr, b"abcd"); native(pool).sim_read(buf.ptr, 4)
b'abcd'
"""

from __future__ import annotations

from vrampool._native import NativePool
from vrampool.pool import DevicePool

__all__ = ["native"]


def native(pool: DevicePool) -> NativePool:
    """The extension object of ``pool``, for tests."""
    return pool._native
