"""`vrampool.torch` on the CPU: PyTorch loads the allocator from the extension module and takes
every hook (in subprocesses: an allocator can be installed once per process), PyTorch's own C++
calls the hooks that need no GPU, `install()` refuses once CUDA is initialised, and the mirrored
statistics, summary, snapshot (checked field by field, and read by `torch.cuda._memory_viz`) and
out-of-memory report work on the simulated device. Tests that need torch skip without it; the
statistics need neither torch nor a GPU."""

from __future__ import annotations

import ctypes
import pickle
from ctypes import c_int, c_size_t, c_void_p
from typing import Any, Callable, Dict, Iterator, List

import numpy as np
import pytest

import vrampool.torch as vt
from vrampool import _native
from vrampool.options import conf_text

MIB = 1 << 20
HOOKS = {"init", "reset", "memory_fraction", "base_alloc", "record_stream", "begin_allocate_to_pool", "end_allocate_to_pool", "release_pool"}


def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(_native.__file__)
    lib.vrampool_malloc.restype, lib.vrampool_malloc.argtypes = c_void_p, [c_size_t, c_int, c_void_p]
    lib.vrampool_free.restype, lib.vrampool_free.argtypes = None, [c_void_p, c_size_t, c_int, c_void_p]
    lib.vrampool_record_stream.restype, lib.vrampool_record_stream.argtypes = None, [c_void_p, c_void_p]
    return lib


LIB = _lib()


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    monkeypatch.delenv("VRAMPOOL_CONF", raising=False)
    _native._abi_reset()
    vt.configure(device="sim", sim_capacity="256MB")
    yield LIB
    _native._abi_reset()


# ---- PyTorch loads the allocator (subprocesses) ----


def test_pluggable_allocator_resolves_every_symbol_and_takes_every_hook(run_python: Callable[..., str]) -> None:
    pytest.importorskip("torch")
    out = run_python(
        """
        import ctypes, torch
        from vrampool import _native
        path = _native.__file__
        alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "vrampool_malloc", "vrampool_free")
        lib = ctypes.CDLL(path)
        native = alloc.allocator()
        setters = {
            "init": "set_init_fn", "reset": "set_reset_fn", "memory_fraction": "set_memory_fraction_fn",
            "base_alloc": "set_base_alloc_fn", "record_stream": "set_record_stream_fn",
            "begin_allocate_to_pool": "set_begin_allocate_to_pool",
            "end_allocate_to_pool": "set_end_allocate_to_pool_fn", "release_pool": "set_release_pool",
        }
        # Every hook this PyTorch offers has a vrampool symbol.
        offered = {n for n in dir(native) if n.startswith(("set_", "_set_"))}
        assert offered <= set(setters.values()), offered - set(setters.values())
        for hook, setter in setters.items():
            if hasattr(native, setter):
                getattr(native, setter)(ctypes.cast(getattr(lib, _native.ABI_SYMBOLS[hook]), ctypes.c_void_p).value)
                print("set", hook)
        torch.cuda.memory.change_current_allocator(alloc)
        print("changed")
        """
    )
    lines = out.splitlines()
    assert lines[-1] == "changed"
    assert {line.split()[1] for line in lines[:-1]} == HOOKS


def test_install_ends_the_planned_arenas_iteration_at_every_optimizer_step(run_python: Callable[..., str]) -> None:
    """Issue 47: under install(), the steady state comes with no change to the loop: PyTorch's
    global optimizer-step hook ends each iteration, so the second step on comes from the arena and
    makes no device call. (The steps' buffers come from the C ABI here: no GPU; a buffer that
    lives across the steps, as the weights do, keeps the pool from ending an iteration itself.)"""
    pytest.importorskip("torch")
    out = run_python(
        """
        import ctypes, json, torch
        import vrampool.torch as vt
        vt.install(device="sim", sim_capacity="1GB")
        lib = ctypes.CDLL(vt.library_path())
        lib.vrampool_malloc.restype = ctypes.c_void_p
        lib.vrampool_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.vrampool_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        weights = lib.vrampool_malloc(4 << 20, 0, None)
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        sizes = [(1 + i % 7) << 20 for i in range(40)]
        seen = []
        for step in range(6):
            live = [lib.vrampool_malloc(n, 0, None) for n in sizes]
            seen.append(sorted(live))
            for p, n in zip(live, sizes):
                lib.vrampool_free(p, n, 0, None)
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
            if step == 2:
                allocs = vt.memory_stats(0)["num_device_alloc"]
        figures = vt.planned_stats(0)
        print(json.dumps({"replayed": figures["replayed_iterations"], "same": seen[2:] == [seen[2]] * 4,
                          "device_allocs": vt.memory_stats(0)["num_device_alloc"] - allocs,
                          "allocated": vt.memory_stats(0)["allocated_bytes.all.current"]}))
        lib.vrampool_free(weights, 4 << 20, 0, None)
        """
    )
    import json

    figures = json.loads(out.splitlines()[-1])
    assert figures == {"replayed": 4, "same": True, "device_allocs": 0, "allocated": 4 << 20}, figures


def test_install_makes_sharing_a_cuda_tensor_an_error_that_names_vrampool(run_python: Callable[..., str]) -> None:
    """Issue 50: torch.multiprocessing cannot share a CUDA tensor through a pluggable allocator;
    under install() its pickler says so, naming vrampool and the ways round it, in the sending
    process. CPU tensors pickle as before. (A CUDA tensor needs a GPU: a stand-in says is_cuda.)"""
    pytest.importorskip("torch")
    out = run_python(
        """
        import json, torch
        from multiprocessing.reduction import ForkingPickler
        import vrampool.torch as vt
        vt.install(device="sim", sim_capacity="256MB")
        ForkingPickler.dumps(torch.ones(3))
        class CudaLike:
            is_cuda = True
        messages = []
        for cls in (torch.Tensor, torch.nn.Parameter, torch.UntypedStorage):
            try:
                ForkingPickler._extra_reducers[cls](CudaLike())
            except RuntimeError as e:
                messages.append(str(e))
        print(json.dumps(messages))
        """
    )
    import json

    messages = json.loads(out.splitlines()[-1])
    assert len(messages) == 3 and all("vrampool.ipc" in m and "torch.multiprocessing" in m for m in messages), messages


def test_install_sets_every_hook_and_torch_drives_them(run_python: Callable[..., str]) -> None:
    pytest.importorskip("torch")
    out = run_python(
        """
        import json, torch
        import vrampool.torch as vt
        from vrampool import _native
        alloc = vt.install(device="sim", sim_capacity="256MB", strategy="hybrid")
        assert vt.install() is alloc and vt.is_installed()
        c = vt.configuration()
        print(json.dumps({"hooks": sorted(vt.hooks()), "raise": c["raise_on_failure"], "text": c["text"]}))
        import ctypes
        lib = ctypes.CDLL(vt.library_path())
        lib.vrampool_malloc.restype = ctypes.c_void_p
        lib.vrampool_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.vrampool_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        p = lib.vrampool_malloc(8 << 20, 0, None)
        lib.vrampool_free(p, 8 << 20, 0, None)
        reserved = vt.memory_reserved(0)
        torch._C._cuda_emptyCache()                 # torch.cuda.empty_cache() -> reset hook
        trimmed = vt.memory_reserved(0)
        torch._C._cuda_setMemoryFraction(0.25, 0)   # set_per_process_memory_fraction -> hook
        capacity = vt.memory_stats(0)["capacity_bytes"]
        torch._C._cuda_beginAllocateCurrentThreadToPool(0, (7, 11))  # graph-pool hooks
        inside = lib.vrampool_malloc(4096, 0, None)
        opened = _native.abi_counters()["private_pools"][0]
        torch._C._cuda_endAllocateToPool(0, (7, 11))
        lib.vrampool_free(inside, 4096, 0, None)
        torch._C._cuda_releasePool(0, (7, 11))
        released = _native.abi_counters()["private_pools"][0]
        try:
            vt.install(strategy="slab")
        except ValueError as e:
            changed = str(e)
        try:
            with vt.pool():
                pass
        except RuntimeError as e:
            pooled = str(e)
        print(json.dumps({"reserved": reserved, "trimmed": trimmed, "capacity": capacity, "opened": opened,
                          "released": released, "changed": changed, "pooled": pooled, "error": vt.last_error()}))
        """
    )
    first, second = out.splitlines()[-2:]
    import json

    a, b = json.loads(first), json.loads(second)
    assert set(a["hooks"]) == HOOKS and a["raise"] is True
    assert a["text"] == "device:sim,sim_capacity:256MB,strategy:hybrid"
    assert b["reserved"] >= 8 * MIB and b["trimmed"] == 0
    assert b["capacity"] == 64 * MIB
    assert b["opened"] == {"pools": [[7, 11]], "open": [[7, 11]]}
    assert b["released"] == {"pools": [], "open": []}
    assert "before the first allocation" in b["changed"]
    assert "after install()" in b["pooled"]
    assert b["error"] is None


def test_install_refuses_once_cuda_is_initialised_and_pool_needs_mempool(run_python: Callable[..., str]) -> None:
    pytest.importorskip("torch")
    out = run_python(
        """
        import torch
        import vrampool.torch as vt
        real = torch.cuda.is_initialized
        torch.cuda.is_initialized = lambda: True
        try:
            vt.install()
        except RuntimeError as e:
            print("refused:", e)
        torch.cuda.is_initialized = real
        assert not vt.is_installed() and not vt.configuration()["raise_on_failure"]
        del torch.cuda.MemPool
        try:
            with vt.pool():
                pass
        except RuntimeError as e:
            print("pool:", e)
        """
    )
    refused, pool = out.splitlines()
    assert refused.startswith("refused: vrampool.torch.install() must run before the first CUDA tensor")
    assert "vrampool.torch.pool()" in refused
    assert pool.startswith("pool: vrampool.torch.pool() needs torch.cuda.MemPool (PyTorch 2.5 or newer)")


def test_vrampool_imports_and_reports_without_torch(run_python: Callable[..., str]) -> None:
    out = run_python(
        """
        import sys
        sys.modules["torch"] = None  # import torch fails
        import vrampool, vrampool.torch as vt
        print(vt.memory_allocated(), vt.memory_reserved("cuda:0"), len(vt.memory_stats()) > 20)
        print(vt.memory_snapshot()["segments"], vt.last_oom())
        try:
            vt.install()
        except ImportError as e:
            print("install:", e)
        """
    )
    assert out.splitlines() == ["0 0 True", "[] None", "install: vrampool.torch needs PyTorch for this; the statistics work without it"]


# ---- configuration ----


def test_keyword_options_become_the_text_form() -> None:
    assert conf_text({"strategy": "buddy", "round_up_divisions": 4, "limit": "40GB", "record_events": False}) == (
        "strategy:buddy,round_up_divisions:4,limit:40GB,record_events:false"
    )
    assert conf_text({"limit": None}) == ""
    assert conf_text({"limit": 1, "small_max": np.int64(4096)}) == "limit:1,small_max:4096", "an int is bytes"
    assert conf_text({"limit": 1.0}) == "limit:1.0", "a float keeps its point: a fraction"
    with pytest.raises(TypeError, match="unknown vrampool option 'stratgy'"):
        conf_text({"stratgy": "slab"})
    with pytest.raises(ValueError):
        conf_text({"strategy": "slab,limit:1"})
    with pytest.raises(TypeError):
        conf_text({"limit": [1]})
    with pytest.raises(TypeError, match="track_leaks must be a bool"):
        conf_text({"track_leaks": "yes"})
    assert set(vt.OPTIONS) == {name for name, _, _ in _native.config_keys()}, "the core's keys, every one"


def test_configure_refuses_bad_values(sim: ctypes.CDLL) -> None:
    _native._abi_reset()
    with pytest.raises(ValueError, match="unknown strategy"):
        vt.configure(strategy="fastest")
    assert vt.configure(device="sim", round_up_divisions=8) == "device:sim,round_up_divisions:8"
    assert vt.configuration()["round_up_divisions"] == 8


# ---- mirrored statistics (simulated device, no torch needed) ----

TORCH_KEYS = [f"{n}.all.{f}" for n in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "allocation", "segment") for f in ("current", "peak", "allocated", "freed")] + [
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
]


def test_memory_stats_use_torch_names_and_follow_each_call(sim: ctypes.CDLL) -> None:
    s = vt.memory_stats()
    assert set(TORCH_KEYS) <= set(s) and list(s) == sorted(s)
    assert all(s[k] == 0 for k in TORCH_KEYS)
    # 3 MiB + 100 B: a best-fit block of 3 MiB + 512 B, in two 2 MiB chunks of an expandable segment.
    p = sim.vrampool_malloc(3 * MIB + 100, 0, None)
    s = vt.memory_stats(0)
    assert s["requested_bytes.all.current"] == 3 * MIB + 100
    assert vt.memory_allocated() == s["allocated_bytes.all.current"] == 3 * MIB + 512
    assert vt.memory_reserved("cuda:0") == vt.memory_reserved() == s["reserved_bytes.all.current"] == 4 * MIB
    assert s["num_device_alloc"] == 2 and s["allocation.all.current"] == 1
    sim.vrampool_free(p, 3 * MIB + 100, 0, None)
    assert (vt.memory_allocated(), vt.max_memory_allocated()) == (0, 3 * MIB + 512)
    assert (vt.memory_reserved(), vt.max_memory_reserved()) == (4 * MIB, 4 * MIB)
    vt.reset_peak_memory_stats()
    assert (vt.max_memory_allocated(), vt.max_memory_reserved()) == (0, 4 * MIB)
    assert vt.empty_cache() == 4 * MIB
    assert vt.memory_reserved() == 0 and vt.memory_stats()["num_device_free"] >= 1
    assert vt.memory_allocated(1) == 0  # a device without a pool reads as zeros
    with pytest.raises(ValueError):
        vt.memory_allocated("cpu")


def test_memory_summary_is_laid_out_like_torch(sim: ctypes.CDLL) -> None:
    ptrs = [(sim.vrampool_malloc(n, 0, None), n) for n in (4096, 3 * MIB, 70 * MIB)]
    text = vt.memory_summary()
    lines = text.splitlines()
    assert "vrampool memory summary, device 0" in lines[1]
    assert "Metric" in lines[3] and "Cur Usage" in lines[3] and "Peak Usage" in lines[3] and "Tot Alloc" in lines[3] and "Tot Freed" in lines[3]
    for label in ("Allocated memory", "Active memory", "Requested memory", "Reserved memory", "Allocations", "Segments", "Reserved but unallocated"):
        assert label in text, label
    for tier in ("slab", "best_fit", "buddy"):
        assert tier in text
    assert "slab" not in vt.memory_summary(abbreviated=True)
    assert len({len(line) for line in lines}) == 1, "every line of the table has the same width"
    for p, n in ptrs:
        sim.vrampool_free(p, n, 0, None)


def _active_snapshot(lib: ctypes.CDLL) -> Dict[str, Any]:
    """Blocks in every state: active in each tier (one with requested < size), one pending free
    (used on another stream whose work has not completed), and freed ones."""
    plan = {"small": 4096, "medium": 3 * MIB + 100, "large": 70 * MIB, "pending": 64 * 1024, "freed": 2 * MIB}
    ptrs = {name: lib.vrampool_malloc(size, 0, None) for name, size in plan.items()}
    _native.abi_sim_control(0, auto_complete=False)
    lib.vrampool_record_stream(ptrs["pending"], c_void_p(9))
    lib.vrampool_free(ptrs["pending"], plan["pending"], 0, None)
    lib.vrampool_free(ptrs["freed"], plan["freed"], 0, None)
    return {"plan": plan, "ptrs": ptrs, "snapshot": vt.memory_snapshot(), "stats": vt.memory_stats()}


def test_memory_snapshot_has_torch_format_field_by_field(sim: ctypes.CDLL) -> None:
    got = _active_snapshot(sim)
    snap, plan, ptrs, stats = got["snapshot"], got["plan"], got["ptrs"], got["stats"]
    assert set(snap) == {"segments", "device_traces", "allocator_settings"}
    assert snap["device_traces"] == [[]]
    assert snap["allocator_settings"] == {"vrampool": "device:sim,sim_capacity:256MB"}
    segs: List[Dict[str, Any]] = snap["segments"]
    seg_keys = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream", "segment_type",
                "segment_pool_id", "is_expandable", "vrampool_paused", "frames", "blocks", "strategy"}
    blocks_by_addr = {}
    for seg in segs:
        assert set(seg) == seg_keys
        assert seg["device"] == 0 and seg["stream"] == 0 and seg["segment_pool_id"] == (0, 0)
        assert isinstance(seg["address"], int) and seg["total_size"] > 0 and seg["frames"] == []
        # The middle tier grows as an expandable segment on the simulated device, which maps.
        assert seg["is_expandable"] is (seg["strategy"] == "best_fit")
        assert seg["vrampool_paused"] is False
        assert seg["segment_type"] == ("small" if seg["strategy"] == "slab" else "large")
        cursor = seg["address"]
        for b in seg["blocks"]:
            assert set(b) == {"address", "size", "requested_size", "state", "frames", "vrampool_state"}
            assert b["vrampool_state"] in ("cached", "free") or b["state"] != "inactive"
            assert b["address"] == cursor, "blocks cover the segment in address order, without gaps"
            assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
            assert b["frames"] == [] and b["size"] > 0
            if b["state"] == "active_allocated":
                assert 0 < b["requested_size"] <= b["size"]
            else:
                assert b["requested_size"] == 0
            cursor += b["size"]
            blocks_by_addr[b["address"]] = b
        assert cursor == seg["address"] + seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        assert seg["active_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] != "inactive")
        assert seg["requested_size"] == sum(b["requested_size"] for b in seg["blocks"])
    assert {s["strategy"] for s in segs} == {"slab", "best_fit", "buddy"}
    for name in ("small", "medium", "large"):
        b = blocks_by_addr[ptrs[name]]
        assert b["state"] == "active_allocated" and b["requested_size"] == plan[name] and b["size"] >= plan[name]
    assert blocks_by_addr[ptrs["pending"]]["state"] == "active_pending_free"
    assert blocks_by_addr[ptrs["freed"]]["state"] == "inactive"
    # The snapshot and the statistics agree.
    assert sum(s["total_size"] for s in segs) == stats["reserved_bytes.all.current"]
    assert sum(s["allocated_size"] for s in segs) == stats["allocated_bytes.all.current"]
    assert sum(s["active_size"] for s in segs) == stats["active_bytes.all.current"]
    assert sum(s["requested_size"] for s in segs) == stats["requested_bytes.all.current"]
    _native.abi_sim_control(0, complete_stream=9)


def test_memory_viz_reads_the_snapshot(sim: ctypes.CDLL) -> None:
    pytest.importorskip("torch")
    from torch.cuda import _memory_viz

    snap = _active_snapshot(sim)["snapshot"]
    summary = _memory_viz.segsum(snap)  # raises on a segment whose blocks do not add up
    assert f"segments: {len(snap['segments'])}" in summary
    lines = _memory_viz.segments(snap, format_flamegraph=lambda text: text)
    assert "active_allocated" in lines and "active_pending_free" in lines and "inactive" in lines
    assert _memory_viz.memory(snap, format_flamegraph=lambda text: text)
    assert "snapshot.pickle" in _memory_viz.segment_plot(snap)
    assert pickle.loads(pickle.dumps(snap)) == snap
    assert _memory_viz.trace(snap) == "", "vrampool records no device traces: nothing to print"


def test_private_pool_segments_carry_their_id(sim: ctypes.CDLL) -> None:
    class MempoolId(ctypes.Structure):
        _fields_ = [("first", ctypes.c_uint64), ("second", ctypes.c_uint64)]

    sim.vrampool_begin_allocate_to_pool.argtypes = [c_int, MempoolId, c_void_p]
    sim.vrampool_end_allocate_to_pool.argtypes = [c_int, MempoolId]
    sim.vrampool_begin_allocate_to_pool(0, MempoolId(1, 2), None)
    p = sim.vrampool_malloc(4096, 0, None)
    sim.vrampool_end_allocate_to_pool(0, MempoolId(1, 2))
    ids = {s["segment_pool_id"] for s in vt.memory_snapshot()["segments"]}
    assert ids == {(1, 2)}
    sim.vrampool_free(p, 4096, 0, None)


# ---- out of memory ----


def test_last_oom_explains_the_failure_and_what_to_try(sim: ctypes.CDLL) -> None:
    assert vt.last_oom() is None
    _native._abi_reset()
    vt.configure(device="sim", sim_capacity="64MB", strategy="best_fit", expandable=False)
    held = [sim.vrampool_malloc(2 * MIB, 0, None) for _ in range(24)]
    for p in held[::2]:
        sim.vrampool_free(p, 2 * MIB, 0, None)  # holes of 2 MiB between live blocks
    assert sim.vrampool_malloc(40 * MIB, 0, None) is None
    r = vt.last_oom()
    assert isinstance(r, vt.OomReport)
    # Twelve 4 MiB segments (room for two 2 MiB blocks each), one block live in each: 24 MiB free
    # in twelve 2 MiB holes, 1 - 2 / 24 of it scattered; the device has 16 MiB left.
    assert (r.requested, r.allocated, r.reserved, r.free, r.largest_free) == (40 * MIB, 24 * MIB, 48 * MIB, 24 * MIB, 2 * MIB)
    assert r.fragmentation == pytest.approx(1 - 2 / 24, abs=1e-12) and r.device_free == 16 * MIB
    assert r.strategy == "best_fit" and not r.too_large
    text = str(r)
    assert text.startswith("CUDA out of memory. vrampool could not allocate 40.00 MiB on device 0")
    assert "What to try:" in text and "smaller batch" in text
    assert vt.last_error() == r.message
    for p in held[1::2]:
        sim.vrampool_free(p, 2 * MIB, 0, None)


def _report(**over: Any) -> Dict[str, Any]:
    r = dict(requested=40 * MIB, allocated=0, reserved=0, free=0, largest_free=0, fragmentation=0.0, device_free=0,
             arena=0, arena_live=0, arena_buffers=0, limit=None, capacity=1 << 30, too_large=False, strategy="hybrid",
             round_up_divisions=0)
    r.update(over)
    return r


def test_hints_fit_the_figures() -> None:
    hints = vt._hints(_report(free=60 * MIB, largest_free=4 * MIB, fragmentation=0.93))
    assert any("reserved but unallocated" in h and "4.00 MiB" in h for h in hints)
    assert any("round_up_divisions:4" in h for h in hints)
    assert "smaller batch" in hints[-1]
    assert not any("round_up_divisions" in h for h in vt._hints(_report(free=60 * MIB, largest_free=4 * MIB, round_up_divisions=4)))
    assert any("raise the limit" in h for h in vt._hints(_report(too_large=True, limit=64 * MIB, capacity=64 * MIB)))
    assert any("split the tensor" in h for h in vt._hints(_report(too_large=True)))
    assert any("capped at" in h for h in vt._hints(_report(limit=256 * MIB, capacity=256 * MIB)))
    assert any("other processes" in h for h in vt._hints(_report(device_free=10 * MIB)))
    assert any("power of two" in h for h in vt._hints(_report(strategy="buddy")))
    kept = vt._hints(_report(arena=22 * MIB, arena_live=4096, arena_buffers=1))
    assert "1 live buffer (4.00 KiB) keeps the steady arena's 22.00 MiB" in kept[0]
    assert not any("steady arena" in h for h in vt._hints(_report(arena=22 * MIB)))
    assert vt._hints(_report()) == ("use a smaller batch (or shorter sequences), activation checkpointing, or lower precision",)
