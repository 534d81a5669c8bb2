"""vrampool.cuda_core.PoolMemoryResource used through cuda.core's own Buffer, on the simulated
device: its memory is host memory, so the resource is host-accessible and not device-accessible,
and cuda.core needs neither a GPU nor a driver for it."""

from __future__ import annotations

import ctypes
import gc
from typing import Any, Iterator

import numpy as np
import pytest

pytest.importorskip("cuda.core", reason="cuda-core is not installed (pip install 'vrampool[cuda]')")

from cuda.core import Buffer, MemoryResource  # noqa: E402

import vrampool  # noqa: E402
import vrampool.pool  # noqa: E402
from vrampool import DevicePool  # noqa: E402
from vrampool.cuda_core import PoolMemoryResource  # noqa: E402
from vrampool.testing import native

MIB = 1 << 20


class Stream:
    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> Any:
        return (0, self.handle)


@pytest.fixture
def pool() -> DevicePool:
    return DevicePool("sim", capacity=1 << 30)


@pytest.fixture
def mr(pool: DevicePool) -> PoolMemoryResource:
    return PoolMemoryResource(pool)


def current(pool: DevicePool) -> int:
    return pool.stats()["allocation.all.current"]


def test_is_a_cuda_core_memory_resource(mr: PoolMemoryResource, pool: DevicePool) -> None:
    assert isinstance(mr, MemoryResource)
    assert mr.pool is pool
    assert mr.is_device_accessible is False
    assert mr.is_host_accessible is True
    assert mr.device_id == -1
    address_only = PoolMemoryResource(DevicePool("sim", capacity=1 << 30, host_backed=False))
    assert (address_only.is_device_accessible, address_only.is_host_accessible) == (False, False)


def test_buffers_are_cuda_core_buffers_over_pool_blocks(mr: PoolMemoryResource, pool: DevicePool) -> None:
    bufs = [mr.allocate(n) for n in (100, 5000, 3 * MIB)]
    for i, buf in enumerate(bufs):
        assert isinstance(buf, Buffer)
        assert buf.memory_resource is mr
        assert (buf.is_device_accessible, buf.is_host_accessible, buf.device_id) == (False, True, -1)
        ctypes.memset(int(buf.handle), i + 1, buf.size)
    assert sorted(int(b.handle) for b in bufs) == sorted(blk[0] for blk in native(pool).live_blocks())
    assert [b.size for b in bufs] == [100, 5000, 3 * MIB]
    for i, buf in enumerate(bufs):
        # cuda.core's own DLPack export of the Buffer: no overlap between live blocks.
        arr = np.from_dlpack(buf)
        assert arr.shape == (buf.size,) and (arr.view(np.uint8) == i + 1).all()
    assert mr.live_blocks == 3 and current(pool) == 3


def test_close_and_collection_deallocate_exactly_once(mr: PoolMemoryResource, pool: DevicePool) -> None:
    buf = mr.allocate(4096)
    buf.close()
    assert buf.is_closed and current(pool) == 0 and mr.live_blocks == 0
    buf.close()  # cuda.core makes a second close a no-op
    for _ in range(50):
        mr.allocate(1000)  # dropped at once
    gc.collect()
    stats = pool.stats()
    assert stats["allocation.all.current"] == 0
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"] == 51


def test_a_dlpack_view_of_the_buffer_keeps_it(mr: PoolMemoryResource, pool: DevicePool) -> None:
    arr = np.from_dlpack(mr.allocate(1000))
    gc.collect()
    assert current(pool) == 1
    arr[:] = 1
    del arr
    gc.collect()
    assert current(pool) == 0


def test_streams_of_every_kind(mr: PoolMemoryResource, pool: DevicePool) -> None:
    from cuda.core import LEGACY_DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM

    cases = [(None, 0), (LEGACY_DEFAULT_STREAM, 0), (PER_THREAD_DEFAULT_STREAM, 2), (Stream(0x9000), 0x9000), (0x9100, 0x9100)]
    for stream, handle in cases:
        buf = mr.allocate(2048, stream=stream)
        (block,) = [b for b in native(pool).live_blocks() if b[0] == int(buf.handle)]
        assert block[3] == handle
        buf.close()
    assert current(pool) == 0
    with pytest.raises(TypeError, match="__cuda_stream__"):
        mr.allocate(100, stream="default")
    assert pool.stats()["allocation.all.allocated"] == len(cases)


def test_deallocate_on_another_stream_orders_reuse(mr: PoolMemoryResource, pool: DevicePool) -> None:
    native(pool).sim_set_auto_complete(False)
    buf = mr.allocate(4096, stream=Stream(0x1000))
    ptr = int(buf.handle)
    mr.deallocate(ptr, 4096, stream=Stream(0x2000))  # as Buffer.close(stream) would
    assert mr.live_blocks == 0
    assert int(mr.allocate(4096, stream=Stream(0x1000)).handle) != ptr
    native(pool).sim_complete_stream(0x2000)
    gc.collect()
    assert int(mr.allocate(4096, stream=Stream(0x1000)).handle) == ptr


def test_bad_deallocations_raise_and_change_nothing(mr: PoolMemoryResource, pool: DevicePool) -> None:
    buf = mr.allocate(4096)
    ptr = int(buf.handle)
    before = pool.stats()
    with pytest.raises(vrampool.InvalidFreeError, match="not a live block"):
        mr.deallocate(0xDEAD000, 4096)
    with pytest.raises(vrampool.InvalidFreeError, match="size"):
        mr.deallocate(ptr, 4095)
    with pytest.raises(TypeError):
        mr.deallocate(ptr, 4096, stream=1.5)
    other = PoolMemoryResource(DevicePool("sim", capacity=1 << 30))
    with pytest.raises(vrampool.InvalidFreeError):
        other.deallocate(ptr, 4096)  # a block of another resource
    assert pool.stats() == before and mr.live_blocks == 1
    mr.deallocate(ptr, 4096)
    with pytest.raises(vrampool.InvalidFreeError):
        mr.deallocate(ptr, 4096)  # double free
    assert current(pool) == 0
    del buf  # its close now finds the block gone: cuda.core reports it and carries on
    gc.collect()
    assert pool.stats()["allocation.all.freed"] == 1


def test_bad_sizes_and_closed_pools(mr: PoolMemoryResource, pool: DevicePool) -> None:
    for size in (0, -1, 1 << 70):
        with pytest.raises((ValueError, OverflowError)):
            mr.allocate(size)
    with pytest.raises(vrampool.OutOfMemoryError):
        mr.allocate(2 << 30)
    assert mr.live_blocks == 0 and pool.stats()["allocation.all.allocated"] == 0
    pool.close()
    with pytest.raises(vrampool.PoolClosedError):
        mr.allocate(100)
    assert mr.live_blocks == 0


def test_the_default_pool_is_the_shared_one() -> None:
    shared = DevicePool("sim", capacity=1 << 30)
    vrampool.pool.set_shared_pool(5, shared)
    try:
        mr = PoolMemoryResource(device=5)
        assert mr.pool is shared
        buf = mr.allocate(10)
        assert current(shared) == 1
        buf.close()
    finally:
        vrampool.pool.set_shared_pool(5, None)
    with pytest.raises(TypeError):
        PoolMemoryResource("sim")  # type: ignore[arg-type]


def test_threads_share_a_resource(mr: PoolMemoryResource, pool: DevicePool, run_in_threads) -> None:
    def work(seed: int) -> None:
        for i in range(200):
            buf = mr.allocate(512 + (seed * 131 + i * 977) % 70_000)
            ctypes.memset(int(buf.handle), seed, 8)
            if i % 2:
                buf.close()

    run_in_threads(work, 6)
    gc.collect()
    assert current(pool) == 0 and mr.live_blocks == 0


@pytest.fixture(autouse=True)
def _no_leaked_shared_pools() -> Iterator[None]:
    yield
    assert 5 not in vrampool.pool._shared
