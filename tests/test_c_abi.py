"""The C ABI PyTorch's CUDAPluggableAllocator loads (`vrampool_malloc`, `vrampool_free` and the
optional hooks), called through ctypes against the simulated device: allocate, free, trim,
memory fraction, record_stream, private pools, bad input, the out-of-memory report, and the
C++ exception a failed allocation throws under `install()`. Needs neither torch nor a GPU."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
import textwrap
import threading
from ctypes import POINTER, c_char_p, c_double, c_int, c_size_t, c_uint64, c_void_p
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest

import vrampool.torch
from vrampool import _native

MIB = 1 << 20
CAPACITY = 256 * MIB


class MempoolId(ctypes.Structure):
    """`c10::cuda::MempoolId_t`: a pair of unsigned long long, passed by value."""

    _fields_ = [("first", c_uint64), ("second", c_uint64)]


def load_abi() -> ctypes.CDLL:
    """The extension module as a plain shared library, the way CUDAPluggableAllocator loads it."""
    lib = ctypes.CDLL(_native.__file__)
    sigs = {
        "vrampool_malloc": (c_void_p, [c_size_t, c_int, c_void_p]),
        "vrampool_free": (None, [c_void_p, c_size_t, c_int, c_void_p]),
        "vrampool_init": (None, [c_int]),
        "vrampool_reset": (None, []),
        "vrampool_memory_fraction": (None, [c_double, c_int]),
        "vrampool_base_alloc": (c_void_p, [c_void_p, POINTER(c_size_t)]),
        "vrampool_record_stream": (None, [c_void_p, c_void_p]),
        "vrampool_begin_allocate_to_pool": (None, [c_int, MempoolId, c_void_p]),
        "vrampool_end_allocate_to_pool": (None, [c_int, MempoolId]),
        "vrampool_release_pool": (None, [c_int, MempoolId]),
        "vrampool_configure": (c_int, [c_char_p]),
        "vrampool_last_error": (c_size_t, [c_char_p, c_size_t]),
        "vrampool_planned_enable": (None, [c_int]),
        "vrampool_planned_step": (None, [c_uint64]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


LIB = load_abi()


def stats(device: int = 0) -> Dict[str, Any]:
    return _native.abi_stats(device)


def counters() -> Dict[str, Any]:
    return _native.abi_counters()


def segments() -> List[Dict[str, Any]]:
    return _native.abi_snapshot()["segments"]


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    """A fresh registry on a 256 MiB simulated device, whatever VRAMPOOL_CONF says. (Small: the
    host-backed simulation may zero-fill a whole reservation.)"""
    monkeypatch.delenv("VRAMPOOL_CONF", raising=False)
    _native._abi_reset()
    _native.configure(f"device:sim,sim_capacity:{CAPACITY}")
    yield LIB
    _native._abi_reset()


def configure(text: str) -> None:
    _native._abi_reset()
    _native.configure(text)


def test_every_entry_is_exported_under_its_name() -> None:
    expected = {
        "malloc", "torch_malloc", "free", "init", "reset", "memory_fraction", "base_alloc", "record_stream",
        "begin_allocate_to_pool", "end_allocate_to_pool", "release_pool",
    }
    assert set(_native.ABI_SYMBOLS) == expected
    for symbol in list(_native.ABI_SYMBOLS.values()) + ["vrampool_configure", "vrampool_last_error"]:
        assert ctypes.cast(getattr(LIB, symbol), c_void_p).value, symbol


def test_malloc_free_round_trip_and_stats(sim: ctypes.CDLL) -> None:
    p = sim.vrampool_malloc(4096, 0, None)
    assert p and p % 512 == 0
    ctypes.memset(p, 0xAB, 4096)  # host-backed: the memory is really there
    assert ctypes.string_at(p + 4095, 1) == b"\xab"
    s = stats()
    assert s["allocated_bytes.all.current"] >= 4096
    assert s["requested_bytes.all.current"] == 4096
    assert s["allocation.all.current"] == 1
    assert s["reserved_bytes.all.current"] >= 4096
    assert _native.configuration()["devices"] == [0]
    sim.vrampool_free(p, 4096, 0, None)
    s = stats()
    assert s["allocated_bytes.all.current"] == 0 and s["allocation.all.freed"] == 1
    assert _native.last_error() is None
    assert counters()["refused_frees"] == 0


def test_size_zero_is_null_without_an_error(sim: ctypes.CDLL) -> None:
    assert sim.vrampool_malloc(0, 0, None) is None
    sim.vrampool_free(None, 0, 0, None)  # PyTorch frees what it got: a no-op
    assert _native.last_error() is None
    assert counters()["failed_mallocs"] == 0


def test_streams_get_their_own_blocks_and_legacy_is_default(sim: ctypes.CDLL) -> None:
    a = sim.vrampool_malloc(1 * MIB, 0, c_void_p(7))
    b = sim.vrampool_malloc(1 * MIB, 0, c_void_p(1))  # CU_STREAM_LEGACY: the default stream
    assert a and b and a != b
    by_addr = {blk["address"]: seg["stream"] for seg in segments() for blk in seg["blocks"] if blk["state"] == "active_allocated"}
    assert by_addr[a] == 7 and by_addr[b] == 0
    sim.vrampool_free(a, 1 * MIB, 0, c_void_p(7))
    sim.vrampool_free(b, 1 * MIB, 0, c_void_p(1))
    assert stats()["allocated_bytes.all.current"] == 0
    assert _native.last_error() is None


def test_reset_trims_every_free_segment(sim: ctypes.CDLL) -> None:
    ptrs = [sim.vrampool_malloc(size, 0, None) for size in (4096, 3 * MIB, 80 * MIB)]
    assert all(ptrs)
    for p, size in zip(ptrs, (4096, 3 * MIB, 80 * MIB)):
        sim.vrampool_free(p, size, 0, None)
    before = stats()
    assert before["reserved_bytes.all.current"] == before["reserved_bytes.all.peak"] > 0
    sim.vrampool_reset()
    after = stats()
    assert after["reserved_bytes.all.current"] == 0
    assert after["num_device_free"] > before["num_device_free"]
    assert after["reserved_bytes.all.peak"] == before["reserved_bytes.all.peak"]
    assert _native.last_error() is None


def test_memory_fraction_caps_the_pool(sim: ctypes.CDLL) -> None:
    p = sim.vrampool_malloc(4096, 0, None)  # the pool exists
    assert stats()["capacity_bytes"] == CAPACITY
    sim.vrampool_memory_fraction(0.25, 0)
    assert stats()["capacity_bytes"] == CAPACITY // 4
    assert sim.vrampool_malloc(128 * MIB, 0, None) is None
    oom = _native.last_oom()
    assert oom["requested"] == 128 * MIB and oom["too_large"] and oom["limit"] == CAPACITY // 4
    sim.vrampool_memory_fraction(1.0, 0)
    q = sim.vrampool_malloc(128 * MIB, 0, None)
    assert q
    sim.vrampool_free(q, 128 * MIB, 0, None)
    # A fraction before the device's first allocation makes its pool with the cap.
    sim.vrampool_memory_fraction(0.5, 3)
    assert stats(3)["capacity_bytes"] == CAPACITY // 2
    # Fraction 0 allows nothing.
    sim.vrampool_memory_fraction(0.0, 0)
    assert sim.vrampool_malloc(4096, 0, None) is None
    sim.vrampool_memory_fraction(1.0, 0)
    sim.vrampool_free(p, 4096, 0, None)


@pytest.mark.parametrize("fraction", [-0.5, 1.5, math.nan, math.inf])
def test_bad_fraction_is_refused(sim: ctypes.CDLL, fraction: float) -> None:
    sim.vrampool_memory_fraction(0.5, 0)
    sim.vrampool_memory_fraction(fraction, 0)
    assert stats()["capacity_bytes"] == CAPACITY // 2
    assert "fraction must lie in [0, 1]" in _native.last_error()
    assert counters()["other_errors"] == 1
    sim.vrampool_memory_fraction(0.5, -1)  # no such device
    assert "not a device ordinal" in _native.last_error()


def test_record_stream_defers_reuse_until_that_stream_passes(sim: ctypes.CDLL) -> None:
    size = 64 * 1024
    p = sim.vrampool_malloc(size, 0, None)
    _native.abi_sim_control(0, auto_complete=False)
    sim.vrampool_record_stream(p, c_void_p(5))
    sim.vrampool_free(p, size, 0, None)
    s = stats()
    assert s["deferred_frees"] == 1
    assert s["allocated_bytes.all.current"] == 0 and s["active_bytes.all.current"] >= size
    states = {b["address"]: b["state"] for seg in segments() for b in seg["blocks"]}
    assert states[p] == "active_pending_free"
    held = [sim.vrampool_malloc(size, 0, None) for _ in range(4)]
    assert p not in held, "a block used on stream 5 was reused before stream 5 passed its free"
    for q in held:
        sim.vrampool_free(q, size, 0, None)
    _native.abi_sim_control(0, complete_stream=5)
    again = [sim.vrampool_malloc(size, 0, None) for _ in range(6)]
    assert p in again, "the block never came back after stream 5 passed its free"
    for q in again:
        sim.vrampool_free(q, size, 0, None)
    assert stats()["active_bytes.all.current"] == 0
    assert _native.last_error() is None


def test_record_stream_of_a_foreign_pointer_is_refused(sim: ctypes.CDLL) -> None:
    buf = ctypes.create_string_buffer(64)
    sim.vrampool_record_stream(ctypes.addressof(buf), c_void_p(5))
    assert counters()["refused_record_streams"] == 1
    assert "not a live block" in _native.last_error()


def test_bad_input_is_refused_without_crashing(sim: ctypes.CDLL) -> None:
    p = sim.vrampool_malloc(4096, 0, None)
    foreign = ctypes.create_string_buffer(4096)
    sim.vrampool_free(ctypes.addressof(foreign), 4096, 0, None)
    assert "not a live block" in _native.last_error()
    sim.vrampool_free(p, 1234, 0, None)  # wrong size: refused, the block stays live
    assert "allocated with 4096 bytes" in _native.last_error()
    assert stats()["allocation.all.current"] == 1
    sim.vrampool_free(p, 4096, 0, None)
    sim.vrampool_free(p, 4096, 0, None)  # double free
    sim.vrampool_free(p + 512, 0, 0, None)  # inside nothing live, size unknown
    sim.vrampool_free(p, 4096, 7, None)  # a device with no pool
    assert "no vrampool pool on device 7" in _native.last_error()
    assert counters()["refused_frees"] == 5
    for size in (1 << 60, (1 << 64) - 1):
        assert sim.vrampool_malloc(size, 0, None) is None
    assert _native.last_oom()["too_large"]
    for device in (-1, 128, 1 << 30):
        assert sim.vrampool_malloc(4096, device, None) is None
        assert "not a device ordinal" in _native.last_error()
    assert counters()["failed_mallocs"] == 5
    s = stats()
    assert s["allocated_bytes.all.current"] == 0 and s["allocation.all.current"] == 0
    # Still serving.
    q = sim.vrampool_malloc(4096, 0, None)
    assert q
    sim.vrampool_free(q, 4096, 0, None)
    assert counters()["panics"] == 0


def test_out_of_memory_names_live_buffers_that_keep_the_steady_arena(sim: ctypes.CDLL) -> None:
    """A served loop (one 4 KiB buffer, ten of 2 MiB) whose last step keeps the small one, as a
    loss kept for logging: the arena's region stays out of the pool's reach. The report counts the
    buffer as allocated, the arena's idle bytes as the arena's (not as free), and says what to free."""
    configure("device:sim,sim_capacity:40MB")
    sizes = [4096] + [2 * MIB] * 10
    for step in range(11):
        ptrs = [(LIB.vrampool_malloc(n, 0, None), n) for n in sizes]
        for p, n in ptrs[1:] if step == 10 else ptrs:
            LIB.vrampool_free(p, n, 0, None)
    kept = ptrs[0][0]
    assert LIB.vrampool_malloc(20 * MIB, 0, None) is None
    r = vrampool.torch.last_oom()
    assert r is not None and r.arena >= 20 * MIB and (r.arena_live, r.arena_buffers) == (4096, 1), r
    assert r.allocated == 4096 and r.free == r.reserved - r.arena, "the arena's idle bytes are not free for the pool"
    assert "1 live buffer (4.00 KiB) keeps the steady arena's" in r.hints[0], r.hints
    assert "keeps its region from the pool until it is freed" in r.message
    LIB.vrampool_free(kept, 4096, 0, None)
    p = LIB.vrampool_malloc(20 * MIB, 0, None)
    assert p, "with the kept buffer freed, the arena goes back to the pool"
    LIB.vrampool_free(p, 20 * MIB, 0, None)
    _native.clear_last_error()


def test_out_of_memory_report_after_a_failing_malloc(sim: ctypes.CDLL) -> None:
    configure("device:sim,sim_capacity:64MB,strategy:best_fit")
    a = LIB.vrampool_malloc(40 * MIB, 0, None)
    assert a
    assert LIB.vrampool_malloc(40 * MIB, 0, c_void_p(3)) is None
    r = _native.last_oom()
    assert r["requested"] == 40 * MIB and r["device"] == 0 and r["stream"] == 3
    # Expandable segments map exactly the 40 MiB in 2 MiB chunks: nothing reserved is free, and
    # the 24 MiB the device has left cannot hold another 40.
    figures = {k: r[k] for k in ("allocated", "reserved", "free", "largest_free", "fragmentation", "device_free")}
    assert figures == {"allocated": 40 * MIB, "reserved": 40 * MIB, "free": 0, "largest_free": 0, "fragmentation": 0.0, "device_free": 24 * MIB}
    assert not r["too_large"] and r["limit"] is None and r["capacity"] == 64 * MIB
    assert r["strategy"] == "best_fit" and r["num_ooms"] == 1
    assert r["message"].startswith("CUDA out of memory.") and "40.00 MiB" in r["message"]
    assert _native.last_error() == r["message"]
    s = stats()
    assert s["num_ooms"] == 1 and s["num_alloc_retries"] >= 1
    LIB.vrampool_free(a, 40 * MIB, 0, None)
    _native.clear_last_error()
    assert _native.last_oom() is None and _native.last_error() is None


def test_last_error_through_the_c_entry(sim: ctypes.CDLL) -> None:
    assert sim.vrampool_last_error(None, 0) == 0
    sim.vrampool_free(c_void_p(4096), 16, 0, None)
    full = sim.vrampool_last_error(None, 0)
    assert full > 16
    buf = ctypes.create_string_buffer(16)
    assert sim.vrampool_last_error(buf, 16) == full
    assert buf.value == _native.last_error().encode()[:15]


def test_configuration_text_and_its_errors(sim: ctypes.CDLL) -> None:
    _native._abi_reset()
    text = _native.configure("device:sim,strategy:best_fit,limit:0.5,small_max:256KB,expandable:true,sim_capacity:256MB")
    assert text == "device:sim,strategy:best_fit,limit:0.5,small_max:256KB,expandable:true,sim_capacity:256MB"
    c = _native.configuration()
    assert (c["device"], c["strategy"], c["limit"], c["small_max"], c["expandable"], c["sim_capacity"]) == ("sim", "best_fit", 0.5, 256 << 10, True, 256 * MIB)
    for bad in ("strategy:fastest", "device:tpu", "sim_capacity:0", "colour:blue", "expandable:maybe", "nonsense"):
        with pytest.raises(ValueError):
            _native.configure(bad)
    p = LIB.vrampool_malloc(4096, 0, None)
    assert stats()["capacity_bytes"] == 128 * MIB  # limit 0.5 of 256 MiB
    # Once a pool exists: the same configuration is fine, another is refused.
    _native.configure("device:sim,strategy:best_fit,limit:0.5,small_max:256KB,expandable:true,sim_capacity:256MB")
    with pytest.raises(ValueError, match="before the first allocation"):
        _native.configure("device:sim,strategy:slab")
    assert LIB.vrampool_configure(b"device:sim,strategy:slab") == -1
    assert "before the first allocation" in _native.last_error()
    assert LIB.vrampool_configure(b"device:sim,strategy:best_fit,limit:0.5,small_max:256KB,expandable:true,sim_capacity:256MB") == 0
    LIB.vrampool_free(p, 4096, 0, None)


def test_init_hook_reports_a_bad_environment(run_python: Callable[..., str]) -> None:
    code = textwrap.dedent(
        """
        import ctypes
        from vrampool import _native
        lib = ctypes.CDLL(_native.__file__)
        lib.vrampool_init(1)
        print(_native.last_error())
        lib.vrampool_malloc.restype = ctypes.c_void_p
        lib.vrampool_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        print(lib.vrampool_malloc(4096, 0, None))
        """
    )
    out = run_python(code, VRAMPOOL_CONF="strategy:quantum")
    assert "VRAMPOOL_CONF `strategy:quantum`" in out and "unknown strategy" in out
    assert out.strip().endswith("None")


def test_environment_configures_the_pools(run_python: Callable[..., str]) -> None:
    code = textwrap.dedent(
        """
        import ctypes
        from vrampool import _native
        lib = ctypes.CDLL(_native.__file__)
        lib.vrampool_malloc.restype = ctypes.c_void_p
        lib.vrampool_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        p = lib.vrampool_malloc(3 << 20, 0, None)
        c = _native.configuration()
        print(bool(p), c["device"], c["strategy"], c["round_up_divisions"], c["sim_capacity"], c["devices"])
        print(_native.abi_stats(0)["capacity_bytes"])
        """
    )
    out = run_python(code, VRAMPOOL_CONF="device:sim,strategy:best_fit,round_up_divisions:4,sim_capacity:128MB,limit:0.5")
    assert out.split("\n")[0] == f"True sim best_fit 4 {128 * MIB} [0]"
    assert out.split("\n")[1] == str(64 * MIB)


def test_private_pools_route_allocations_until_released(sim: ctypes.CDLL) -> None:
    pool_id = MempoolId(3, 9)
    main = sim.vrampool_malloc(4096, 0, None)
    sim.vrampool_begin_allocate_to_pool(0, pool_id, None)
    assert counters()["private_pools"][0] == {"pools": [(3, 9)], "open": [(3, 9)]}
    inside = sim.vrampool_malloc(4096, 0, None)
    sim.vrampool_end_allocate_to_pool(0, pool_id)
    assert counters()["private_pools"][0]["open"] == []
    after = sim.vrampool_malloc(4096, 0, None)
    owners = {b["address"]: tuple(seg["segment_pool_id"]) for seg in segments() for b in seg["blocks"] if b["state"] == "active_allocated"}
    assert owners[main] == (0, 0) and owners[inside] == (3, 9) and owners[after] == (0, 0)
    assert stats()["allocation.all.current"] == 3  # main and private pools together
    # A block freed in the private pool is reused only inside it.
    sim.vrampool_free(inside, 4096, 0, None)
    other = sim.vrampool_malloc(4096, 0, None)
    assert other != inside
    sim.vrampool_begin_allocate_to_pool(0, pool_id, None)
    again = sim.vrampool_malloc(4096, 0, None)
    sim.vrampool_end_allocate_to_pool(0, pool_id)
    # Released with a block live: the pool stays until that block is freed.
    sim.vrampool_release_pool(0, pool_id)
    assert counters()["private_pools"][0]["pools"] == [(3, 9)]
    sim.vrampool_free(again, 4096, 0, None)
    assert counters()["private_pools"][0]["pools"] == []
    for p in (main, after, other):
        sim.vrampool_free(p, 4096, 0, None)
    assert stats()["allocation.all.current"] == 0
    assert _native.last_error() is None
    sim.vrampool_end_allocate_to_pool(0, MempoolId(5, 5))
    assert "no such open pool" in _native.last_error()
    sim.vrampool_release_pool(0, MempoolId(5, 5))
    assert "no such pool" in _native.last_error()


def planned_iteration(lib: ctypes.CDLL, sizes: List[int], key: int) -> List[int]:
    """One iteration through the C ABI: allocate each size (a fill byte per buffer), freeing each
    buffer after the next one is allocated and checking its fill first; then step to `key`."""
    ptrs: List[int] = []
    for i, size in enumerate(sizes):
        p = lib.vrampool_malloc(size, 0, None)
        ctypes.memset(p, i + 1, size)
        ptrs.append(p)
        if i > 0:
            previous = sizes[i - 1]
            assert ctypes.string_at(ptrs[i - 1], previous) == bytes([i]) * previous, "overwritten while live"
            lib.vrampool_free(ptrs[i - 1], previous, 0, None)
    assert ctypes.string_at(ptrs[-1], sizes[-1]) == bytes([len(sizes)]) * sizes[-1]
    lib.vrampool_free(ptrs[-1], sizes[-1], 0, None)
    lib.vrampool_planned_step(key)
    return ptrs


def test_planned_mode_serves_a_repeated_sequence_from_the_arena(sim: ctypes.CDLL) -> None:
    configure(f"device:sim,sim_capacity:{CAPACITY},steady:false")  # the mode alone, turned on and off by hand
    sizes = [4096, 3 * MIB, 64 * 1024, 4096, 2 * MIB]
    sim.vrampool_planned_enable(1)
    assert _native.abi_planned()
    sim.vrampool_planned_step(7)  # names the first iteration
    recorded = planned_iteration(sim, sizes, 7)
    allocations = stats()["allocation.all.allocated"]
    replayed = planned_iteration(sim, sizes, 7)
    planned = _native.abi_planned_stats(0)
    assert planned is not None
    assert (planned["planned_allocations"], planned["dynamic_allocations"], planned["fallbacks"]) == (5, 5, 0)
    assert planned["arena_blocks_taken"] == 1, "the arena is the replay's only pool allocation"
    assert stats()["allocation.all.allocated"] - allocations == len(sizes), "each arena buffer counts as an allocation, the arena not"
    assert replayed != recorded and max(replayed) - min(replayed) < planned["arena_bytes"]
    assert planned_iteration(sim, sizes, 7) == replayed, "the same sequence, the same offsets"
    # Another size in the middle: the rest of the iteration falls back to the pool, and is planned.
    changed = sizes[:2] + [128 * 1024] + sizes[3:]
    planned_iteration(sim, changed, 7)
    after = _native.abi_planned_stats(0)
    assert after is not None and after["fallbacks"] == 1
    assert after["planned_allocations"] - planned["planned_allocations"] == 5 + 2
    planned_iteration(sim, changed, 7)
    again = _native.abi_planned_stats(0)
    assert again is not None and again["planned_allocations"] - after["planned_allocations"] == 5 and again["fallbacks"] == 1
    # A pointer from before the mode is freed by the pool as usual; off, the idle arena goes back.
    sim.vrampool_planned_enable(0)
    assert not _native.abi_planned()
    assert stats()["allocation.all.current"] == 0
    assert counters()["refused_frees"] == 0 and _native.last_error() is None


def test_planned_mode_from_vrampool_torch_and_pointers_from_before_it(sim: ctypes.CDLL) -> None:
    import vrampool.torch as vt  # its planned-arena functions need neither torch nor a GPU

    configure(f"device:sim,sim_capacity:{CAPACITY},steady:false")  # the mode alone, turned on and off by hand
    before = sim.vrampool_malloc(4096, 0, None)
    with vt.planned():
        assert _native.abi_planned()
        for _ in range(3):
            vt.step(key=(8, 3, 32, 32))
            inside = sim.vrampool_malloc(4096, 0, None)
            sim.vrampool_free(inside, 4096, 0, None)
        sim.vrampool_free(before, 4096, 0, None)  # the pool's, freed by the pool
        sim.vrampool_free(inside, 4096, 0, None)  # a double free is refused, not a crash
    assert not _native.abi_planned()
    assert counters()["refused_frees"] == 1 and "not a live block" in (_native.last_error() or "")
    figures = vt.planned_stats(0)
    assert figures is not None and (figures["planned_allocations"], figures["dynamic_allocations"]) == (2, 1)
    assert stats()["allocation.all.current"] == 0


def test_base_alloc_finds_the_segment(sim: ctypes.CDLL) -> None:
    p = sim.vrampool_malloc(3 * MIB, 0, None)
    size = c_size_t(0)
    base = sim.vrampool_base_alloc(c_void_p(p + 100), ctypes.byref(size))
    assert base and base <= p and p + 3 * MIB <= base + size.value
    assert any(seg["address"] == base and seg["total_size"] == size.value for seg in segments())
    assert sim.vrampool_base_alloc(c_void_p(16), ctypes.byref(size)) is None and size.value == 0
    assert "not in any vrampool segment" in _native.last_error()
    sim.vrampool_free(p, 3 * MIB, 0, None)


def test_many_threads_through_the_abi(sim: ctypes.CDLL) -> None:
    errors = []

    def worker(seed: int) -> None:
        live = []
        for i in range(1500):
            size = 512 * (1 + (i * 7919 + seed) % 300)
            p = sim.vrampool_malloc(size, 0, c_void_p(seed % 2))
            if not p:
                errors.append((seed, i, size))
                continue
            live.append((p, size))
            if len(live) > 8:
                q, s = live.pop((i + seed) % len(live))
                sim.vrampool_free(q, s, 0, c_void_p(seed % 2))
        for q, s in live:
            sim.vrampool_free(q, s, 0, c_void_p(seed % 2))

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = stats()
    assert s["allocated_bytes.all.current"] == 0 and s["allocation.all.allocated"] == 4 * 1500
    assert counters()["refused_frees"] == 0 and _native.last_error() is None


def test_a_panic_becomes_a_recorded_error() -> None:
    answer, message = _native._abi_guard_selftest()
    assert answer == -1 and "panic" in message and "selftest" in message
    _native.clear_last_error()


def test_raise_on_failure_needs_the_cpp_runtime_or_says_so(run_python: Callable[..., str]) -> None:
    # In a fresh interpreter without torch, libstdc++ is not loaded: refused, with the reason.
    # Once it is loaded (as torch loads it), the same call turns the option on.
    code = textwrap.dedent(
        """
        import ctypes
        from vrampool import _native

        def loaded():
            with open("/proc/self/maps") as maps:
                return "libstdc++" in maps.read()

        def turn_on():
            try:
                return "on" if _native.abi_raise_on_failure(True) else "off"
            except RuntimeError as e:
                return f"refused: {e}"

        print(loaded(), turn_on())
        ctypes.CDLL("libstdc++.so.6")
        print(loaded(), turn_on(), _native.configuration()["raise_on_failure"])
        """
    )
    before, after = run_python(code).splitlines()
    assert before == "False refused: the C++ runtime (libstdc++) is not loaded in this process: import torch first"
    assert after == "True on True"


SHIM = r"""
#include <cstddef>
#include <cstring>
#include <functional>
#include <stdexcept>

// Calls an allocator the way PyTorch's CUDAPluggableAllocator does (through a std::function)
// and reports what came back: 0 a pointer, 1 null, 2 a std::runtime_error (its text in `out`),
// 3 another exception.
extern "C" int call_like_torch(void* fn, std::size_t size, void** result, char* out, std::size_t cap) {
  using Alloc = void*(std::size_t, int, void*);
  std::function<Alloc> alloc = reinterpret_cast<Alloc*>(fn);
  try {
    *result = alloc(size, 0, nullptr);
    return *result ? 0 : 1;
  } catch (const std::runtime_error& e) {
    std::strncpy(out, e.what(), cap - 1);
    out[cap - 1] = 0;
    return 2;
  } catch (...) {
    return 3;
  }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build a C++ caller")
def test_failed_malloc_throws_a_cpp_exception_under_raise_on_failure(tmp_path: Path, run_python: Callable[..., str]) -> None:
    (tmp_path / "shim.cpp").write_text(SHIM)
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(tmp_path / "shim.so"), str(tmp_path / "shim.cpp")], check=True)
    code = textwrap.dedent(
        f"""
        import ctypes
        from vrampool import _native
        shim = ctypes.CDLL({str(tmp_path / "shim.so")!r})  # brings the C++ runtime in, as torch does
        shim.call_like_torch.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t]
        lib = ctypes.CDLL(_native.__file__)
        malloc = ctypes.cast(lib.vrampool_torch_malloc, ctypes.c_void_p).value
        _native.configure("device:sim,sim_capacity:64MB")
        out, ptr = ctypes.create_string_buffer(2048), ctypes.c_void_p()
        print("null", shim.call_like_torch(malloc, 1 << 40, ctypes.byref(ptr), out, 2048))
        assert _native.abi_raise_on_failure(True)
        print("ok", shim.call_like_torch(malloc, 4096, ctypes.byref(ptr), out, 2048), bool(ptr.value))
        print("oom", shim.call_like_torch(malloc, 1 << 40, ctypes.byref(ptr), out, 2048))
        print("what", out.value.decode())
        print("oom-again", shim.call_like_torch(malloc, 100 << 20, ctypes.byref(ptr), out, 2048))
        print("still-serving", shim.call_like_torch(malloc, 4096, ctypes.byref(ptr), out, 2048))
        print("failed", _native.abi_counters()["failed_mallocs"], _native.last_oom()["requested"])
        lib.vrampool_malloc.restype = ctypes.c_void_p
        print("plain", lib.vrampool_malloc(ctypes.c_size_t(1 << 40), 0, None))  # never throws
        """
    )
    lines = run_python(code).splitlines()
    assert lines[0] == "null 1"
    assert lines[1] == "ok 0 True"
    assert lines[2] == "oom 2"
    assert lines[3].startswith("what CUDA out of memory. vrampool could not allocate 1.00 TiB on device 0")
    assert "last_oom()" in lines[3]
    assert lines[4] == "oom-again 2"
    assert lines[5] == "still-serving 0"
    assert lines[6] == f"failed 3 {100 << 20}"
    assert lines[7] == "plain None", "vrampool_malloc threw (a ctypes caller would be terminated)"
