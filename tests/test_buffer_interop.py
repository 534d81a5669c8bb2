"""DeviceBuffer as other libraries see it, on the host-backed simulated device: DLPack (numpy
takes it zero-copy), __cuda_array_interface__, the buffer's life while consumers hold it, bad
input, memory_summary, and the CuPy / Numba glue driven through stand-in modules."""

from __future__ import annotations

import ctypes
import doctest
import gc
import importlib
import random
import sys
import threading
import types
from collections import namedtuple
from typing import Any, Dict, List

import numpy as np
import pytest

import vrampool
import vrampool.pool
import vrampool.streams
import vrampool.summary
from vrampool import DevicePool
from vrampool.testing import native

MIB = 1 << 20
def counts(pool: DevicePool) -> Dict[str, int]:
    s = pool.stats()
    return {k: s[f"allocation.all.{k}"] for k in ("current", "allocated", "freed")}


# ---- DLPack structures (dlpack.h), to read capsules field by field ----


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))),
]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DLManagedTensorVersioned._fields_ = [
    ("major", ctypes.c_uint32),
    ("minor", ctypes.c_uint32),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.restype = ctypes.c_int
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_USED_LEGACY = ctypes.c_char_p(b"used_dltensor")  # the capsule keeps the pointer: keep the bytes
_USED_VERSIONED = ctypes.c_char_p(b"used_dltensor_versioned")


def managed_tensor(capsule: Any, versioned: bool) -> Any:
    name = b"dltensor_versioned" if versioned else b"dltensor"
    kind = DLManagedTensorVersioned if versioned else DLManagedTensor
    return kind.from_address(_get_pointer(capsule, name))


def check_tensor(t: DLTensor, buf: vrampool.DeviceBuffer) -> None:
    assert t.data == buf.ptr
    assert (t.device.device_type, t.device.device_id) == (1, 0)  # kDLCPU: host-backed simulation
    assert t.ndim == 1
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (1, 8, 1)  # kDLUInt, 8 bits
    assert t.shape[0] == buf.size
    assert t.strides[0] == 1
    assert t.byte_offset == 0


# ---- DLPack ----


def test_live_buffers_never_overlap_seen_through_numpy(pool: DevicePool) -> None:
    rng = random.Random(7)
    live: List[Any] = []
    for step in range(300):
        if live and rng.random() < 0.4:
            buf, arr, value = live.pop(rng.randrange(len(live)))
            assert (arr == value).all(), "another buffer wrote into this one"
            pool.deallocate(buf)
            continue
        size = rng.choice([1, 100, 512, 4000, 70_000, 1 * MIB, 5 * MIB])
        buf = pool.allocate(size)
        arr = np.from_dlpack(buf)
        assert arr.ctypes.data == buf.ptr and arr.shape == (size,)
        value = step % 251 + 1
        arr[:] = value
        live.append((buf, arr, value))
    for buf, arr, value in live:
        assert (arr == value).all()
        assert ctypes.string_at(buf.ptr, 1) == bytes([value])
    # The views kept every block alive through deallocate; dropping them frees the last ones.
    del live, buf, arr
    gc.collect()
    assert counts(pool)["current"] == 0


def test_dlpack_is_zero_copy_both_ways() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    buf = pool.allocate(4096)
    arr = np.from_dlpack(buf)
    assert arr.dtype == np.uint8 and arr.shape == (4096,) and arr.flags.writeable
    assert arr.ctypes.data == buf.ptr
    arr[10:20] = 9
    assert native(pool).sim_read(buf.ptr + 10, 10) == b"\x09" * 10
    native(pool).sim_write(buf.ptr, b"abc")
    assert bytes(arr[:3]) == b"abc"
    assert buf.__dlpack_device__() == (1, 0)


@pytest.mark.parametrize("versioned", [False, True])
def test_dlpack_capsule_fields(versioned: bool) -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    buf = pool.allocate(1000, stream=7)
    capsule = buf.__dlpack__(max_version=(1, 0)) if versioned else buf.__dlpack__()
    assert buf.dlpack_exports == 1
    mt = managed_tensor(capsule, versioned)
    check_tensor(mt.dl_tensor, buf)
    if versioned:
        assert (mt.major, mt.minor) == (1, 0)
        assert mt.flags == 0  # writable, not a copy
    # A consumer takes it: renames the capsule, later calls the deleter exactly once.
    assert _set_name(capsule, _USED_VERSIONED if versioned else _USED_LEGACY) == 0
    del capsule  # renamed: the capsule's destructor must leave the tensor alone
    gc.collect()
    assert buf.dlpack_exports == 1
    mt.deleter(ctypes.pointer(mt))
    assert buf.dlpack_exports == 0
    assert counts(pool)["current"] == 1  # the buffer itself still holds the block


def test_old_max_version_gets_the_unversioned_capsule() -> None:
    buf = DevicePool("sim", capacity=1 << 30).allocate(64)
    assert "dltensor\"" in repr(buf.__dlpack__(max_version=(0, 8)))
    assert "dltensor_versioned" in repr(buf.__dlpack__(max_version=(1, 3)))
    gc.collect()
    assert buf.dlpack_exports == 0


def test_unconsumed_capsules_release_the_buffer() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    buf = pool.allocate(100)
    caps = [buf.__dlpack__() for _ in range(3)] + [buf.__dlpack__(max_version=(1, 0))]
    assert buf.dlpack_exports == 4
    del caps
    assert buf.dlpack_exports == 0
    del buf
    gc.collect()
    assert counts(pool) == {"current": 0, "allocated": 1, "freed": 1}


def test_a_dlpack_consumer_keeps_the_memory_alive() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    arr = np.from_dlpack(pool.allocate(3 * MIB))  # the buffer object itself is dropped at once
    gc.collect()
    assert counts(pool)["current"] == 1
    arr[:] = 5
    assert int(arr.sum()) == 5 * 3 * MIB
    del arr
    gc.collect()
    assert counts(pool) == {"current": 0, "allocated": 1, "freed": 1}


def test_close_while_exported_waits_for_the_last_consumer() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    buf = pool.allocate(5000)
    a, b = np.from_dlpack(buf), np.from_dlpack(buf)
    buf.close()
    assert buf.freed and buf.dlpack_exports == 2
    assert counts(pool)["current"] == 1  # not yet: a and b still use it
    a[:] = 1
    with pytest.raises(BufferError, match="freed"):
        np.from_dlpack(buf)  # no new consumers once a free was asked for
    with pytest.raises(vrampool.InvalidFreeError):
        pool.deallocate(buf)
    buf.close()  # harmless
    del a
    gc.collect()
    assert counts(pool)["current"] == 1
    del b
    gc.collect()
    assert buf.dlpack_exports == 0
    assert counts(pool) == {"current": 0, "allocated": 1, "freed": 1}


def test_context_manager_frees_once_and_defers_for_consumers() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    with pool.allocate(100) as buf:
        assert not buf.freed
    assert buf.freed and counts(pool) == {"current": 0, "allocated": 1, "freed": 1}
    buf.close()
    del buf
    gc.collect()
    assert counts(pool)["freed"] == 1

    with pool.allocate(100) as buf:
        arr = np.from_dlpack(buf)
    assert counts(pool)["current"] == 1
    del arr
    assert counts(pool)["current"] == 0

    with pytest.raises(KeyError):
        with pool.allocate(100) as buf:
            raise KeyError("the body failed")
    assert buf.freed and counts(pool)["current"] == 0


def test_deferred_free_keeps_its_stream() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    native(pool).sim_set_auto_complete(False)
    buf = pool.allocate(4096, stream=1 << 20)
    ptr = buf.ptr
    arr = np.from_dlpack(buf)
    pool.deallocate(buf, stream=2 << 20)  # last used on another stream; deferred for `arr`
    del arr
    gc.collect()
    assert counts(pool)["current"] == 0
    assert pool.allocate(4096, stream=1 << 20).ptr != ptr  # stream 2<<20 may still use it
    native(pool).sim_complete_stream(2 << 20)
    assert pool.allocate(4096, stream=1 << 20).ptr == ptr


def test_dlpack_refusals_change_nothing() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    buf = pool.allocate(256)
    before = pool.stats()
    with pytest.raises(BufferError, match="copy"):
        buf.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="device"):
        buf.__dlpack__(dl_device=(2, 0))
    with pytest.raises(ValueError, match="ambiguous"):
        buf.__dlpack__(stream=0)
    with pytest.raises(ValueError):
        buf.__dlpack__(stream=-7)
    with pytest.raises(TypeError):
        buf.__dlpack__(stream="default")
    assert buf.dlpack_exports == 0 and pool.stats() == before
    # Accepted: no ordering (-1), the default streams, a stream handle, the same device, copy=False.
    for kwargs in ({"stream": -1}, {"stream": 1}, {"stream": 2}, {"stream": 0x7000}, {"dl_device": (1, 0), "copy": False}):
        assert buf.__dlpack__(**kwargs) is not None
    gc.collect()
    assert buf.dlpack_exports == 0
    buf.close()
    with pytest.raises(BufferError, match="freed"):
        buf.__dlpack__()
    with pytest.raises(BufferError, match="freed"):
        buf.__cuda_array_interface__  # noqa: B018


def test_address_only_memory_is_not_exported() -> None:
    pool = DevicePool("sim", capacity=1 << 30, host_backed=False)
    assert pool.memory_kind == "none"
    buf = pool.allocate(100)
    with pytest.raises(BufferError, match="address-only"):
        np.from_dlpack(buf)
    assert buf.dlpack_exports == 0
    assert buf.__cuda_array_interface__["data"] == (buf.ptr, False)


# ---- __cuda_array_interface__ ----


@pytest.mark.parametrize(
    "stream, reported",
    [(None, 1), (0, 1), (1, 1), (2, 2), (0x7F001000, 0x7F001000)],
    ids=["none", "legacy-0", "legacy-1", "per-thread", "handle"],
)
def test_cuda_array_interface_fields(stream: Any, reported: int) -> None:
    buf = DevicePool("sim", capacity=1 << 30).allocate(12345, stream=stream)
    cai = buf.__cuda_array_interface__
    assert set(cai) == {"shape", "typestr", "data", "strides", "version", "stream"}
    assert cai["version"] == 3
    assert cai["shape"] == (12345,)
    assert cai["typestr"] == "|u1"
    assert cai["data"] == (buf.ptr, False)
    assert cai["strides"] is None
    assert cai["stream"] == reported  # never 0: v3 forbids it; 1 is the legacy default stream
    # The pointer is the memory: a view made from the interface sees writes through the buffer.
    view = (ctypes.c_uint8 * 12345).from_address(cai["data"][0])
    ctypes.memset(buf.ptr, 0x5A, 12345)
    assert view[0] == view[12344] == 0x5A


def test_buffer_attributes_and_repr() -> None:
    pool = DevicePool("sim", capacity=1 << 30, ordinal=3)
    buf = pool.allocate(777, stream=9)
    assert (buf.size, buf.stream, buf.device, buf.freed) == (777, 9, 3, False)
    assert isinstance(buf, vrampool.DeviceBuffer)
    assert repr(buf) == f"DeviceBuffer(ptr={buf.ptr:#x}, size=777, device=3, stream=9)"
    assert buf.__dlpack_device__() == (1, 0)  # host memory whatever the simulated ordinal


# ---- freed exactly once ----


def test_finalizers_free_exactly_once_under_many_threads(run_in_threads) -> None:
    pool = DevicePool("sim", capacity=4 << 30)
    handoff: List[Any] = []
    lock = threading.Lock()
    iterations = 400

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(iterations):
            buf = pool.allocate(rng.choice([64, 3000, 100_000, 3 * MIB]))
            way = rng.randrange(6)
            if way == 0:
                buf.close()
            elif way == 1:
                arr = np.from_dlpack(buf)
                buf.close()
                arr[:1] = seed  # still valid: the free waits for arr
                del arr
            elif way == 2:
                with buf:
                    np.from_dlpack(buf)[-1:] = seed
            elif way == 3:
                with lock:
                    handoff.append(buf)  # another thread frees it, or nobody
                if rng.random() < 0.5:
                    with lock:
                        other = handoff.pop(0) if handoff else None
                    if other is not None:
                        other.close() if rng.random() < 0.5 else np.from_dlpack(other)
            elif way == 4:
                pool.deallocate(buf)
                try:
                    pool.deallocate(buf)
                except vrampool.InvalidFreeError:
                    pass
                else:
                    raise AssertionError("a double free went through")
            del buf  # way 5: collected

    run_in_threads(work, 8)
    handoff.clear()
    gc.collect()
    assert counts(pool) == {"current": 0, "allocated": 8 * iterations, "freed": 8 * iterations}
    assert pool.stats()["allocated_bytes.all.current"] == 0


# ---- bad input ----


def test_buffers_of_another_pool_or_device_are_refused() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    keep = pool.allocate(4096)
    before = pool.stats()
    other_device = DevicePool("sim", capacity=1 << 30, ordinal=1)
    foreign = other_device.allocate(4096)
    with pytest.raises(vrampool.WrongDeviceError, match="device 1"):
        pool.deallocate(foreign)
    with pytest.raises(vrampool.WrongDeviceError):
        pool.record_stream(foreign, 3)
    same_device = DevicePool("sim", capacity=1 << 30)
    with pytest.raises(ValueError, match="another pool"):
        pool.deallocate(same_device.allocate(64))
    with pytest.raises(TypeError):
        pool.record_stream(keep.ptr, 3)  # type: ignore[arg-type]
    assert pool.stats() == before
    assert not foreign.freed and not keep.freed
    pool.deallocate(keep)
    with pytest.raises(vrampool.InvalidFreeError):
        pool.record_stream(keep, 3)


@pytest.mark.parametrize("size", [0, -1, -(1 << 70), 1 << 64, 1 << 100, 2.5, "12", None, True])
def test_bad_sizes_raise_and_change_nothing(size: Any) -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    keep = pool.allocate(100)
    before = pool.stats()
    with pytest.raises((TypeError, ValueError)):
        pool.allocate(size)
    assert pool.stats() == before
    assert not keep.freed


def test_absurd_sizes_within_u64_are_invalid_sizes() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    for size in ((1 << 64) - 1, (1 << 63) + 5, (1 << 47) + 1):
        with pytest.raises(vrampool.InvalidSizeError, match="128 TiB"):
            pool.allocate(size)
    with pytest.raises(MemoryError):  # past the device, not past any block: out of memory
        pool.allocate(1 << 40)
    assert pool.stats()["allocation.all.allocated"] == 0
    assert pool.stats()["reserved_bytes.all.current"] == 0


def test_a_closed_pool_refuses_everything_and_stays_readable() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    live = pool.allocate(1000)
    freed = pool.allocate(2000)
    pool.deallocate(freed)
    leaks = pool.close()
    assert [b["requested"] for b in leaks] == [1000]
    stats = pool.stats()
    for call in (lambda: pool.allocate(10), pool.trim, lambda: pool.deallocate(live), lambda: pool.record_stream(live, 1)):
        with pytest.raises(vrampool.PoolClosedError):
            call()
    assert pool.stats()["allocation.all.current"] == stats["allocation.all.current"] == 1
    assert not live.freed  # refused: the buffer is as it was
    with pytest.raises(vrampool.PoolClosedError):
        live.close()
    assert "closed" in repr(pool)
    assert pool.close() == []  # closing twice is harmless
    assert "Allocated memory" in pool.memory_summary()


# ---- memory_summary ----


def test_memory_summary_shows_the_figures() -> None:
    pool = DevicePool("sim", capacity=256 * MIB, strategy="hybrid")
    bufs = [pool.allocate(n) for n in (1000, 3000, 5 * MIB, 70 * MIB)]
    pool.deallocate(bufs.pop(0))
    with pytest.raises(MemoryError):
        pool.allocate(250 * MIB)
    text = pool.memory_summary()
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1, "ragged table"
    assert "hybrid pool on sim:0" in lines[1]
    s = pool.stats()
    fmt = vrampool.summary.format_size
    row = next(line for line in lines if line.startswith("| Allocated memory"))
    assert [c.strip() for c in row.strip("|").split("|")][1:] == [
        fmt(s[f"allocated_bytes.all.{k}"]) for k in ("current", "peak", "allocated", "freed")
    ]
    row = next(line for line in lines if line.startswith("| Allocations"))
    assert [c.strip() for c in row.strip("|").split("|")][1:] == ["3", "4", "4", "1"]
    for label in ("Active memory", "Requested memory", "Reserved memory", "Segments", "Fragmentation", "largest free block"):
        assert label in text
    assert f"OOMs: {s['num_ooms']}" in text and s["num_ooms"] == 1
    assert f"alloc retries: {s['num_alloc_retries']}" in text
    tiers = vrampool.summary.tier_counts(pool.snapshot()["segments"])
    assert sum(t["active_blocks"] for t in tiers.values()) == 3
    assert sum(t["reserved_bytes"] for t in tiers.values()) == s["reserved_bytes.all.current"]
    assert sum(t["segments"] for t in tiers.values()) == s["segment.all.current"]
    for name, t in tiers.items():
        row = next(line for line in lines if line.startswith(f"| {name} "))
        assert f"| {t['segments']:>11,} |" in row


def test_memory_summary_of_an_empty_pool() -> None:
    text = DevicePool("sim", capacity=1 << 30).memory_summary()
    assert "(no segments)" in text and "Allocated memory" in text


def test_docstring_examples_run() -> None:
    modules = [vrampool, vrampool.pool, vrampool.streams, vrampool.summary]
    try:
        modules.append(importlib.import_module("vrampool.cuda_core"))
    except ImportError:
        pass  # cuda-core is not installed
    for module in modules:
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, module.__name__
        assert result.attempted > 0, module.__name__


# ---- CuPy and Numba glue, through stand-ins for the libraries (the real ones need a GPU) ----


@pytest.fixture
def sim_shared_pool() -> Any:
    pool = DevicePool("sim", capacity=1 << 30)
    vrampool.pool.set_shared_pool(0, pool)
    yield pool
    vrampool.pool.set_shared_pool(0, None)


def fake_cupy(stream_ptr: int = 0, device: int = 0) -> types.ModuleType:
    class UnownedMemory:
        def __init__(self, ptr: int, size: int, owner: Any, device_id: int) -> None:
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem: UnownedMemory, offset: int) -> None:
            self.mem, self.ptr = mem, mem.ptr + offset

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        UnownedMemory=UnownedMemory,
        MemoryPointer=MemoryPointer,
        runtime=types.SimpleNamespace(getDevice=lambda: device),
        get_current_stream=lambda: types.SimpleNamespace(ptr=stream_ptr),
        set_allocator=lambda f=None: setattr(cupy, "allocator", f),
    )
    return cupy


def test_cupy_allocator_glue(monkeypatch: pytest.MonkeyPatch, sim_shared_pool: DevicePool) -> None:
    import vrampool.cupy

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(stream_ptr=0x4000))
    mp = vrampool.cupy.malloc(1000)
    buf = mp.mem.owner
    assert isinstance(buf, vrampool.DeviceBuffer) and buf.belongs_to(native(sim_shared_pool))
    assert (mp.ptr, mp.mem.size, mp.mem.device_id, buf.stream) == (buf.ptr, 1000, 0, 0x4000)
    ctypes.memset(mp.ptr, 1, 1000)
    assert counts(sim_shared_pool)["current"] == 1
    del mp, buf  # CuPy drops the memory: the owner goes, and the block with it
    gc.collect()
    assert counts(sim_shared_pool) == {"current": 0, "allocated": 1, "freed": 1}
    empty = vrampool.cupy.malloc(0)
    assert (empty.ptr, empty.mem.size) == (0, 0) and counts(sim_shared_pool)["allocated"] == 1

    own = DevicePool("sim", capacity=1 << 30, strategy="best_fit")
    vrampool.cupy.install(own)
    mp = sys.modules["cupy"].allocator(5000)  # type: ignore[attr-defined]
    assert mp.mem.owner.belongs_to(native(own)) and counts(own)["current"] == 1
    with pytest.raises(TypeError):
        vrampool.cupy.allocator("pool")  # type: ignore[arg-type]
    big = vrampool.cupy.allocator(own)(600 * MIB)
    for nbytes in (600 * MIB, 2 << 30):  # more than is free; more than the pool may ever hold
        with pytest.raises(MemoryError):  # what CuPy's users catch
            vrampool.cupy.allocator(own)(nbytes)
    assert counts(own)["current"] == 2
    del big


def fake_numba(monkeypatch: pytest.MonkeyPatch) -> Any:
    MemoryInfo = namedtuple("MemoryInfo", "free total")

    class HostOnlyCUDAMemoryManager:
        def __init__(self, context: Any) -> None:
            self.context = context
            self.resets = 0

        def reset(self) -> None:
            self.resets += 1

    class MemoryPointer:
        def __init__(self, context: Any, pointer: Any, size: int, owner: Any = None, finalizer: Any = None) -> None:
            self.context, self.device_pointer, self.size, self.finalizer = context, pointer, size, finalizer

    driver = types.ModuleType("numba.cuda.cudadrv.driver")
    driver.USE_NV_BINDING = False  # type: ignore[attr-defined]
    cudadrv = types.ModuleType("numba.cuda.cudadrv")
    cudadrv.driver = driver  # type: ignore[attr-defined]
    cuda = types.ModuleType("numba.cuda")
    cuda.HostOnlyCUDAMemoryManager = HostOnlyCUDAMemoryManager  # type: ignore[attr-defined]
    cuda.MemoryPointer = MemoryPointer  # type: ignore[attr-defined]
    cuda.MemoryInfo = MemoryInfo  # type: ignore[attr-defined]
    cuda.cudadrv = cudadrv  # type: ignore[attr-defined]
    cuda.set_memory_manager = lambda cls: setattr(cuda, "manager", cls)  # type: ignore[attr-defined]
    numba = types.ModuleType("numba")
    numba.cuda = cuda  # type: ignore[attr-defined]
    for name, module in [("numba", numba), ("numba.cuda", cuda), ("numba.cuda.cudadrv", cudadrv), ("numba.cuda.cudadrv.driver", driver)]:
        monkeypatch.setitem(sys.modules, name, module)
    return cuda


class RawDevice:
    """cuda.bindings' ``CUdevice``: no ``id``, ``int()`` is the ordinal."""

    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal

    def __int__(self) -> int:
        return self.ordinal


def test_numba_plugin_glue(monkeypatch: pytest.MonkeyPatch, sim_shared_pool: DevicePool) -> None:
    import vrampool.numba

    monkeypatch.setattr(vrampool.numba, "_class", None)  # built from the stand-in, then forgotten
    cuda = fake_numba(monkeypatch)
    cls = vrampool.numba._numba_memory_manager  # what NUMBA_CUDA_MEMORY_MANAGER=vrampool.numba reads
    assert cls is vrampool.numba.VrampoolMemoryManager
    assert issubclass(cls, cuda.HostOnlyCUDAMemoryManager)
    synced: List[int] = []
    context = types.SimpleNamespace(device=types.SimpleNamespace(id=0), create_stream=lambda: 77, synchronize=lambda: synced.append(1))
    manager = cls(context=context)
    manager.initialize()
    assert manager.interface_version == 1
    native(sim_shared_pool).sim_set_auto_complete(False)  # the simulated streams' work stays pending
    mp = manager.memalloc(3000)
    assert mp.size == 3000 and mp.context is context
    (block,) = native(sim_shared_pool).live_blocks()
    assert mp.device_pointer.value == block[0] and block[3] == 77, "on the manager's own stream"
    ctypes.memset(mp.device_pointer.value, 7, 3000)
    mp.finalizer()
    mp.finalizer()  # Numba calls it once; a second call still frees nothing twice
    assert counts(sim_shared_pool) == {"current": 0, "allocated": 1, "freed": 1}
    # The free names no stream: the block waits for the legacy default stream (which waits for
    # every blocking stream) before the next array may have it.
    second = manager.memalloc(3000)
    assert second.device_pointer.value != mp.device_pointer.value, "reused before the streams passed the free"
    second.finalizer()
    native(sim_shared_pool).sim_complete_stream(0)
    third = manager.memalloc(3000)
    assert third.device_pointer.value in (mp.device_pointer.value, second.device_pointer.value)
    third.finalizer()
    native(sim_shared_pool).sim_complete_stream(0)
    assert counts(sim_shared_pool) == {"current": 0, "allocated": 3, "freed": 3} and not synced
    native(sim_shared_pool).sim_set_auto_complete(True)
    assert manager.memalloc(0).device_pointer.value == 0
    info = manager.get_memory_info()
    assert 0 < info.free <= info.total == 1 << 30
    with pytest.raises(ValueError, match="ipc_handles:legacy"):
        manager.get_ipc_handle(mp)
    with pytest.raises(MemoryError):
        manager.memalloc(2 << 30)
    assert counts(sim_shared_pool)["current"] == 0
    manager.reset()
    assert manager.resets == 1 and sim_shared_pool.stats()["reserved_bytes.all.current"] == 0
    # A context wrapped from a third party's names its device by the raw CUdevice (int() of it).
    raw = cls(context=types.SimpleNamespace(device=RawDevice(0)))
    raw.initialize()
    assert raw.pool is sim_shared_pool
    with pytest.raises(AttributeError):
        vrampool.numba.no_such_thing  # noqa: B018
    vrampool.numba.install()
    assert cuda.manager is cls
