"""DeviceBuffer on a CUDA device: written and read through the CUDA driver, consumed zero-copy by
torch, CuPy and Numba (each sees what the others wrote), the CuPy allocator, the Numba EMM
plugin and the cuda.core resource. Marked `cuda`; skipped without a CUDA device (a failure
instead with VRAMPOOL_REQUIRE_GPU=1, as scripts/gpu-check.sh sets it on a GPU machine), and each
library's tests skip where it is not installed. scripts/test.sh runs it under the emulated CUDA
driver, where the Numba and cuda.core parts run and torch's and CuPy's skip (they need the CUDA
runtime, which the emulator cannot host). Needs no numpy."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
from typing import Any, Callable, Dict

import pytest

import vrampool
from vrampool import DevicePool
from vrampool.testing import native

pytestmark = pytest.mark.cuda

MIB = 1 << 20


def _probe() -> Any:
    try:
        pool = DevicePool(0)
    except vrampool.DeviceError as e:
        return e
    pool.close()
    return None


_NO_DEVICE = _probe()
if _NO_DEVICE is not None:
    if os.environ.get("VRAMPOOL_REQUIRE_GPU") == "1":
        raise RuntimeError(f"VRAMPOOL_REQUIRE_GPU=1 but no CUDA device could be used: {_NO_DEVICE}")
    pytest.skip(f"no CUDA device: {_NO_DEVICE}", allow_module_level=True)


class Driver:
    """The few driver calls the tests need to write and read device memory themselves."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check(self.lib.cuInit(0))
        device, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check(self.lib.cuDeviceGet(ctypes.byref(device), 0))
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device))
        self.ctx = ctx

    def check(self, rc: int) -> None:
        assert rc == 0, f"CUDA driver error {rc}"

    def current(self) -> None:
        self.check(self.lib.cuCtxSetCurrent(self.ctx))

    def memset(self, ptr: int, value: int, n: int) -> None:
        self.current()
        self.check(self.lib.cuMemsetD8_v2(ctypes.c_uint64(ptr), ctypes.c_ubyte(value), ctypes.c_size_t(n)))
        self.check(self.lib.cuCtxSynchronize())

    def read(self, ptr: int, n: int) -> bytes:
        self.current()
        self.check(self.lib.cuCtxSynchronize())
        host = ctypes.create_string_buffer(n)
        self.check(self.lib.cuMemcpyDtoH_v2(host, ctypes.c_uint64(ptr), ctypes.c_size_t(n)))
        return host.raw


@pytest.fixture(scope="module")
def driver() -> Driver:
    return Driver()


@pytest.fixture
def pool(device_pool: DevicePool) -> DevicePool:
    return device_pool


def test_gpu_buffers_hold_their_own_bytes(pool: DevicePool, driver: Driver) -> None:
    bufs = [pool.allocate(n) for n in (1, 700, 4096, 3 * MIB, 70 * MIB)]
    for i, buf in enumerate(bufs):
        driver.memset(buf.ptr, i + 1, buf.size)
    for i, buf in enumerate(bufs):
        assert driver.read(buf.ptr, buf.size) == bytes([i + 1]) * buf.size
    for buf in bufs:
        pool.deallocate(buf)
    assert pool.stats()["allocation.all.current"] == 0
    assert pool.memory_kind == "device" and "cuda:0" in pool.memory_summary()


def test_gpu_pause_gives_the_pages_back_and_resume_restores_the_bytes(pool: DevicePool, driver: Driver) -> None:
    """A tag's memory leaves the device (the driver's free memory rises by it) and comes back at
    the same addresses with its bytes; untagged memory stays as it was throughout."""
    plain = pool.allocate(3 * MIB)
    driver.memset(plain.ptr, 0x33, plain.size)
    with pool.region("kv"):
        kv = [pool.allocate(n) for n in (700, 5 * MIB, 64 * MIB)]
    for i, buf in enumerate(kv):
        driver.memset(buf.ptr, 0x40 + i, buf.size)
    (tag,) = pool.tags()
    free = pool.mem_info()[0]
    assert pool.pause("kv", backup=True).released == tag.reserved
    assert pool.mem_info()[0] - free >= tag.reserved * 99 // 100
    assert driver.read(plain.ptr, plain.size) == b"\x33" * plain.size
    assert pool.resume("kv") == tag.reserved
    for i, buf in enumerate(kv):
        assert driver.read(buf.ptr, buf.size) == bytes([0x40 + i]) * buf.size
    for buf in [plain, *kv]:
        pool.deallocate(buf)


def test_gpu_interfaces_describe_device_memory(pool: DevicePool) -> None:
    buf = pool.allocate(1000)
    assert buf.__dlpack_device__() == (2, 0)  # kDLCUDA
    cai = buf.__cuda_array_interface__
    assert (cai["version"], cai["shape"], cai["typestr"], cai["data"], cai["stream"]) == (3, (1000,), "|u1", (buf.ptr, False), 1)
    for versioned in (False, True):
        capsule = buf.__dlpack__(stream=1, max_version=(1, 0) if versioned else None)
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        managed = get(capsule, b"dltensor_versioned" if versioned else b"dltensor")
        tensor = managed + (32 if versioned else 0)  # version, ctx, deleter, flags come first
        assert ctypes.c_uint64.from_address(tensor).value == buf.ptr
        assert (ctypes.c_int32.from_address(tensor + 8).value, ctypes.c_int32.from_address(tensor + 12).value) == (2, 0)
        del capsule
    assert buf.dlpack_exports == 0


def _torch_cuda() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        # Under the emulated driver: torch reaches the driver through the CUDA runtime, which
        # needs the driver's private export tables (cuGetExportTable), which it does not have.
        pytest.skip(f"torch {torch.__version__} cannot use CUDA here (no runtime over this driver)")
    return torch


def test_gpu_dlpack_orders_the_consumer_stream(pool: DevicePool) -> None:
    torch = _torch_cuda()
    side = torch.cuda.Stream()
    buf = pool.allocate(4 * MIB, stream=side)
    assert buf.stream == side.cuda_stream
    with torch.cuda.stream(side):
        torch.from_dlpack(buf).fill_(7)  # queued on `side`
    # torch passes its current (default) stream: that stream now waits for `side`'s fill.
    seen = torch.from_dlpack(buf)
    assert int(seen.sum().item()) == 7 * 4 * MIB


class Consumer:
    """One library's zero-copy view of a buffer: how to make it, where it points, its bytes."""

    def __init__(self, view: Callable[[Any], Any], ptr: Callable[[Any], int], data: Callable[[Any], bytes]) -> None:
        self.view, self.ptr, self.data = view, ptr, data


def _consumers() -> Dict[str, Consumer]:
    found: Dict[str, Consumer] = {}
    try:
        import torch

        if torch.cuda.is_available():
            torch_bytes = lambda t: t.cpu().numpy().tobytes()  # noqa: E731
            found["torch-dlpack"] = Consumer(torch.from_dlpack, lambda t: t.data_ptr(), torch_bytes)
            found["torch-cai"] = Consumer(lambda b: torch.as_tensor(b, device="cuda"), lambda t: t.data_ptr(), torch_bytes)
    except ImportError:
        pass
    try:
        import cupy

        found["cupy-cai"] = Consumer(cupy.asarray, lambda a: a.data.ptr, lambda a: a.get().tobytes())
        found["cupy-dlpack"] = Consumer(cupy.from_dlpack, lambda a: a.data.ptr, lambda a: a.get().tobytes())
    except ImportError:
        pass
    try:
        from numba import cuda as ncuda
        from numba.cuda.cudadrv.driver import driver as numba_driver

        # The driver alone (`cuda.is_available()` also wants NVVM, the compiler, which a copy
        # does not need and the emulated-driver run does not have).
        if numba_driver.is_available:
            found["numba-cai"] = Consumer(
                ncuda.as_cuda_array, lambda a: a.device_ctypes_pointer.value, lambda a: a.copy_to_host().tobytes()
            )
    except ImportError:
        pass
    return found


CONSUMERS = _consumers()


@pytest.mark.parametrize("name", sorted(CONSUMERS) or ["none"])
def test_gpu_consumers_see_the_memory_zero_copy(name: str, pool: DevicePool, driver: Driver) -> None:
    if name == "none":
        pytest.skip("none of torch, CuPy, Numba is installed")
    consumer = CONSUMERS[name]
    buf = pool.allocate(1 << 16)
    driver.memset(buf.ptr, 0x2A, buf.size)
    view = consumer.view(buf)
    assert consumer.ptr(view) == buf.ptr  # no copy
    assert consumer.data(view) == b"\x2a" * buf.size


def test_gpu_each_library_sees_what_the_others_wrote(pool: DevicePool, driver: Driver) -> None:
    np = pytest.importorskip("numpy")
    torch = _torch_cuda()
    cupy = pytest.importorskip("cupy")
    ncuda = pytest.importorskip("numba.cuda")
    buf = pool.allocate(3 * 4096)
    t, c, n = torch.from_dlpack(buf), cupy.asarray(buf), ncuda.as_cuda_array(buf)
    t[:4096].fill_(1)
    torch.cuda.synchronize()
    c[4096:8192] = 2
    cupy.cuda.runtime.deviceSynchronize()
    n[8192:].copy_to_device(np.full(4096, 3, dtype=np.uint8))
    ncuda.synchronize()
    expected = b"\x01" * 4096 + b"\x02" * 4096 + b"\x03" * 4096
    assert t.cpu().numpy().tobytes() == expected
    assert c.get().tobytes() == expected
    assert n.copy_to_host().tobytes() == expected
    assert driver.read(buf.ptr, buf.size) == expected


def test_gpu_cupy_allocator(pool: DevicePool) -> None:
    cupy = pytest.importorskip("cupy")
    import vrampool.cupy

    vrampool.cupy.install(pool)
    try:
        before = pool.stats()["allocation.all.current"]
        x = cupy.arange(1 << 20, dtype=cupy.float32)
        assert pool.stats()["allocation.all.current"] == before + 1
        assert float(x.sum()) == float(sum(range(1 << 20)))
        del x
        gc.collect()
        assert pool.stats()["allocation.all.current"] == before
    finally:
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)


def test_gpu_numba_plugin_in_a_fresh_process() -> None:
    pytest.importorskip("numba.cuda")
    code = textwrap.dedent(
        """
        import vrampool
        from numba import cuda
        a = cuda.device_array(1 << 20, dtype="u1")
        assert type(cuda.current_context().memory_manager).__name__ == "VrampoolMemoryManager"
        s = vrampool.shared_pool(0).stats()
        assert s["allocation.all.current"] == 1, s
        import numpy as np
        a.copy_to_device(np.full(1 << 20, 5, dtype=np.uint8))
        assert a.copy_to_host().sum() == 5 << 20
        b = cuda.to_device(np.arange(1000, dtype=np.int32))
        assert vrampool.shared_pool(0).stats()["allocation.all.current"] == 2
        assert (b.copy_to_host() == np.arange(1000)).all()
        del a, b
        import gc; gc.collect()
        print("ok", vrampool.shared_pool(0).stats()["allocation.all.current"])
        """
    )
    env = dict(os.environ, NUMBA_CUDA_MEMORY_MANAGER="vrampool.numba")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[:2] == ["ok", "0"]


@pytest.mark.parametrize("handles", ["auto", "legacy"])
def test_gpu_ipc_buffers_cross_to_a_spawned_child(handles: str, driver: Driver) -> None:
    """Issue 50 on the real driver: an ``ipc=True`` pool's buffers (file descriptors where the
    device has VMM; legacy IPC handles) pickle to a spawned child, which writes them."""
    import multiprocessing

    from _ipc_child import pattern, write_all

    spawn = multiprocessing.get_context("spawn")
    with DevicePool(0, ipc=True, ipc_handles=handles) as pool:
        buffers = [pool.allocate(n) for n in (512, 300_000, 5 * MIB)]
        results = spawn.Queue()
        child = spawn.Process(target=write_all, args=(buffers, [0, 1, 2], results))
        child.start()
        report = results.get(timeout=120)
        child.join(60)
        assert child.exitcode == 0 and report[0] == "ok" and report[3:] == (0, 0), report
        for tag, buf in enumerate(buffers):
            assert driver.read(buf.ptr, buf.size) == pattern(tag, buf.size), f"buffer {tag}"


def test_gpu_numba_ipc_through_the_plugin() -> None:
    """Numba arrays of a legacy-handle pool opened in spawned children (tests/_numba_ipc.py)."""
    pytest.importorskip("numba.cuda")
    script = os.path.join(os.path.dirname(__file__), "_numba_ipc.py")
    env = dict(os.environ, NUMBA_CUDA_MEMORY_MANAGER="vrampool.numba", VRAMPOOL_CONF="ipc:true,ipc_handles:legacy")
    out = subprocess.run([sys.executable, script, "share"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    report = json.loads(out.stdout.splitlines()[-1])
    assert report["matched"] == report["cases"] * (report["devices"] + 1 + int(report["raw_path"])), report
    assert report["offsets"] > 1 and report["twice"] == ["IpcHandle is already opened"], report


def test_gpu_cuda_core_resource(pool: DevicePool, driver: Driver) -> None:
    core = pytest.importorskip("cuda.core")
    from vrampool.cuda_core import PoolMemoryResource

    dev = core.Device(0)
    dev.set_current()
    stream = dev.create_stream()
    mr = PoolMemoryResource(pool)
    assert (mr.is_device_accessible, mr.is_host_accessible, mr.device_id) == (True, False, 0)
    buf = mr.allocate(1 * MIB, stream=stream)
    assert buf.is_device_accessible and buf.device_id == 0
    (block,) = native(pool).live_blocks()
    assert block[0] == int(buf.handle) and block[3] == int(stream.handle)
    stream.sync()
    driver.memset(int(buf.handle), 9, buf.size)
    assert driver.read(int(buf.handle), 16) == b"\x09" * 16
    buf.close(stream)
    assert pool.stats()["allocation.all.current"] == 0 and mr.live_blocks == 0


def test_gpu_bad_input(pool: DevicePool) -> None:
    before = pool.stats()
    for size in (0, -1, 1 << 70):
        with pytest.raises(ValueError):
            pool.allocate(size)
    with pytest.raises(vrampool.InvalidSizeError):
        pool.allocate(1 << 60)
    with pytest.raises(TypeError):
        pool.allocate(100, stream="default")
    sim = DevicePool("sim", capacity=1 << 30)
    with pytest.raises(ValueError, match="another pool"):
        pool.deallocate(sim.allocate(100))
    assert pool.stats() == before
    with pytest.raises(BufferError):
        pool.allocate(100).__dlpack__(dl_device=(1, 0))

