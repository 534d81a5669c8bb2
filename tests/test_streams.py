"""Streams of every kind the pool accepts (int handles, CUstream, __cuda_stream__, torch-style
streams), what it refuses, and stream-ordered reuse driven through stream objects."""

from __future__ import annotations

import gc
from typing import Any

import pytest

import vrampool
from vrampool import DevicePool
from vrampool.streams import stream_handle
from vrampool.testing import native


class ProtocolStream:
    """cuda.core's Stream, recent CuPy and PyTorch streams: ``__cuda_stream__() -> (0, handle)``."""

    def __init__(self, handle: int, version: int = 0) -> None:
        self.handle, self.version = handle, version

    def __cuda_stream__(self) -> Any:
        return (self.version, self.handle)


class PropertyProtocolStream:
    """The protocol as a property, as early cuda.core releases had it."""

    def __init__(self, handle: int) -> None:
        self.__cuda_stream__ = (0, handle)


class TorchLikeStream:
    """torch.cuda.Stream: the handle is ``cuda_stream``."""

    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle
        self.device = "cuda:0"


class CUstream:
    """Like cuda.bindings' CUstream: ``int(s)`` is the handle; ``getPtr()`` is the address *of* it."""

    def __init__(self, handle: int) -> None:
        self._handle = handle

    def getPtr(self) -> int:  # noqa: N802 - cuda.bindings' name
        return id(self)  # deliberately not the handle

    def __int__(self) -> int:
        return self._handle


@pytest.mark.parametrize(
    "stream, handle",
    [
        (None, 0),
        (0, 0),
        (1, 0),  # CU_STREAM_LEGACY is the legacy default stream: one arena for both names
        (2, 2),  # CU_STREAM_PER_THREAD
        (0x7F0012345000, 0x7F0012345000),
        ((1 << 64) - 1, (1 << 64) - 1),
        (ProtocolStream(0x5000), 0x5000),
        (ProtocolStream(1), 0),
        (PropertyProtocolStream(0x6000), 0x6000),
        (TorchLikeStream(0x7000), 0x7000),
        (TorchLikeStream(0), 0),
        (CUstream(0x8000), 0x8000),
        (CUstream(2), 2),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, int) or v is None else str(v),
)
def test_accepted_stream_kinds(stream: Any, handle: int) -> None:
    assert stream_handle(stream) == handle
    pool = DevicePool("sim", capacity=1 << 30)
    buf = pool.allocate(4096, stream=stream)
    assert buf.stream == handle
    (block,) = native(pool).live_blocks()
    assert block[3] == handle
    pool.record_stream(buf, stream)
    pool.deallocate(buf, stream=stream)
    assert pool.stats()["allocation.all.current"] == 0


@pytest.mark.parametrize(
    "stream",
    ["default", 1.0, b"\x00", [0], object(), True, False, {"stream": 1}, vrampool.DevicePool],
    ids=lambda v: type(v).__name__,
)
def test_wrong_kinds_raise_type_error_and_change_nothing(stream: Any) -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    keep = pool.allocate(100, stream=3)
    before = pool.stats()
    for call in (
        lambda: stream_handle(stream),
        lambda: pool.allocate(100, stream=stream),
        lambda: pool.deallocate(keep, stream=stream),
        lambda: pool.record_stream(keep, stream),
    ):
        with pytest.raises(TypeError, match="__cuda_stream__") as info:
            call()
        assert type(stream).__name__ in str(info.value)
    assert pool.stats() == before
    assert not keep.freed


class CUevent(CUstream):
    """Another cuda.bindings handle type: getPtr() and int() too, but not a stream."""


def test_other_handles_are_not_streams() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    buf = pool.allocate(100)
    with pytest.raises(TypeError):
        pool.allocate(100, stream=buf)
    with pytest.raises(TypeError):
        pool.allocate(100, stream=CUevent(0x1234))
    assert pool.stats()["allocation.all.allocated"] == 1


@pytest.mark.parametrize("handle", [-1, -(1 << 70), 1 << 64, 1 << 80])
def test_out_of_range_handles_raise_value_error(handle: int) -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    for stream in (handle, ProtocolStream(handle), TorchLikeStream(handle), CUstream(handle)):
        with pytest.raises(ValueError, match="out of range"):
            pool.allocate(100, stream=stream)
    assert pool.stats()["allocation.all.allocated"] == 0


def test_malformed_protocol_answers() -> None:
    with pytest.raises(ValueError, match="version"):
        stream_handle(ProtocolStream(5, version=1))

    class NotATuple:
        def __cuda_stream__(self) -> Any:
            return 5

    class NotAnInt:
        def __cuda_stream__(self) -> Any:
            return (0, "five")

    class Raises:
        def __cuda_stream__(self) -> Any:
            raise RuntimeError("stream destroyed")

    with pytest.raises(TypeError, match=r"\(version, handle\)"):
        stream_handle(NotATuple())
    with pytest.raises(TypeError, match="int handle"):
        stream_handle(NotAnInt())
    with pytest.raises(RuntimeError, match="destroyed"):
        stream_handle(Raises())
    with pytest.raises(TypeError, match="int handle"):
        stream_handle(TorchLikeStream("abc"))  # type: ignore[arg-type]


def test_stream_objects_order_reuse() -> None:
    """A block freed after use on another stream waits for that stream, whatever object names it."""
    pool = DevicePool("sim", capacity=1 << 30)
    native(pool).sim_set_auto_complete(False)
    mine, theirs = ProtocolStream(0x1000), CUstream(0x2000)
    a = pool.allocate(4096, stream=mine)
    ptr = a.ptr
    pool.record_stream(a, TorchLikeStream(0x2000))
    pool.deallocate(a)
    b = pool.allocate(4096, stream=mine)
    assert b.ptr != ptr
    native(pool).sim_complete_stream(stream_handle(theirs))
    assert pool.allocate(4096, stream=mine).ptr == ptr

    c = pool.allocate(8192, stream=mine)
    ptr = c.ptr
    pool.deallocate(c, stream=theirs)  # last used on `theirs`
    assert pool.allocate(8192, stream=mine).ptr != ptr
    native(pool).sim_complete_stream(0x2000)
    gc.collect()
    assert pool.allocate(8192, stream=mine).ptr == ptr


def test_legacy_default_stream_names_share_one_arena() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    native(pool).sim_set_auto_complete(False)
    a = pool.allocate(4096, stream=None)
    ptr = a.ptr
    pool.deallocate(a, stream=ProtocolStream(1))  # cuda.core's LEGACY_DEFAULT_STREAM: same stream
    assert pool.allocate(4096, stream=1).ptr == ptr  # reused at once, no event wait


def test_real_cuda_bindings_and_cuda_core_streams() -> None:
    driver = pytest.importorskip("cuda.bindings.driver")
    assert stream_handle(driver.CUstream(0x1234)) == 0x1234
    assert stream_handle(driver.CUstream(0)) == 0
    runtime = pytest.importorskip("cuda.bindings.runtime")
    assert stream_handle(runtime.cudaStream_t(0x5678)) == 0x5678
    core = pytest.importorskip("cuda.core")
    assert stream_handle(core.LEGACY_DEFAULT_STREAM) == 0
    assert stream_handle(core.PER_THREAD_DEFAULT_STREAM) == 2
    with pytest.raises(TypeError):
        stream_handle(driver.CUevent(0x1234))  # an event is not a stream
