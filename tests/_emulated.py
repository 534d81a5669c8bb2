"""What the emulated-driver tests share: the driver
(its calls, slow kernels, race counts), page-locked copies that check what a buffer held, and the
fixtures that count races and make streams. Importing it skips the importing test module where the
loaded libcuda is not the emulated driver (a failure instead with VRAMPOOL_REQUIRE_EMULATED=1,
which scripts/test.sh sets, so CI cannot skip it by accident). The tests of the emulated CUDA
backend (test_emulated_cuda.py) use the same driver and keep their own fixtures."""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p
from typing import TYPE_CHECKING, Dict, Iterator, List, Sequence, Tuple

import pytest

if TYPE_CHECKING:
    from vrampool import DeviceBuffer, DevicePool

MIB = 1 << 20


def _emulator() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return _skip(f"no libcuda: {e}")
    if not hasattr(lib, "emucuda_is_emulated"):
        return _skip("the loaded libcuda is not the emulated driver")
    return lib


def _skip(why: str) -> ctypes.CDLL:
    if os.environ.get("VRAMPOOL_REQUIRE_EMULATED") == "1":
        raise RuntimeError(f"VRAMPOOL_REQUIRE_EMULATED=1 but {why}; run under scripts/emulated-cuda.sh")
    pytest.skip(f"{why}; run under scripts/emulated-cuda.sh", allow_module_level=True)
    raise AssertionError("unreachable")


class Driver:
    """The driver calls the tests make themselves, and the emulator's test-only entry points."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        for name, restype, argtypes in [
            ("emucuda_call_count", c_uint64, [c_char_p]),
            ("emucuda_call_counts", c_size_t, [c_char_p, c_size_t]),
            ("emucuda_fail", c_uint, [c_char_p, c_uint64, c_uint]),
            ("emucuda_races", c_uint64, []),
            ("emucuda_reports", c_size_t, [c_char_p, c_size_t]),
            ("emucuda_set_strict", None, [c_int]),
            ("emucuda_set_memory", c_uint, [c_int, c_uint64]),
            ("emucuda_launch_fill", c_uint, [c_uint64, c_uint64, ctypes.c_uint8, c_uint, c_void_p]),
            ("cuMemAllocHost_v2", c_uint, [POINTER(c_void_p), c_size_t]),
            ("cuMemFreeHost", c_uint, [c_void_p]),
            ("cuMemcpyHtoD_v2", c_uint, [c_uint64, c_void_p, c_size_t]),
            ("cuMemcpyDtoH_v2", c_uint, [c_void_p, c_uint64, c_size_t]),
            ("cuMemcpyDtoHAsync_v2", c_uint, [c_void_p, c_uint64, c_size_t, c_void_p]),
            ("cuMemsetD8Async", c_uint, [c_uint64, ctypes.c_uint8, c_size_t, c_void_p]),
            ("cuPointerGetAttribute", c_uint, [c_void_p, c_int, c_uint64]),
            ("cuStreamSynchronize", c_uint, [c_void_p]),
            ("cuCtxSetCurrent", c_uint, [c_void_p]),
            ("cuStreamCreate", c_uint, [POINTER(c_void_p), c_uint]),
            ("cuStreamDestroy_v2", c_uint, [c_void_p]),
        ]:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        self.check(lib.cuInit(0))
        self.contexts = []
        count = c_int()
        self.check(lib.cuDeviceGetCount(byref(count)))
        for d in range(count.value):
            ctx = c_void_p()
            self.check(lib.cuDevicePrimaryCtxRetain(byref(ctx), d))
            self.contexts.append(ctx)

    @staticmethod
    def check(rc: int) -> None:
        assert rc == 0, f"CUDA driver error {rc}"

    def use(self, device: int = 0) -> None:
        self.check(self.lib.cuCtxSetCurrent(self.contexts[device]))

    def current(self) -> int:
        ctx = c_void_p()
        self.check(self.lib.cuCtxGetCurrent(byref(ctx)))
        return ctx.value or 0

    def write(self, ptr: int, data: bytes) -> None:
        self.check(self.lib.cuMemcpyHtoD_v2(ptr, data, len(data)))

    def read(self, ptr: int, n: int) -> bytes:
        host = ctypes.create_string_buffer(n)
        self.check(self.lib.cuMemcpyDtoH_v2(host, ptr, n))
        return host.raw

    def mem_info(self, device: int = 0) -> Tuple[int, int]:
        self.use(device)
        free, total = c_size_t(), c_size_t()
        self.check(self.lib.cuMemGetInfo_v2(byref(free), byref(total)))
        return free.value, total.value

    def ordinal_of(self, ptr: int) -> int:
        ordinal = c_int()
        self.check(self.lib.cuPointerGetAttribute(byref(ordinal), 9, ptr))  # DEVICE_ORDINAL
        return ordinal.value

    def stream(self) -> int:
        s = c_void_p()
        self.check(self.lib.cuStreamCreate(byref(s), 1))  # non-blocking, as CudaDevice makes them
        return s.value or 0

    def fill(self, ptr: int, size: int, value: int, delay_us: int, stream: int) -> None:
        """A kernel on `stream` that sleeps `delay_us`, then writes `value` over the bytes."""
        self.check(self.lib.emucuda_launch_fill(ptr, size, value, delay_us, c_void_p(stream)))

    def calls(self, name: str) -> int:
        return self.lib.emucuda_call_count(name.encode())

    def all_calls(self) -> Dict[str, int]:
        """How many times each driver call was made so far, by name."""
        n = self.lib.emucuda_call_counts(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self.lib.emucuda_call_counts(buf, n + 1)
        return {name: int(count) for name, count in (line.split() for line in buf.value.decode().splitlines())}

    def fail(self, name: str, nth: int, code: int = 999) -> None:
        self.check(self.lib.emucuda_fail(name.encode(), nth, code))

    def races(self) -> int:
        return self.lib.emucuda_races()

    def reports(self) -> str:
        n = self.lib.emucuda_reports(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self.lib.emucuda_reports(buf, n + 1)
        return buf.value.decode()


DRIVER = Driver(_emulator())
STRICT = os.environ.get("EMULATED_CUDA_STRICT") == "1"
#: The driver calls that allocate, map, free or wait.
STEP_COSTS = ("cuMemAlloc", "cuMemFree", "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease", "cuMemAddressReserve", "cuMemAddressFree", "cuCtxSynchronize", "cuStreamSynchronize")


#: The race count when the running test began.
BASELINE = [0]


@pytest.fixture(autouse=True)
def no_races(request: pytest.FixtureRequest) -> Iterator[None]:
    """Races are counted (strict mode off while the test runs), and there must be none: each
    test checks at its end (`assert_no_races`), and this again for one that passed."""
    DRIVER.use()
    DRIVER.lib.emucuda_set_strict(0)
    BASELINE[0] = DRIVER.races()
    failed = request.session.testsfailed
    try:
        yield
        if request.session.testsfailed == failed:
            assert_no_races()
    finally:
        DRIVER.lib.emucuda_set_strict(int(STRICT))


def assert_no_races() -> None:
    """Waits for the device, then: no race since the test began (the reports if there was)."""
    DRIVER.check(DRIVER.lib.cuCtxSynchronize())
    races = DRIVER.races() - BASELINE[0]
    assert races == 0, "\n".join(DRIVER.reports().splitlines()[-races:])


@pytest.fixture(name="streams")
def streams_fixture() -> Iterator[Tuple[int, int]]:
    """Two non-blocking streams, destroyed once their work is done."""
    a, b = DRIVER.stream(), DRIVER.stream()
    yield a, b
    DRIVER.check(DRIVER.lib.cuCtxSynchronize())
    for s in (a, b):
        DRIVER.check(DRIVER.lib.cuStreamDestroy_v2(c_void_p(s)))


class Copies:
    """Page-locked host slots of `size` bytes that asynchronous copies land in, each with the
    byte it must hold once the copy is done."""

    def __init__(self, slots: int, size: int = MIB) -> None:
        self.size = size
        self.host = c_void_p()
        DRIVER.check(DRIVER.lib.cuMemAllocHost_v2(byref(self.host), slots * size))
        self.expected: List[int] = []
        self.slots = slots

    def queue(self, ptr: int, value: int, stream: int) -> None:
        """Queues a copy of the `size` bytes at `ptr` on `stream`; they must all be `value`."""
        assert len(self.expected) < self.slots
        dst = (self.host.value or 0) + len(self.expected) * self.size
        DRIVER.check(DRIVER.lib.cuMemcpyDtoHAsync_v2(c_void_p(dst), ptr, self.size, c_void_p(stream)))
        self.expected.append(value)

    def wrong(self) -> List[Tuple[int, int, bytes]]:
        """After a sync: the copies that did not deliver their byte (slot, expected, what came)."""
        base = self.host.value or 0
        out = []
        for i, value in enumerate(self.expected):
            got = ctypes.string_at(base + i * self.size, self.size)
            if got != bytes([value]) * self.size:
                out.append((i, value, bytes(sorted(set(got)))))
        return out

    def close(self) -> None:
        DRIVER.check(DRIVER.lib.cuMemFreeHost(self.host))


def freed_under_kernels(pool: DevicePool, copies: Copies, on: Sequence[int], size: int, first_value: int, slow_us: int) -> List[DeviceBuffer]:
    """Buffers of `size` bytes, buffer i on stream on[i] with the byte first_value + i: each filled
    by a kernel that sleeps `slow_us` first and copied out on its stream, and every one but the first
    freed at once, before its kernel ran (reused in its stream's order only). All of them, the first
    still live."""
    bufs: List[DeviceBuffer] = []
    for i, stream in enumerate(on):
        buf = pool.allocate(size, stream=stream)
        DRIVER.fill(buf.ptr, size, first_value + i, slow_us, stream)
        copies.queue(buf.ptr, first_value + i, stream)
        bufs.append(buf)
        if i > 0:
            pool.deallocate(buf)
    return bufs
