"""vrampool's CUDA path from Python under the emulated CUDA driver (scripts/emulated-cuda.sh,
which scripts/test.sh runs this file under): DevicePool(0) through the real backend, the C ABI
as CUDAPluggableAllocator calls it, cuda.core's own Device / Stream / Buffer, and the emulator's
stream-order race check. Host memory, not a GPU: no figure here is a GPU figure.

Skipped where the loaded libcuda is not the emulated driver (a failure instead with
VRAMPOOL_REQUIRE_EMULATED=1, which scripts/test.sh sets, so CI cannot skip it by accident)."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import random
import subprocess
import sys
from ctypes import POINTER, byref, c_double, c_int, c_size_t, c_uint64, c_void_p
from typing import Callable, Dict, Iterator, List, Tuple

import pytest

import vrampool
from _emulated import DRIVER, MIB, STEP_COSTS, STRICT
from vrampool import DevicePool, _native
from vrampool.testing import native

#: The test kernel's delay where a test needs its work still pending at the next call: long
#: enough that a loaded CI machine does not finish it first.
PENDING_US = 400_000


#: Races a test causes on purpose, by test name (every other test must cause none).
EXPECTED_RACES: Dict[str, int] = {}


@pytest.fixture(autouse=True)
def no_races(request: pytest.FixtureRequest) -> Iterator[None]:
    DRIVER.use(0)
    before = DRIVER.races()
    yield
    assert DRIVER.races() - before == EXPECTED_RACES.pop(request.node.name, 0), DRIVER.reports()


@pytest.fixture
def pool(device_pool: DevicePool) -> DevicePool:
    return device_pool


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 31 + seed) & 0xFF for i in range(n)) if n <= 4096 else bytes([seed & 0xFF]) * n


def test_emulated_round_trip(pool: DevicePool) -> None:
    bufs = [pool.allocate(n) for n in (1, 700, 4096, 3 * MIB, 70 * MIB)]
    for i, buf in enumerate(bufs):
        DRIVER.write(buf.ptr, pattern(buf.size, i))
    for i, buf in enumerate(bufs):
        assert DRIVER.read(buf.ptr, buf.size) == pattern(buf.size, i)
        assert DRIVER.ordinal_of(buf.ptr) == 0
    for buf in bufs:
        pool.deallocate(buf)
    assert pool.stats()["allocation.all.current"] == 0
    assert pool.memory_kind == "device" and "cuda:0" in pool.memory_summary()


def test_emulated_growth_and_trim_give_the_memory_back() -> None:
    start, _ = DRIVER.mem_info()
    creates = DRIVER.calls("cuMemCreate")
    pool = DevicePool(0, strategy="best_fit", expandable=True)
    bufs = [pool.allocate(100 * MIB) for _ in range(3)]
    grown = start - DRIVER.mem_info()[0]
    assert grown >= 300 * MIB and grown == pool.stats()["reserved_bytes.all.current"]
    assert DRIVER.calls("cuMemCreate") > creates, "grown through virtual memory"
    for buf in bufs:
        pool.deallocate(buf)
    assert pool.trim() == grown
    assert DRIVER.mem_info()[0] == start, "every byte is back in cuMemGetInfo"
    pool.close()


@pytest.mark.parametrize("steady", [True, False])
def test_emulated_close_says_what_a_failed_unmap_kept(steady: bool) -> None:
    """Issue 57, class 7: close() with one cuMemUnmap failing kept 2 MiB and returned [] as if
    all were well. It raises a DeviceError naming the bytes kept, with the pool closed; closing
    again gives them back."""
    start, _ = DRIVER.mem_info()
    pool = DevicePool(0, steady=steady)
    pool.deallocate(pool.allocate(4 * MIB))  # the middle tier's expandable range: two 2 MiB pieces
    DRIVER.fail("cuMemUnmap", 1)
    with pytest.raises(vrampool.DeviceError, match=r"refused to take back 2097152 bytes .*cuMemUnmap"):
        pool.close()
    assert pool.closed
    assert DRIVER.mem_info()[0] == start - 2 * MIB
    with pytest.raises(vrampool.PoolClosedError):
        pool.allocate(512)
    assert pool.close() == [], "closed again: the kept piece goes back"
    assert DRIVER.mem_info()[0] == start
    assert pool.close() == []


def test_emulated_out_of_memory_and_release_and_retry_at_a_limit() -> None:
    pool = DevicePool(0, strategy="best_fit", limit=256 * MIB)
    first = pool.allocate(200 * MIB)
    with pytest.raises(vrampool.OutOfMemoryError, match=r"tried to allocate 100\.00 MiB.*limit 256\.00 MiB; device reports"):
        pool.allocate(100 * MIB)
    pool.deallocate(first)
    second = pool.allocate(100 * MIB, stream=DRIVER.stream())  # another stream: needs the cached 200 MiB back
    assert pool.stats()["num_alloc_retries"] >= 1
    pool.deallocate(second)
    pool.close()


def test_emulated_out_of_memory_from_the_driver() -> None:
    free, total = DRIVER.mem_info()
    # Another user of the device holds all but 64 MiB of it.
    other = c_uint64()
    DRIVER.check(DRIVER.lib.cuMemAlloc_v2(byref(other), c_size_t(free - 64 * MIB)))
    try:
        pool = DevicePool(0)
        with pytest.raises(vrampool.OutOfMemoryError, match="device reports 64.00 MiB free"):
            pool.allocate(128 * MIB)
        small = pool.allocate(16 * MIB)
        pool.deallocate(small)
        pool.close()
    finally:
        DRIVER.check(DRIVER.lib.cuMemFree_v2(other))
    assert DRIVER.mem_info() == (free, total)


def test_emulated_eight_threads_of_random_alloc_and_free(pool: DevicePool, run_in_threads: Callable[[Callable[[int], None], int], None]) -> None:
    sizes = [512, 4096, 100_000, MIB, 3 * MIB, 20 * MIB]

    def work(seed: int) -> None:
        DRIVER.use(0)
        rng = random.Random(seed)
        live: List[Tuple[object, bytes]] = []
        for step in range(150):
            if live and (len(live) >= 16 or rng.random() < 0.4):
                buf, tag = live.pop(rng.randrange(len(live)))
                # A tag at both ends: an overlap with any other live block overwrites one.
                assert DRIVER.read(buf.ptr, 8) == tag and DRIVER.read(buf.ptr + buf.size - 8, 8) == tag
                pool.deallocate(buf)
            else:
                buf = pool.allocate(rng.choice(sizes))
                tag = ((seed << 56) | step).to_bytes(8, "little")
                DRIVER.write(buf.ptr, tag)
                DRIVER.write(buf.ptr + buf.size - 8, tag)
                live.append((buf, tag))
        for buf, tag in live:
            assert DRIVER.read(buf.ptr, 8) == tag
            pool.deallocate(buf)

    run_in_threads(work, 8)
    assert pool.stats()["allocated_bytes.all.current"] == 0


def test_emulated_two_devices_one_pool_each() -> None:
    if len(DRIVER.contexts) < 2:
        pytest.fail("needs EMULATED_CUDA_DEVICES=2 (scripts/test.sh sets it)")
    p0, p1 = DevicePool(0), DevicePool(1)
    free1 = DRIVER.mem_info(1)[0]
    DRIVER.use(1)
    ctx1 = DRIVER.current()
    b0 = p0.allocate(8 * MIB)
    assert DRIVER.current() == ctx1, "the pool of device 0 left the thread's current device as it was"
    assert DRIVER.ordinal_of(b0.ptr) == 0
    b1 = p1.allocate(8 * MIB)
    assert DRIVER.ordinal_of(b1.ptr) == 1
    assert DRIVER.mem_info(1)[0] == free1 - p1.stats()["reserved_bytes.all.current"]
    with pytest.raises(vrampool.WrongDeviceError, match="is on device 0; this pool is on device 1"):
        p1.deallocate(b0)
    p0.deallocate(b0)
    p1.deallocate(b1)
    p0.close()
    p1.close()
    assert DRIVER.mem_info(1)[0] == free1


def test_emulated_bad_ordinal_is_a_device_error() -> None:
    with pytest.raises(vrampool.DeviceError, match=f"no CUDA device 7: {len(DRIVER.contexts)} device"):
        DevicePool(7)


class MempoolId(ctypes.Structure):
    _fields_ = [("first", c_uint64), ("second", c_uint64)]


@pytest.fixture
def abi(monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    """The extension module as CUDAPluggableAllocator loads it, on CUDA device 0."""
    monkeypatch.delenv("VRAMPOOL_CONF", raising=False)
    lib = ctypes.CDLL(_native.__file__)
    for name, restype, argtypes in [
        ("vrampool_malloc", c_void_p, [c_size_t, c_int, c_void_p]),
        ("vrampool_free", None, [c_void_p, c_size_t, c_int, c_void_p]),
        ("vrampool_init", None, [c_int]),
        ("vrampool_reset", None, []),
        ("vrampool_memory_fraction", None, [c_double, c_int]),
        ("vrampool_base_alloc", c_void_p, [c_void_p, POINTER(c_size_t)]),
        ("vrampool_record_stream", None, [c_void_p, c_void_p]),
        ("vrampool_begin_allocate_to_pool", None, [c_int, MempoolId, c_void_p]),
        ("vrampool_end_allocate_to_pool", None, [c_int, MempoolId]),
        ("vrampool_release_pool", None, [c_int, MempoolId]),
    ]:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    _native._abi_reset()
    _native.configure("device:cuda")
    yield lib
    _native._abi_reset()


def test_emulated_c_abi_on_device_0(abi: ctypes.CDLL) -> None:
    start = DRIVER.mem_info()[0]
    abi.vrampool_init(len(DRIVER.contexts))
    side = DRIVER.stream()
    a = abi.vrampool_malloc(3 * MIB, 0, None)
    b = abi.vrampool_malloc(4096, 0, c_void_p(side))
    assert a and b and DRIVER.ordinal_of(a) == 0
    DRIVER.write(a, b"abi" * 100)
    assert DRIVER.read(a, 300) == b"abi" * 100
    size = c_size_t()
    base = abi.vrampool_base_alloc(c_void_p(a + 100), byref(size))
    assert base <= a and a + 3 * MIB <= base + size.value
    # Used on `side` too: its reuse waits for an event on `side`.
    abi.vrampool_record_stream(c_void_p(a), c_void_p(side))
    abi.vrampool_free(c_void_p(a), 3 * MIB, 0, None)
    abi.vrampool_free(c_void_p(b), 4096, 0, c_void_p(side))
    # A private pool (CUDA graphs, torch.cuda.MemPool): routed while open, freed at release.
    pool_id = MempoolId(1, 1)
    abi.vrampool_begin_allocate_to_pool(0, pool_id, None)
    p = abi.vrampool_malloc(MIB, 0, None)
    abi.vrampool_end_allocate_to_pool(0, pool_id)
    assert _native.abi_stats(0)["allocation.all.current"] == 1
    abi.vrampool_free(c_void_p(p), MIB, 0, None)
    abi.vrampool_release_pool(0, pool_id)
    # A fraction of the device caps the pool: past it malloc returns null and says why.
    abi.vrampool_memory_fraction(0.001, 0)
    assert not abi.vrampool_malloc(64 * MIB, 0, None)
    assert "out of memory" in _native.last_error().lower()
    abi.vrampool_memory_fraction(1.0, 0)
    # A foreign pointer is refused and counted, never a crash.
    refused = _native.abi_counters()["refused_frees"]
    abi.vrampool_free(c_void_p(0xDEAD000), 16, 0, None)
    assert _native.abi_counters()["refused_frees"] == refused + 1
    DRIVER.check(DRIVER.lib.cuCtxSynchronize())
    abi.vrampool_reset()
    assert _native.abi_stats(0)["reserved_bytes.all.current"] == 0
    assert DRIVER.mem_info()[0] == start
    DRIVER.check(DRIVER.lib.cuStreamDestroy_v2(side))


def test_emulated_cuda_core_device_stream_and_buffer(pool: DevicePool) -> None:
    core = pytest.importorskip("cuda.core")
    from vrampool.cuda_core import PoolMemoryResource

    dev = core.Device(0)
    dev.set_current()
    stream = dev.create_stream()
    mr = PoolMemoryResource(pool)
    assert (mr.is_device_accessible, mr.is_host_accessible, mr.device_id) == (True, False, 0)
    src = mr.allocate(MIB, stream=stream)
    dst = mr.allocate(MIB, stream=stream)
    assert isinstance(src, core.Buffer) and src.is_device_accessible and src.device_id == 0
    blocks = {b[0]: b for b in native(pool).live_blocks()}
    assert blocks[int(src.handle)][3] == int(stream.handle), "allocated in the stream's order"
    DRIVER.lib.cuMemsetD8Async(int(src.handle), 0x42, MIB, c_void_p(int(stream.handle)))
    dst.copy_from(src, stream=stream)  # cuda.core's own copy, queued on the stream
    stream.sync()
    assert DRIVER.read(int(dst.handle), MIB) == b"\x42" * MIB
    src.close(stream)
    dst.close(stream)
    assert pool.stats()["allocation.all.current"] == 0 and mr.live_blocks == 0


def test_emulated_cross_stream_reuse_is_free_of_races(pool: DevicePool) -> None:
    a, b = DRIVER.stream(), DRIVER.stream()
    x = pool.allocate(4 * MIB, stream=a)
    DRIVER.check(DRIVER.lib.cuStreamSynchronize(c_void_p(a)))
    pool.record_stream(x, b)
    # A delayed kernel on b still writes x when x is freed and the same size asked for on a.
    DRIVER.check(DRIVER.lib.emucuda_launch_fill(x.ptr, 4 * MIB, 0xB0, PENDING_US, c_void_p(b)))
    xp = x.ptr
    pool.deallocate(x)
    y = pool.allocate(4 * MIB, stream=a)
    assert y.ptr + 4 * MIB <= xp or xp + 4 * MIB <= y.ptr, "reused while b still writes it"
    DRIVER.check(DRIVER.lib.cuMemsetD8Async(y.ptr, 0, 4 * MIB, c_void_p(a)))
    DRIVER.check(DRIVER.lib.cuCtxSynchronize())
    pool.deallocate(y)
    for s in (a, b):
        DRIVER.check(DRIVER.lib.cuStreamDestroy_v2(c_void_p(s)))


def test_emulated_race_check_reports_an_unordered_write(pool: DevicePool) -> None:
    a, b = DRIVER.stream(), DRIVER.stream()
    x = pool.allocate(MIB, stream=a)
    DRIVER.lib.emucuda_set_strict(0)
    before = DRIVER.races()
    try:
        DRIVER.check(DRIVER.lib.emucuda_launch_fill(x.ptr, MIB, 1, PENDING_US, c_void_p(a)))
        DRIVER.check(DRIVER.lib.cuMemsetD8Async(x.ptr, 0, MIB, c_void_p(b)))
        seen = DRIVER.races() - before
        DRIVER.check(DRIVER.lib.cuCtxSynchronize())
    finally:
        DRIVER.lib.emucuda_set_strict(int(STRICT))
    assert seen == 1
    last = DRIVER.reports().splitlines()[-1]
    assert f"stream {a:#x}" in last and f"stream {b:#x}" in last and f"[{x.ptr:#x}, {x.ptr + MIB:#x})" in last
    pool.deallocate(x)
    EXPECTED_RACES["test_emulated_race_check_reports_an_unordered_write"] = 1




def _training_pass(pool: DevicePool, rng: random.Random) -> None:
    """One pass of a loop that repeats itself: 12 steps, each with its own sequence length (a
    buffer of another size first, then activations of sizes that follow it, freed as a backward
    pass frees them), everything freed at the end."""
    for length in (32, 64, 48, 128, 96, 32, 64, 128, 48, 96, 32, 64):
        step = [pool.allocate(length * 4096)]
        for layer in range(10):
            step.append(pool.allocate(length * (layer + 1) * 24 * 1024))
            step.append(pool.allocate(512 + 512 * (layer % 3)))
        while step:
            pool.deallocate(step.pop(rng.randrange(len(step)) if len(step) % 4 == 0 else -1))


def test_emulated_a_repeated_workload_makes_no_driver_call_after_warm_up() -> None:
    """Issue 47: six passes of the same steps through DevicePool(0) with no trim and no OOM: no
    context sync in any pass, and no driver call that allocates, maps, frees or waits from the
    fourth pass on."""
    pool = DevicePool(0)
    per_pass = []
    for _ in range(6):
        before = DRIVER.all_calls()
        _training_pass(pool, random.Random(7))
        after = DRIVER.all_calls()
        per_pass.append({n: after.get(n, 0) - before.get(n, 0) for n in STEP_COSTS})
    assert all(p["cuCtxSynchronize"] == 0 for p in per_pass), per_pass
    assert sum(per_pass[0].values()) > 0, "the first pass grows the pool"
    assert [sum(p.values()) for p in per_pass[3:]] == [0, 0, 0], per_pass
    assert pool.stats()["allocation.all.current"] == 0
    pool.close()


def _pool_life(side: int) -> None:
    """One DevicePool's life: growth in every tier, a block used on another stream, trim."""
    pool = DevicePool(0)
    try:
        bufs = [pool.allocate(n) for n in (512, 300 << 10, 3 * MIB, 40 * MIB, 70 * MIB)]
        pool.record_stream(bufs[2], side)
        for buf in bufs:
            pool.deallocate(buf)
        pool.trim()
    finally:
        pool.close()
        del pool
        gc.collect()


def test_emulated_fault_at_every_driver_call_is_a_python_error() -> None:
    """Each driver call the backend makes, failed at each of its first two calls in turn: the
    pool's life either finishes or raises one of vrampool's errors, and every byte goes back."""
    side = DRIVER.stream()
    start = DRIVER.mem_info()
    before = DRIVER.all_calls()
    _pool_life(side)
    made = {n: c - before.get(n, 0) for n, c in DRIVER.all_calls().items() if n.startswith("cu") and c > before.get(n, 0)}
    assert {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuEventRecord", "cuMemUnmap"} <= set(made), made
    raised: Dict[str, int] = {}
    for name, count in sorted(made.items()):
        for nth in range(1, min(count, 2) + 1):
            DRIVER.fail(name, nth)
            try:
                _pool_life(side)
            except (vrampool.DeviceError, vrampool.OutOfMemoryError) as e:
                raised[type(e).__name__] = raised.get(type(e).__name__, 0) + 1
                assert str(e), f"{name} #{nth}: an error without a message"
            finally:
                DRIVER.fail(name, 0)
            assert DRIVER.mem_info() == start, f"{name} failing at call {nth} leaked device memory"
    assert raised.get("DeviceError", 0) > 0, raised
    DRIVER.check(DRIVER.lib.cuStreamDestroy_v2(c_void_p(side)))



def test_emulated_async_copies_with_pageable_memory_behave_as_the_drivers(pool: DevicePool) -> None:
    """An asynchronous copy into pageable host memory returns once it is done, and one from it
    takes the bytes when it is called (Numba's copy_to_host relies on the first)."""
    a = DRIVER.stream()
    buf = pool.allocate(MIB, stream=a)
    DRIVER.check(DRIVER.lib.emucuda_launch_fill(buf.ptr, MIB, 7, 30_000, c_void_p(a)))
    host = ctypes.create_string_buffer(MIB)
    DRIVER.check(DRIVER.lib.cuMemcpyDtoHAsync_v2(host, c_uint64(buf.ptr), c_size_t(MIB), c_void_p(a)))
    assert host.raw == b"\x07" * MIB, "returned before the delayed kernel and the copy were done"
    src = ctypes.create_string_buffer(b"\x01" * MIB, MIB)
    DRIVER.check(DRIVER.lib.emucuda_launch_fill(buf.ptr, 16, 9, 30_000, c_void_p(a)))
    DRIVER.check(DRIVER.lib.cuMemcpyHtoDAsync_v2(c_uint64(buf.ptr), src, c_size_t(MIB), c_void_p(a)))
    ctypes.memset(src, 2, MIB)  # the copy is still queued behind the kernel: it has the bytes already
    DRIVER.check(DRIVER.lib.cuStreamSynchronize(c_void_p(a)))
    assert DRIVER.read(buf.ptr, MIB) == b"\x01" * MIB
    pool.deallocate(buf)
    DRIVER.check(DRIVER.lib.cuStreamDestroy_v2(c_void_p(a)))


#: Four threads of Numba arrays through the EMM plugin, each dropping the source of an async
#: copy still queued on its own stream (behind a delayed kernel), while the others allocate and
#: fill arrays on theirs: prints the race reports and the wrong bytes the copies delivered.
NUMBA_DROPS_SOURCES = """
import ctypes, json, threading
import numpy as np
from numba import cuda

lib = ctypes.CDLL("libcuda.so.1")
lib.emucuda_races.restype = ctypes.c_uint64
lib.emucuda_launch_fill.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint8, ctypes.c_uint, ctypes.c_void_p]
N, ROUNDS, THREADS = 64 << 10, 10, 4
assert type(cuda.current_context().memory_manager).__name__ == "VrampoolMemoryManager"

def ptr(array):
    return array.__cuda_array_interface__["data"][0]

def fill(array, value, delay_us, stream):
    assert lib.emucuda_launch_fill(ptr(array), array.nbytes, value, delay_us, ctypes.c_void_p(int(stream))) == 0

before = lib.emucuda_races()
wrong = [0] * THREADS
start = threading.Barrier(THREADS)

def worker(t):
    stream = cuda.stream()
    busy = cuda.device_array(512, np.uint8, stream=stream)
    copies = []
    start.wait()
    for i in range(ROUNDS):
        value = 1 + (t * ROUNDS + i) % 250
        src = cuda.device_array(N, np.uint8, stream=stream)
        fill(src, value, 0, stream)
        dst = cuda.device_array(N, np.uint8, stream=stream)
        fill(busy, 0, 20_000, stream)  # the copy below waits for this kernel
        dst.copy_to_device(src, stream=stream)
        del src  # freed while the copy that reads it is still queued
        scribble = cuda.device_array(N, np.uint8, stream=stream)
        fill(scribble, 0xEE, 0, stream)
        copies.append((value, dst, scribble))
    stream.synchronize()
    wrong[t] = sum(int((dst.copy_to_host() != value).sum()) for value, dst, _ in copies)

threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
cuda.synchronize()
print(json.dumps({"races": lib.emucuda_races() - before, "wrong": sum(wrong)}))
"""


def test_emulated_numba_arrays_dropped_under_pending_copies_are_not_reused_early() -> None:
    pytest.importorskip("numba.cuda")
    # Not strict: a race is counted rather than ending the child, so the figures say how many.
    env = dict(os.environ, NUMBA_CUDA_MEMORY_MANAGER="vrampool.numba", EMULATED_CUDA_STRICT="0")
    done = subprocess.run([sys.executable, "-c", NUMBA_DROPS_SOURCES], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"races": 0, "wrong": 0}


def test_emulated_fault_plans_take_v2_names_and_refuse_unknown_ones() -> None:
    # Issue 48: `cuMemAlloc_v2:1` (the symbol's own name) never fired, and said nothing.
    code = (
        "import ctypes; lib = ctypes.CDLL('libcuda.so.1'); total = ctypes.c_size_t();"
        "print(lib.cuInit(0), lib.cuDeviceTotalMem_v2(ctypes.byref(total), 0), lib.cuDeviceTotalMem_v2(ctypes.byref(total), 0))"
    )

    def run(plan: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "EMULATED_CUDA_FAIL": plan}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)

    for plan in ("cuDeviceTotalMem_v2:1:OUT_OF_MEMORY", "cuDeviceTotalMem:1:OUT_OF_MEMORY"):
        fired = run(plan)
        assert (fired.returncode, fired.stdout.split()) == (0, ["0", "2", "0"]), fired.stdout + fired.stderr
    refused = run("cuInit:5,cuMemAllocate:1")
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout + refused.stderr
    assert refused.stderr.strip() == 'emulated CUDA driver: EMULATED_CUDA_FAIL entry "cuMemAllocate:1": the driver has no function cuMemAllocate'
