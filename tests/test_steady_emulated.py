"""The steady arena (crates/vrampool-steady) across streams, under the emulated CUDA driver
(scripts/emulated-cuda.sh, which scripts/test.sh runs this file under): buffers filled by slow
kernels, copied out by asynchronous copies into page-locked host memory and freed before either
ran, on one stream an iteration, on two streams an iteration, with record_stream and frees naming
another stream, and through the C ABI PyTorch uses. Every test checks the bytes every copy
delivered and that the emulator's stream-order race check saw nothing. Host memory, not a GPU.

Skipped where the loaded libcuda is not the emulated driver (a failure instead with
VRAMPOOL_REQUIRE_EMULATED=1, which scripts/test.sh sets, so CI cannot skip it by accident).

A race is counted here rather than ending the process (the tests turn strict mode off while they
run), so that a failure names the races. DevicePool does not expose its steady arena's planned
figures; `in_arena` tells arena buffers by where they lie (see tests/test_steady.py)."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
from ctypes import c_size_t, c_uint64, c_void_p
from typing import Iterator, List, Sequence, Tuple

import pytest

from _emulated import DRIVER, MIB, STEP_COSTS, Copies, assert_no_races, freed_under_kernels, no_races, streams_fixture  # noqa: F401 (fixtures)
from vrampool import DevicePool

#: A kernel's delay: long enough that it has not run when its buffer is freed a moment later.
SLOW_US = 25_000
#: The delay of a kernel that must still be pending while several iterations run.
PENDING_US = 400_000


@pytest.fixture
def pool() -> Iterator[DevicePool]:
    pool = DevicePool(0)
    yield pool
    DRIVER.check(DRIVER.lib.cuCtxSynchronize())
    gc.collect()
    assert pool.close() == []


def in_arena(pool: DevicePool, ptrs: Sequence[int]) -> List[bool]:
    """Per pointer, whether it lies in the steady arena (a best-fit block), not a slab."""
    segments = pool.snapshot()["segments"]
    return [any(s["address"] <= p < s["address"] + s["total_size"] and s["strategy"] != "slab" for s in segments) for p in ptrs]


def iteration(pool: DevicePool, copies: Copies, on: Sequence[int], first_value: int) -> bool:
    """One iteration of len(on) 1 MiB buffers, buffer i on stream on[i] with the byte
    first_value + i: each is filled by a slow kernel and copied out on its stream, then freed at
    once (the first one last, after a second copy of it, so that the iteration ends there and an
    overlap with it shows). Whether its buffers came from the arena."""
    bufs = freed_under_kernels(pool, copies, on, MIB, first_value, SLOW_US)
    served = all(in_arena(pool, [b.ptr for b in bufs]))
    copies.queue(bufs[0].ptr, first_value, on[0])
    pool.deallocate(bufs[0])
    return served


# ---- A and B ----


def test_steady_iterations_taking_turns_on_two_streams(pool: DevicePool, streams: Tuple[int, int]) -> None:
    """Eight iterations of ten 1 MiB buffers, each iteration on one stream, a and b in turn: every
    copy delivers its buffer's byte, no race, and from the third iteration on the arena serves
    them (a region per stream)."""
    a, b = streams
    copies = Copies(8 * 11)
    try:
        served = [iteration(pool, copies, [a if it % 2 == 0 else b] * 10, 1 + 11 * it) for it in range(8)]
        assert_no_races()
        assert copies.wrong() == []
    finally:
        copies.close()
    assert served == [False, False] + [True] * 6


def test_steady_iterations_on_both_streams_at_once(pool: DevicePool, streams: Tuple[int, int]) -> None:
    """Eight iterations of five buffers on a and five on b, in turn: every copy right, no race,
    served from the second iteration on."""
    a, b = streams
    copies = Copies(8 * 11)
    try:
        served = [iteration(pool, copies, [a, b] * 5, 1 + 11 * it) for it in range(8)]
        assert_no_races()
        assert copies.wrong() == []
    finally:
        copies.close()
    assert served == [False] + [True] * 7


def test_steady_a_plan_on_two_streams_then_iterations_on_one(pool: DevicePool, streams: Tuple[int, int]) -> None:
    """Three iterations on both streams (planned and served), then three wholly on a (which
    begin as the two-stream ones do, so the first leaves that schedule at its second buffer) and
    three wholly on b: each change is planned anew and served, every copy right, no race."""
    a, b = streams
    plan = [[a, b] * 5] * 3 + [[a] * 10] * 3 + [[b] * 10] * 3
    copies = Copies(len(plan) * 11)
    try:
        served = [iteration(pool, copies, on, 1 + 11 * it) for it, on in enumerate(plan)]
        assert_no_races()
        assert copies.wrong() == []
    finally:
        copies.close()
    assert served[1:3] == [True, True] and served[4:6] == [True, True] and served[7:] == [True, True], served


# ---- C ----


@pytest.mark.parametrize("how", ["record_stream", "free naming b"])
def test_steady_an_arena_buffer_handed_to_another_stream(pool: DevicePool, streams: Tuple[int, int], how: str) -> None:
    """A served iteration on a hands buffer 3 to b (record_stream, or a free naming b) while a
    slow kernel on b still writes it; the iteration and six more run on a: no byte of it goes
    to a's buffers before b is done, no race, and every copy right."""
    a, b = streams
    copies = Copies(12 * 11)
    try:
        for it in range(2):
            iteration(pool, copies, [a] * 10, 1 + 11 * it)
        bufs = []
        for i in range(10):
            buf = pool.allocate(MIB, stream=a)
            bufs.append(buf)
            if i == 3:
                DRIVER.check(DRIVER.lib.cuStreamSynchronize(c_void_p(a)))  # a is done with it: b takes over
                assert in_arena(pool, [buf.ptr]) == [True], "served from the arena"
                if how == "record_stream":
                    pool.record_stream(buf, b)
                DRIVER.fill(buf.ptr, MIB, 0xB3, PENDING_US, b)
                copies.queue(buf.ptr, 0xB3, b)
                pool.deallocate(buf, stream=b if how == "free naming b" else None)
                continue
            DRIVER.fill(buf.ptr, MIB, 30 + i, SLOW_US // 5, a)
            copies.queue(buf.ptr, 30 + i, a)
            if i > 0:
                pool.deallocate(buf)
        pool.deallocate(bufs[0])
        for it in range(6):
            iteration(pool, copies, [a] * 10, 100 + 11 * it)
        assert_no_races()
        assert copies.wrong() == []
    finally:
        copies.close()


@pytest.mark.parametrize("how", ["record_stream", "free naming b"])
def test_steady_every_iteration_hands_a_buffer_to_another_stream(pool: DevicePool, streams: Tuple[int, int], how: str) -> None:
    """Eight iterations on a that each hand buffer 3 to b (record_stream, or a free naming b)
    while a slow kernel on b writes it: the schedule leaves that buffer to the pool and serves the
    rest, no race, every copy right."""
    a, b = streams
    copies = Copies(8 * 10)
    served = []
    try:
        for it in range(8):
            bufs = []
            for i in range(10):
                buf = pool.allocate(MIB, stream=a)
                bufs.append(buf)
                value = 1 + it * 10 + i
                if i == 3:
                    DRIVER.check(DRIVER.lib.cuStreamSynchronize(c_void_p(a)))
                    if how == "record_stream":
                        pool.record_stream(buf, b)
                    DRIVER.fill(buf.ptr, MIB, value, 10 * SLOW_US, b)
                    copies.queue(buf.ptr, value, b)
                    pool.deallocate(buf, stream=b if how == "free naming b" else None)
                    continue
                DRIVER.fill(buf.ptr, MIB, value, SLOW_US // 5, a)
                copies.queue(buf.ptr, value, a)
                if i > 0:
                    pool.deallocate(buf)
            served.append(in_arena(pool, [bufs[3].ptr, bufs[5].ptr]))
            pool.deallocate(bufs[0])
        assert_no_races()
        assert copies.wrong() == []
    finally:
        copies.close()
    assert served[2:] == [[False, True]] * 6, served


@pytest.mark.parametrize("how", ["record_stream", "free naming b"])
def test_steady_scrub_on_free_waits_for_the_stream_an_arena_buffer_was_handed_to(streams: Tuple[int, int], how: str) -> None:
    """scrub="on_free": an arena buffer of a served iteration on a, handed to b (record_stream, or
    a free naming b) while a slow kernel on b writes it, is zero-filled after b is done with it,
    as the pool's own blocks are: no race (a memset on a while b's kernel writes the bytes), and
    every buffer handed out later reads zeros."""
    a, b = streams
    pool = DevicePool(0, scrub="on_free")
    try:
        for it in range(4):
            bufs = [pool.allocate(MIB, stream=a) for _ in range(10)]
            for buf in bufs:
                got = host_read(buf.ptr, MIB)
                assert got == bytes(MIB), f"iteration {it}: {buf.ptr:#x} handed out with bytes {sorted(set(got))[:4]}"
                DRIVER.fill(buf.ptr, MIB, 0x40 + it, 0, a)
            if it == 2:
                x = bufs.pop(3)
                assert in_arena(pool, [x.ptr]) == [True]
                DRIVER.check(DRIVER.lib.cuStreamSynchronize(c_void_p(a)))
                if how == "record_stream":
                    pool.record_stream(x, b)
                DRIVER.fill(x.ptr, MIB, 0xB3, PENDING_US, b)
                pool.deallocate(x, stream=b if how == "free naming b" else None)
            for buf in bufs:
                pool.deallocate(buf)
        assert_no_races()
    finally:
        DRIVER.check(DRIVER.lib.cuCtxSynchronize())
        pool.close()


def host_read(ptr: int, n: int) -> bytes:
    """The bytes at `ptr`, by a synchronous copy (after all the device's work)."""
    DRIVER.check(DRIVER.lib.cuCtxSynchronize())
    host = ctypes.create_string_buffer(n)
    DRIVER.check(DRIVER.lib.cuMemcpyDtoH_v2(host, c_uint64(ptr), c_size_t(n)))
    return host.raw


# ---- D ----

#: The C ABI as PyTorch's CUDAPluggableAllocator calls it, with the planned mode on and keyed
#: steps, on two streams: prints the races, the wrong copies and the planned figures.
C_ABI_ON_TWO_STREAMS = """
import ctypes, json
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p
from vrampool import _native

cu = ctypes.CDLL("libcuda.so.1")
cu.emucuda_races.restype = c_uint64
cu.emucuda_launch_fill.argtypes = [c_uint64, c_uint64, ctypes.c_uint8, c_uint, c_void_p]
cu.cuMemcpyDtoHAsync_v2.argtypes = [c_void_p, c_uint64, c_size_t, c_void_p]
cu.cuMemAllocHost_v2.argtypes = [POINTER(c_void_p), c_size_t]
abi = ctypes.CDLL(_native.__file__)
for name, restype, argtypes in [
    ("vrampool_configure", c_int, [c_char_p]),
    ("vrampool_planned_enable", None, [c_int]),
    ("vrampool_planned_step", None, [c_uint64]),
    ("vrampool_malloc", c_void_p, [c_size_t, c_int, c_void_p]),
    ("vrampool_free", None, [c_void_p, c_size_t, c_int, c_void_p]),
    ("vrampool_record_stream", None, [c_void_p, c_void_p]),
]:
    fn = getattr(abi, name)
    fn.restype, fn.argtypes = restype, argtypes

MIB, KEY, ITERATIONS, SLOTS = 1 << 20, 0x5EED, 8, 8 * 12 + 1
assert cu.cuInit(0) == 0
ctx = c_void_p()
assert cu.cuDevicePrimaryCtxRetain(byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0

def stream():
    s = c_void_p()
    assert cu.cuStreamCreate(byref(s), 1) == 0
    return s.value

a, b = stream(), stream()
host = c_void_p()
assert cu.cuMemAllocHost_v2(byref(host), SLOTS * MIB) == 0
expected = []

def copy(ptr, value, s):
    assert len(expected) < SLOTS
    dst = host.value + len(expected) * MIB
    assert cu.cuMemcpyDtoHAsync_v2(c_void_p(dst), ptr, MIB, c_void_p(s)) == 0
    expected.append(value)

before = cu.emucuda_races()
assert abi.vrampool_configure(b"device:cuda") == 0
abi.vrampool_planned_enable(1)
abi.vrampool_planned_step(KEY)
addresses = []
for it in range(ITERATIONS):
    kept = []
    for i in range(10):
        s = a if i % 2 == 0 else b
        p = abi.vrampool_malloc(MIB, 0, c_void_p(s))
        assert p, _native.last_error()
        value = 1 + (it * 10 + i) % 250
        assert cu.emucuda_launch_fill(p, MIB, value, 25_000, c_void_p(s)) == 0
        copy(p, value, s)
        if it == 5 and i == 4:
            # Handed to the other stream while a slow kernel there writes it.
            assert cu.cuStreamSynchronize(c_void_p(s)) == 0
            abi.vrampool_record_stream(c_void_p(p), c_void_p(b))
            assert cu.emucuda_launch_fill(p, MIB, 0xB4, 400_000, c_void_p(b)) == 0
            copy(p, 0xB4, b)
        if i < 2:
            kept.append((p, s, value))
        else:
            abi.vrampool_free(c_void_p(p), MIB, 0, c_void_p(s))
        if i == 0:
            addresses.append(p)
    for p, s, value in kept:
        copy(p, value, s)
        abi.vrampool_free(c_void_p(p), MIB, 0, c_void_p(s))
    abi.vrampool_planned_step(KEY)
assert cu.cuCtxSynchronize() == 0
wrong = [i for i, v in enumerate(expected) if ctypes.string_at(host.value + i * MIB, MIB) != bytes([v]) * MIB]
figures = _native.abi_planned_stats(0)
print(json.dumps({"races": cu.emucuda_races() - before, "wrong": wrong, "refused": _native.abi_counters()["refused_frees"],
                  "error": _native.last_error(), "planned_allocations": figures["planned_allocations"],
                  "fallbacks": figures["fallbacks"], "live": _native.abi_stats(0)["allocation.all.current"],
                  "addresses": addresses}))
"""


def test_steady_c_abi_on_two_streams_with_keyed_steps() -> None:
    """The C ABI (vrampool_configure, vrampool_planned_enable, vrampool_malloc / vrampool_free
    naming each buffer's stream, vrampool_planned_step) on two streams, eight iterations of ten
    slow-filled 1 MiB buffers, one of them handed to the other stream by record_stream midway:
    no race, every copy right, no refused free, and the arena served most allocations."""
    env = {k: v for k, v in os.environ.items() if k != "VRAMPOOL_CONF"}
    env["EMULATED_CUDA_STRICT"] = "0"  # counted, not fatal: the figures say how many
    done = subprocess.run([sys.executable, "-c", C_ABI_ON_TWO_STREAMS], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(done.stdout.splitlines()[-1])
    assert (figures["races"], figures["wrong"], figures["refused"], figures["error"], figures["live"]) == (0, [], 0, None, 0), figures
    assert figures["planned_allocations"] >= 5 * 10, figures
