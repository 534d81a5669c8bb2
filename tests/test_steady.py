"""The steady arena (crates/vrampool-steady) that every DevicePool runs by default, tried as a
hostile user would on the simulated device (host memory: the tests read and write the bytes
through the pointers): scrubbing of arena buffers, leak reports, snapshots and close() while
arena buffers live, the event log, an iteration of 100,000 live buffers, a served iteration's
record_stream calls, and threads sharing one pool.

`in_arena` tells arena buffers by where they lie, beside the figures of `DevicePool.steady_stats`:
an arena region is one pool block of at least 2 MiB, in a best-fit segment, where the pool itself
puts the buffers of these tests (at most 1 MiB) in slabs. Each test checks that the recorded
iteration's buffers are not taken for arena ones, so the tell is checked too."""

from __future__ import annotations

import ctypes
import random
import sys
import threading
import time
from typing import Any, Dict, List, Sequence

import pytest

from vrampool import DeviceBuffer, DevicePool, InvalidSizeError
from vrampool.testing import native

KIB = 1 << 10
MIB = 1 << 20


def in_arena(pool: DevicePool, ptrs: Sequence[int]) -> List[bool]:
    """Per pointer, whether it lies in the steady arena (a region: a best-fit block), not in a
    slab of the pool's own (see the module's docstring)."""
    segments = pool.snapshot()["segments"]

    def strategy(ptr: int) -> str:
        found = [s["strategy"] for s in segments if s["address"] <= ptr < s["address"] + s["total_size"]]
        assert len(found) == 1, f"{ptr:#x} lies in {len(found)} segments"
        return found[0]

    return [strategy(p) != "slab" for p in ptrs]


def read(buf: DeviceBuffer) -> bytes:
    return ctypes.string_at(buf.ptr, buf.size)


# ---- E: scrubbing ----


@pytest.mark.parametrize("scrub", ["on_alloc", "on_free"])
def test_steady_arena_buffers_are_scrubbed_as_the_pools_are(scrub: str) -> None:
    """Ten iterations of ten 64 KiB buffers, each written with a non-zero pattern: every buffer
    reads all zeros when handed out (arena buffers take the previous iteration's bytes), and with
    on_free every freed buffer reads zeros at once."""
    pool = DevicePool("sim", capacity=1 << 30, scrub=scrub)
    sim = native(pool)
    size = 64 * KIB
    zeros = bytes(size)
    served = []
    for it in range(10):
        bufs = [pool.allocate(size) for _ in range(10)]
        for i, buf in enumerate(bufs):
            assert read(buf) == zeros, f"iteration {it}, buffer {i} at {buf.ptr:#x}: a previous user's bytes"
            ctypes.memset(buf.ptr, 0xA0 + i, size)
        served.append(all(in_arena(pool, [b.ptr for b in bufs])))
        for buf in bufs:
            ptr = buf.ptr
            pool.deallocate(buf)
            if scrub == "on_free":
                assert sim.sim_read(ptr, size) == zeros, f"iteration {it}: {ptr:#x} kept its bytes past its free"
    assert served == [False] + [True] * 9, "the first iteration recorded, the others served from the arena"
    assert pool.stats()["allocation.all.current"] == 0
    assert pool.close() == []


@pytest.mark.parametrize("how", ["record_stream", "free_on"])
def test_steady_on_free_scrubs_each_buffer_used_on_its_own_stream_alone(how: str) -> None:
    """In a served iteration, buffer 4 alone goes to another stream (`record_stream`, or a free
    naming it): its region serves nothing more, but every other buffer, used on its own stream
    alone, still reads zeros right after its free. Buffer 4's bytes wait for the other stream."""
    pool = DevicePool("sim", capacity=1 << 30, scrub="on_free")
    sim = native(pool)
    size = 64 * KIB
    for it in range(6):
        bufs = [pool.allocate(size) for _ in range(10)]
        for i, buf in enumerate(bufs):
            ctypes.memset(buf.ptr, 0xA0 + i, size)
        last = it == 5
        if last:
            assert all(in_arena(pool, [b.ptr for b in bufs])), "served from the arena"
            if how == "record_stream":
                pool.record_stream(bufs[4], 9)
        for i, buf in enumerate(bufs):
            ptr = buf.ptr
            pool.deallocate(buf, stream=9 if last and i == 4 and how == "free_on" else None)
            if last and i != 4:
                assert sim.sim_read(ptr, size) == bytes(size), f"buffer {i} at {ptr:#x} kept its bytes past its free"
    assert pool.stats()["allocation.all.current"] == 0


@pytest.mark.parametrize("scrub", ["on_alloc", "on_free"])
def test_steady_scrubbing_holds_when_an_iteration_leaves_its_schedule(scrub: str) -> None:
    """Served iterations that change midway (another size at buffer 5, so the arena buffers live
    then become loose) and come back: no buffer is handed out with an earlier user's bytes."""
    pool = DevicePool("sim", capacity=1 << 30, scrub=scrub)
    sim = native(pool)
    rng = random.Random(5)
    for it in range(12):
        sizes = [64 * KIB] * 10
        if it % 3 == 2:
            sizes[5] = 96 * KIB
        bufs = []
        for i, size in enumerate(sizes):
            buf = pool.allocate(size)
            assert read(buf) == bytes(size), f"iteration {it}, buffer {i}: a previous user's bytes"
            ctypes.memset(buf.ptr, 0x11 * (1 + i % 15), size)
            bufs.append(buf)
        rng.shuffle(bufs)  # freed in another order each iteration: the schedule is left at a free too
        for buf in bufs:
            ptr, size = buf.ptr, buf.size
            pool.deallocate(buf)
            if scrub == "on_free":
                assert sim.sim_read(ptr, size) == bytes(size), f"iteration {it}: {ptr:#x} kept its bytes past its free"
    assert pool.stats()["allocation.all.current"] == 0


@pytest.mark.parametrize("scrub", ["on_alloc", "on_free"])
def test_steady_scrubbing_covers_each_arena_buffers_whole_block(scrub: str) -> None:
    """Iterations taking turns between ten 1024 B buffers and ten of 1000 B, each block written
    whole (a kernel may write up to its block's end): an arena buffer holds its size rounded up
    to 512 B, and all of that is zeros when it is handed out, and with on_free once it is freed,
    as the pool's own blocks are."""
    pool = DevicePool("sim", capacity=1 << 30, scrub=scrub)
    sim = native(pool)
    block = 1024
    served = []
    for it in range(8):
        bufs = [pool.allocate(1024 if it % 2 == 0 else 1000) for _ in range(10)]
        for i, buf in enumerate(bufs):
            assert sim.sim_read(buf.ptr, block) == bytes(block), f"iteration {it}, buffer {i}: a previous user's bytes"
            ctypes.memset(buf.ptr, 0x5A, block)
        served.append(all(in_arena(pool, [b.ptr for b in bufs])))
        for buf in bufs:
            ptr = buf.ptr
            pool.deallocate(buf)
            if scrub == "on_free":
                assert sim.sim_read(ptr, block) == bytes(block), f"iteration {it}: {ptr:#x} kept its bytes past its free"
    assert served[2:] == [True] * 6, served


# ---- F: leak reports, snapshots, close ----

SIZES = [64 * KIB, 1000, 3 * KIB, 100, 70_000, 512, 4 * KIB, 200_000, 777, MIB]


def warm_up(pool: DevicePool, iterations: int = 2) -> None:
    """`iterations` iterations of SIZES, each freed whole: the next one is served from the arena."""
    for _ in range(iterations):
        bufs = [pool.allocate(n) for n in SIZES]
        for buf in bufs:
            pool.deallocate(buf)


def test_steady_leak_report_snapshot_and_close_show_arena_buffers() -> None:
    """Ten live arena buffers: leak_report lists exactly them (address, size, age, the stack of
    the allocate call), snapshot shows them as active blocks at their addresses; freed, nothing
    is a leak (an idle arena is none) and close() returns no leaks."""
    pool = DevicePool("sim", capacity=1 << 30, track_leaks=True)
    warm_up(pool)
    live: List[DeviceBuffer] = []
    line = sys._getframe().f_lineno + 2
    for n in SIZES:
        live.append(pool.allocate(n))
    assert all(in_arena(pool, [b.ptr for b in live])), "the third iteration is served from the arena"
    expected = sorted((b.ptr, b.size) for b in live)
    report = pool.leak_report()
    assert [(r["ptr"], r["requested"]) for r in report] == expected
    for r in report:
        assert r["size"] >= r["requested"] and r["stream"] == 0, r
        frame = r["stack"][-1] if r["stack"] else None
        assert frame is not None and (frame.name, frame.lineno) == ("test_steady_leak_report_snapshot_and_close_show_arena_buffers", line), r
    active = sorted(
        (b["address"], b["requested_size"])
        for s in pool.snapshot()["segments"]
        for b in s["blocks"]
        if b["state"] == "active_allocated"
    )
    assert active == expected, "snapshot() shows each live arena buffer as its own active block, and nothing else"
    ages = [r["age_s"] for r in report]
    for buf in live:
        pool.deallocate(buf)
    assert pool.leak_report() == []
    assert pool.stats()["allocation.all.current"] == 0
    assert pool.close() == []
    assert all(age is not None and age >= 0 for age in ages), f"track_leaks=True, yet arena buffers have no age: {ages}"


def test_steady_close_lists_exactly_the_arena_buffers_still_live() -> None:
    """Three arena buffers of a served iteration still live at close(): exactly those three are
    its leaks, with their stacks; a second close() lists none, as the pool's blocks are listed once."""
    pool = DevicePool("sim", capacity=1 << 30, track_leaks=True)
    warm_up(pool)
    bufs: List[DeviceBuffer] = []
    for n in SIZES:
        bufs.append(pool.allocate(n))
    assert all(in_arena(pool, [b.ptr for b in bufs]))
    kept = bufs[2:5]
    for buf in bufs[:2] + bufs[5:]:
        pool.deallocate(buf)
    leaks = pool.close()
    assert sorted((r["ptr"], r["requested"]) for r in leaks) == sorted((b.ptr, b.size) for b in kept)
    name = "test_steady_close_lists_exactly_the_arena_buffers_still_live"
    assert all(r["stack"] is not None and r["stack"][-1].name == name for r in leaks), leaks
    assert pool.close() == []


def active_block_bytes(pool: DevicePool) -> int:
    return sum(b["size"] for s in pool.snapshot()["segments"] for b in s["blocks"] if b["state"] == "active_allocated")


@pytest.mark.parametrize("elsewhere", [False, True])
def test_steady_stats_count_arena_buffers_as_blocks_and_their_peak_not_the_region(elsewhere: bool) -> None:
    """Served iterations of SIZES (one buffer freed midway, so the peak is inside the iteration;
    `elsewhere`, the 4 KiB one used on another stream, so the pool serves it in every iteration):
    allocated bytes are the snapshot's active blocks at every step; the peak seen by reading at
    every step is the peak read once after an iteration (the region's idle bytes count in
    neither); blocks and requested bytes likewise."""
    pool = DevicePool("sim", capacity=1 << 30)
    keys = ["allocated_bytes.all", "requested_bytes.all", "allocation.all"]

    def iteration(watch: bool) -> Dict[str, int]:
        seen = {k: 0 for k in keys}

        def look() -> None:
            stats = pool.stats()
            assert stats["allocated_bytes.all.current"] == active_block_bytes(pool)
            for k in keys:
                seen[k] = max(seen[k], stats[f"{k}.current"])

        bufs = []
        for i, n in enumerate(SIZES):
            bufs.append(pool.allocate(n))
            if elsewhere and n == 4 * KIB:
                pool.record_stream(bufs[-1], 7)
            if i == 5:
                pool.deallocate(bufs.pop(0))
            if watch:
                look()
        for buf in bufs:
            pool.deallocate(buf)
        if watch:
            look()
        return seen

    iteration(False)
    iteration(False)
    pool.reset_peak_stats()
    seen = iteration(True)
    assert pool.stats()["allocated_bytes.all.peak"] == seen["allocated_bytes.all"]
    pool.reset_peak_stats()
    assert pool.stats()["allocated_bytes.all.peak"] == 0, "a reset starts from what is live: nothing"
    iteration(False)
    after = pool.stats()
    for k in keys:
        assert after[f"{k}.peak"] == seen[k], (k, after[f"{k}.peak"], seen)
    steady = pool.steady_stats()
    assert steady is not None and steady["replayed_iterations"] >= 3, steady
    assert seen["allocated_bytes.all"] < steady["arena_bytes"], "the region's idle bytes are not counted"


def test_steady_running_totals_agree_with_the_current_and_with_the_pool_alone() -> None:
    """Iterations of sizes the pool hands out at their size rounded up to 512 B, served from the
    arena from the second on: for bytes (as blocks, active and as requested) and for blocks,
    allocated - freed is the current after every call, and at the end every figure is the one the
    pool alone gives the same program."""
    sizes = [1000, 4 * KIB, 513, 3000, 100, 2 * KIB, 777, 4000]
    counters = ["allocated_bytes.all", "active_bytes.all", "requested_bytes.all", "allocation.all"]

    def run(steady: bool) -> Dict[str, int]:
        pool = DevicePool("sim", capacity=1 << 30, steady=steady)

        def check() -> None:
            stats = pool.stats()
            for c in counters:
                assert stats[f"{c}.allocated"] - stats[f"{c}.freed"] == stats[f"{c}.current"], (c, stats)

        for _ in range(4):
            bufs = []
            for n in sizes:
                bufs.append(pool.allocate(n))
                check()
            for buf in bufs:
                pool.deallocate(buf)
                check()
        assert (pool.steady_stats() or {}).get("planned_allocations", 0) == (3 * len(sizes) if steady else 0)
        stats = pool.stats()
        return {f"{c}.{f}": stats[f"{c}.{f}"] for c in counters for f in ("allocated", "freed", "current", "peak")}

    assert run(True) == run(False)


def test_a_request_refused_in_a_served_iteration_costs_it_nothing() -> None:
    """A request for more than one block can be (128 TiB) midway through served iterations is
    refused, and each iteration goes on from the arena: no fallback, every buffer in the arena."""
    pool = DevicePool("sim", capacity=1 << 30)
    served = []
    for it in range(5):
        bufs = []
        for i, n in enumerate(SIZES):
            bufs.append(pool.allocate(n))
            if it >= 2 and i == 3:
                with pytest.raises(InvalidSizeError):
                    pool.allocate(1 << 48)
        served.append(all(in_arena(pool, [b.ptr for b in bufs])))
        for buf in bufs:
            pool.deallocate(buf)
    steady = pool.steady_stats()
    assert steady is not None
    assert (served, steady["fallbacks"]) == ([False, True, True, True, True], 0), steady


# ---- G: the event log ----


def test_steady_event_log_has_every_arena_buffer_and_not_the_region() -> None:
    """Four iterations of ten allocations under record_events: forty alloc and forty free events,
    at the buffers' own addresses, each allocation logged with the same size whichever served
    it (a trace must not change when the arena takes over), and no event of a region."""
    pool = DevicePool("sim", capacity=1 << 30, record_events=True)
    pool.take_events()
    handed: List[List[int]] = []
    served = []
    for _ in range(4):
        bufs = [pool.allocate(n) for n in SIZES]
        handed.append([b.ptr for b in bufs])
        served.append(all(in_arena(pool, handed[-1])))
        for buf in bufs:
            pool.deallocate(buf)
    assert served == [False, True, True, True]
    events = pool.take_events()
    allocs = [(addr, size) for _, kind, addr, size, _ in events if kind == "alloc"]
    frees = [(addr, size) for _, kind, addr, size, _ in events if kind == "free"]
    assert (len(allocs), len(frees)) == (40, 40), (len(allocs), len(frees))
    assert [a for a, _ in allocs] == [p for it in handed for p in it], "an alloc event per buffer, in order, at its address"
    assert sorted(allocs) == sorted(frees), "each buffer freed with the size it was allocated with"
    sizes = [[size for _, size in allocs[10 * it : 10 * it + 10]] for it in range(4)]
    assert all(s >= n for s, n in zip(sizes[0], SIZES))
    assert sizes[1:] == [sizes[0]] * 3, f"sizes logged by the pool (recorded iteration) and by the arena differ: {sizes[0]} vs {sizes[1]}"


def test_steady_event_log_with_buffers_of_whole_blocks() -> None:
    """As above with sizes the pool hands out whole (multiples of 512 bytes): every event is a
    buffer's (address, requested size), none the region's 2 MiB block."""
    pool = DevicePool("sim", capacity=1 << 30, record_events=True)
    sizes = [64 * KIB] * 5 + [4 * KIB] * 5
    pool.take_events()
    expected = []
    for _ in range(4):
        bufs = [pool.allocate(n) for n in sizes]
        expected += [(b.ptr, b.size) for b in bufs]
        for buf in bufs:
            pool.deallocate(buf)
    events = pool.take_events()
    assert sorted((a, s) for _, k, a, s, _ in events if k == "alloc") == sorted(expected)
    assert sorted((a, s) for _, k, a, s, _ in events if k == "free") == sorted(expected)
    assert all(s < 2 * MIB for _, k, _, s, _ in events if k in ("alloc", "free"))


# ---- H: many live buffers ----


def many_buffers(pool: DevicePool, sizes: Sequence[int], order: Sequence[int]) -> Dict[str, Any]:
    """One iteration: every size allocated, each buffer tagged at both ends, then freed in `order`
    after its tags are checked (an overlap with another live buffer overwrites one). The times of
    the allocations, the frees and the last free, and whether buffer 0 came from the arena."""
    t0 = time.perf_counter()
    bufs = [pool.allocate(n) for n in sizes]
    t1 = time.perf_counter()
    for i, buf in enumerate(bufs):
        tag = i.to_bytes(8, "little")
        ctypes.memmove(buf.ptr, tag, 8)
        ctypes.memmove(buf.ptr + buf.size - 8, tag, 8)
    arena = in_arena(pool, [bufs[0].ptr])[0]
    assert len({b.ptr for b in bufs}) == len(bufs)
    t2 = time.perf_counter()
    for i in order[:-1]:
        buf = bufs[i]
        tag = i.to_bytes(8, "little")
        assert ctypes.string_at(buf.ptr, 8) == tag and ctypes.string_at(buf.ptr + buf.size - 8, 8) == tag, f"buffer {i} overwritten"
        pool.deallocate(buf)
    t3 = time.perf_counter()
    pool.deallocate(bufs[order[-1]])
    t4 = time.perf_counter()
    assert pool.stats()["allocation.all.current"] == 0
    return {"allocate_s": round(t1 - t0, 3), "frees_s": round(t3 - t2, 3), "last_free_s": round(t4 - t3, 4), "arena": arena}


@pytest.mark.parametrize(("n", "orders"), [(100_000, "one order"), (30_000, "one order"), (30_000, "a new order each time")])
def test_steady_an_iteration_of_many_live_buffers_freed_shuffled(n: int, orders: str, record_property: Any) -> None:
    """n small live buffers freed in a shuffled order, three times (30,000 fit the recording
    limit, so they are planned and served, and a new order leaves the schedule at a free with
    them all live; 100,000 do not): each run completes, no two live buffers overlap, and the
    timings (last free included) are reported, not asserted."""
    pool = DevicePool("sim", capacity=1 << 30)
    rng = random.Random(n)
    sizes = [rng.choice([64, 200, 512, 1000, 4096]) for _ in range(n)]
    order = list(range(n))
    runs = []
    for it in range(3):
        if it == 0 or orders != "one order":
            rng.shuffle(order)
        runs.append(many_buffers(pool, sizes, order))
    record_property("runs", runs)
    print(f"\n{n} live buffers, {orders}: {runs}")
    if n == 30_000:
        assert [r["arena"] for r in runs] == [False, True, True], runs
    assert pool.close() == []


def test_steady_record_stream_on_own_stream_keeps_the_iteration_served() -> None:
    """Tensor.record_stream(current_stream()) on every buffer of a served iteration: a no-op for an
    arena buffer of that very stream (looked up by its address, not through every live buffer of
    the schedule), and the iteration stays served to its end."""
    pool = DevicePool("sim", capacity=1 << 30)
    for it in range(4):
        bufs = [pool.allocate(512, stream=5) for _ in range(8000)]
        assert in_arena(pool, [bufs[0].ptr]) == [it > 0], "recorded once, then served"
        for buf in bufs if it >= 2 else []:
            pool.record_stream(buf, 5)
        for buf in bufs:
            pool.deallocate(buf, stream=5)
    stats = pool.steady_stats()
    assert stats is not None
    assert (stats["recorded_iterations"], stats["replayed_iterations"], stats["fallbacks"]) == (1, 3, 0)
    pool.close()


# ---- I: threads ----


@pytest.mark.parametrize("streams", ["one stream", "a stream each"])
def test_steady_threads_sharing_one_pool_never_share_bytes(streams: str) -> None:
    """Four threads, each repeating its own loop (allocate eight buffers, fill each with its own
    byte, check them all, free them), on one pool whose arena has a schedule for that loop
    already, switching threads every few microseconds: every buffer still holds its byte when
    freed, so no two live buffers overlapped; and the arena served some of them meanwhile."""
    pool = DevicePool("sim", capacity=1 << 30)
    sizes = [4 * KIB, 64 * KIB, 1000, 16 * KIB, 512, 200_000, 8 * KIB, 3000]
    from_arena = [0] * 4

    def loop(thread: int, rounds: int) -> None:
        stream = 0 if streams == "one stream" else 100 + thread
        for r in range(rounds):
            bufs = []
            for i, n in enumerate(sizes):
                buf = pool.allocate(n, stream=stream)
                ctypes.memset(buf.ptr, (thread * 64 + r * 8 + i) % 251 + 1, n)
                bufs.append(buf)
            if r % 2 == 0:
                from_arena[thread] += sum(in_arena(pool, [b.ptr for b in bufs]))
            for i, buf in enumerate(bufs):
                value = (thread * 64 + r * 8 + i) % 251 + 1
                assert read(buf) == bytes([value]) * buf.size, f"thread {thread}, round {r}, buffer {i} at {buf.ptr:#x} overwritten"
            for buf in bufs:
                pool.deallocate(buf)

    for t in range(4):  # a schedule per stream, served from here on
        loop(t, 3)
    from_arena[:] = [0] * 4
    errors: List[BaseException] = []
    start = threading.Barrier(4)

    def work(t: int) -> None:
        try:
            start.wait()
            loop(t, 500)
        except BaseException as e:  # re-raised below
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
    print(f"\n{streams}: arena buffers among the sampled rounds' (of 2000 a thread): {from_arena}")
    assert sum(from_arena) > 0, "the arena served none of the threads' buffers: the test tried nothing"
    assert pool.stats()["allocation.all.current"] == 0
    assert pool.close() == []
