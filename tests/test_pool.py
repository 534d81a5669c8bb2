"""DevicePool on the simulated device: allocation, errors, stats, and memory written through the
pointers (host-backed), so overlapping buffers would show."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path

import pytest

import vrampool
from vrampool import DevicePool
from vrampool._native import STRATEGIES
from vrampool.testing import native

MIB = 1 << 20
def test_allocate_write_read_and_free(pool: DevicePool) -> None:
    bufs = [pool.allocate(n) for n in (1, 700, 4096, 3 * MIB, 70 * MIB)]
    for i, buf in enumerate(bufs):
        assert buf.ptr % 512 == 0 and buf.size >= 1 and not buf.freed
        ctypes.memset(buf.ptr, i + 1, buf.size)
    for i, buf in enumerate(bufs):
        # Every byte still holds its own buffer's value: no two live buffers overlap.
        assert ctypes.string_at(buf.ptr, buf.size) == bytes([i + 1]) * buf.size
        assert native(pool).sim_read(buf.ptr, 1) == bytes([i + 1])
    stats = pool.stats()
    assert stats["allocation.all.current"] == 5
    assert stats["requested_bytes.all.current"] == 1 + 700 + 4096 + 3 * MIB + 70 * MIB
    for buf in bufs:
        pool.deallocate(buf)
        assert buf.freed
    assert pool.stats()["allocated_bytes.all.current"] == 0
    reserved = pool.stats()["reserved_bytes.all.current"]
    assert pool.trim() == reserved > 0
    assert pool.stats()["reserved_bytes.all.current"] == 0


def test_stats_give_counts_as_ints_and_ratios_as_floats_by_their_type() -> None:
    pool = DevicePool("sim", capacity=1 << 30, strategy="buddy")
    # A 64 MiB block fills the segment cut for it: nothing free, reserved equals allocated.
    buf = pool.allocate(64 * MIB)
    stats = pool.stats()
    assert stats["reserved_bytes.all.current"] == stats["allocated_bytes.all.current"] == 64 * MIB
    assert stats["num_ooms"] == 0 and type(stats["num_ooms"]) is int
    assert stats["free_bytes"] == 0 and type(stats["free_bytes"]) is int
    assert stats["reserved_per_allocated"] == 1.0 and type(stats["reserved_per_allocated"]) is float
    assert stats["fragmentation"] == 0.0 and type(stats["fragmentation"]) is float
    ratios = {"fragmentation", "reserved_per_allocated"}
    assert all(type(v) is (float if k in ratios else int) for k, v in stats.items()), stats
    pool.deallocate(buf)


def test_bad_input_raises_python_exceptions_and_loses_nothing(pool: DevicePool) -> None:
    keep = pool.allocate(4096)
    before = pool.stats()
    with pytest.raises(ValueError):
        pool.allocate(0)
    with pytest.raises(ValueError):
        pool.allocate(-5)
    with pytest.raises(ValueError):
        pool.allocate(1 << 80)
    with pytest.raises(TypeError):
        pool.allocate("4096")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pool.allocate(4096, stream="default")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pool.deallocate(keep.ptr)  # type: ignore[arg-type]
    other = DevicePool("sim", capacity=1 << 30)
    with pytest.raises(ValueError, match="another pool"):
        other.deallocate(keep)
    assert pool.stats() == before
    # More than the device holds is out of memory (what MemoryError catches), counted as one.
    with pytest.raises(vrampool.OutOfMemoryError, match="tried to allocate 2.00 GiB"):
        pool.allocate(2 << 30)
    assert pool.stats() == {**before, "num_ooms": before["num_ooms"] + 1}
    pool.deallocate(keep)
    with pytest.raises(vrampool.InvalidFreeError):
        pool.deallocate(keep)
    pool.close()
    with pytest.raises(vrampool.PoolClosedError):
        pool.allocate(512)


def test_out_of_memory_is_a_memory_error_with_figures() -> None:
    pool = DevicePool("sim", capacity=64 * MIB, strategy="best_fit")
    big = pool.allocate(60 * MIB)
    with pytest.raises(MemoryError) as info:
        pool.allocate(30 * MIB)
    assert isinstance(info.value, vrampool.OutOfMemoryError)
    assert "tried to allocate 30.00 MiB" in str(info.value)
    assert pool.stats()["num_ooms"] == 1
    pool.deallocate(big)
    pool.allocate(30 * MIB)


def test_device_fault_is_reported_and_pool_recovers() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    native(pool).sim_fail_alloc_in(1)
    with pytest.raises(vrampool.DeviceError, match="injected"):
        pool.allocate(MIB)
    assert pool.allocate(MIB).size == MIB


def test_a_free_the_device_refuses_leaves_the_buffer_live_to_free_again() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    buf = pool.allocate(MIB, stream=1)
    native(pool).sim_fail_record_in(1)
    with pytest.raises(vrampool.DeviceError, match="injected"):
        pool.deallocate(buf, stream=2)  # another stream used it last: the free records an event
    assert not buf.freed
    assert pool.stats()["allocated_bytes.all.current"] == MIB
    pool.deallocate(buf, stream=2)
    assert buf.freed and pool.stats()["allocated_bytes.all.current"] == 0


def test_buffers_are_freed_once_when_collected() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    buf = pool.allocate(10_000)
    buf.free()
    buf.free()  # harmless: already freed
    assert pool.stats()["allocation.all.freed"] == 1
    for _ in range(100):
        pool.allocate(5000)  # dropped at once
    gc.collect()
    stats = pool.stats()
    assert stats["allocation.all.current"] == 0
    assert stats["allocation.all.freed"] == 101


def test_context_manager_reports_leaks() -> None:
    with DevicePool("sim", capacity=1 << 30, track_leaks=True) as pool:
        leak = pool.allocate(123)
        pool.deallocate(pool.allocate(4096))  # freed: no leak
    assert pool.closed
    # The leak report, read after the pool closed, names the one block still live.
    [report] = pool.leak_report()
    assert (report["ptr"], report["size"], report["requested"], report["stream"]) == (leak.ptr, 512, 123, 0)
    assert report["age_s"] is not None and 0 <= report["age_s"] < 60
    assert report["stack"][-1].name == "test_context_manager_reports_leaks"
    assert leak.ptr  # still readable; the pool is closed
    with pytest.raises(vrampool.PoolClosedError):
        leak.free()
    assert [b["ptr"] for b in pool.leak_report()] == [leak.ptr], "a refused free loses nothing"


def test_streams_keep_blocks_apart() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    native(pool).sim_set_auto_complete(False)
    a = pool.allocate(4096, stream=1)
    pool.record_stream(a, 2)
    ptr = a.ptr
    pool.deallocate(a)
    b = pool.allocate(4096, stream=1)
    assert b.ptr != ptr  # stream 2 may still read it
    native(pool).sim_complete_stream(2)
    c = pool.allocate(4096, stream=1)
    assert c.ptr == ptr


def test_many_threads_free_exactly_once(run_in_threads) -> None:
    pool = DevicePool("sim", capacity=4 << 30)

    def work(seed: int) -> None:
        for i in range(2000):
            buf = pool.allocate(512 + (seed * 7919 + i * 104729) % (2 * MIB))
            ctypes.memset(buf.ptr, seed, min(buf.size, 64))
            if i % 3:
                pool.deallocate(buf)

    run_in_threads(work, 8)
    gc.collect()
    stats = pool.stats()
    assert stats["allocation.all.current"] == 0
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"] == 8 * 2000


def test_options_and_unknown_ones() -> None:
    pool = DevicePool("sim", capacity=1 << 30, alignment=4096, round_up_divisions=4, limit=0.5)
    assert pool.allocate(5000).ptr % 4096 == 0
    with pytest.raises(ValueError, match="strategy"):
        DevicePool("sim", strategy="fastest")
    with pytest.raises(TypeError):
        DevicePool("sim", turbo=True)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        DevicePool("sim", alignment=1000)
    with pytest.raises(ValueError, match="ordinal"):
        DevicePool(-1)
    with pytest.raises(ValueError, match="ordinal"):
        DevicePool("gpu")  # type: ignore[arg-type]


def test_conf_text_comes_before_the_keywords_and_is_checked() -> None:
    assert DevicePool("sim", strategy=None, conf="strategy:best_fit,alignment:4096").strategy == "best_fit"
    assert DevicePool("sim", conf="strategy:best_fit").strategy == "hybrid", "a keyword wins"
    assert DevicePool("sim", strategy=None, conf="alignment:4096").allocate(5000).ptr % 4096 == 0
    with pytest.raises(ValueError, match="ipc_handles"):
        DevicePool("sim", ipc_handles="fd")
    with pytest.raises(ValueError, match="unknown configuration key"):
        DevicePool("sim", conf="device:sim")
    assert vrampool.options.pool_pairs("device:cuda, sim_capacity:1GB,ipc:true ,ipc_handles=legacy") == "ipc:true,ipc_handles:legacy"
    assert vrampool.options.pool_pairs("") == ""


def test_cuda_pool_without_a_driver_is_a_clear_error() -> None:
    try:
        pool = DevicePool(0)
    except vrampool.DeviceError as e:
        assert "CUDA" in str(e) or "device" in str(e)
        return
    # A GPU is present: the pool works.
    buf = pool.allocate(1 << 20)
    assert buf.ptr != 0
    pool.deallocate(buf)


def test_snapshot_tiles_each_segment() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    bufs = [pool.allocate(n) for n in (1000, 5 * MIB, 100 * MIB)]
    segments = pool.snapshot()["segments"]
    for seg in segments:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert seg["strategy"] in ("slab", "best_fit", "buddy")
        starts = [b["address"] for b in seg["blocks"]]
        assert starts == sorted(starts) and starts[0] == seg["address"]
    active = [b for seg in segments for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert sorted(b["address"] for b in active) == sorted(b.ptr for b in bufs)
    assert sorted(b["requested_size"] for b in active) == [1000, 5 * MIB, 100 * MIB]


def test_demo_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vrampool.whatif.cli import main

    # Into a temporary folder: the default `vrampool-demo/` in the working directory is the
    # user's (and the figures in BENCHMARKS.md are read from its x8 traces).
    assert main(["demo", "--steps", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for strategy in STRATEGIES:
        assert strategy in out


def test_expandable_segments_grow_in_place_and_can_be_turned_off() -> None:
    grown = DevicePool("sim", capacity=1 << 30, strategy="best_fit", host_backed=False)
    plain = DevicePool("sim", capacity=1 << 30, strategy="best_fit", host_backed=False, expandable=False)
    for pool in (grown, plain):
        bufs = [pool.allocate(30 * MIB) for _ in range(4)]
        segments = pool.snapshot()["segments"]
        assert sum(b["state"] == "active_allocated" for s in segments for b in s["blocks"]) == 4
        del bufs
    assert all(s["is_expandable"] for s in grown.snapshot()["segments"])
    assert not any(s["is_expandable"] for s in plain.snapshot()["segments"])
    assert len(grown.snapshot()["segments"]) < len(plain.snapshot()["segments"])
    with pytest.raises(TypeError):
        DevicePool("sim", expandable="yes")  # type: ignore[arg-type]
