"""Every figure vrampool reports to Python, against values worked out by hand on a state built
block by block: ``DevicePool.stats()`` and ``memory_summary()`` cell by cell, every peak of
``vrampool.torch`` after a rise and a fall, the out-of-memory figures and message (exception and
``last_oom``), and replay's figures (``vrampool.whatif.replay.replay`` and ``vrampool replay``).

The state, on a best-fit pool with plain segments (sizes that are no size class, so that every
free goes straight back to best fit): one 2 MiB segment holding, in address order, a free 300 KiB
hole, b (200 KiB, live), a free 300 KiB hole, d (100 KiB, live) and a free tail of 1,148 KiB;
before that, a 3 MiB + 100 KiB block raised the pool by an 8 MiB segment, which trim gave back.
"""

from __future__ import annotations

import ctypes
import json
from ctypes import c_int, c_size_t, c_void_p
from typing import Any, Callable, Dict, Iterator, List

import pytest

import vrampool
import vrampool.torch as vt
from vrampool import DevicePool, _native
from vrampool.whatif.cli import main
from vrampool.whatif.replay import replay

KIB, MIB = 1 << 10, 1 << 20
BIG = 3 * MIB + 100 * KIB  # needs a segment of its own: 8 MiB (room for two, in 2 MiB units)

# The table rows of that state, worked out by hand: allocated 300 KiB (b, d) of 2 MiB reserved;
# the peak is b, d and the big block (3 MiB + 400 KiB); a, b, c, d and the big block were
# allocated (3 MiB + 1000 KiB), all but b and d freed (3 MiB + 700 KiB).
BYTES_ROW = ["300.00 KiB", "3.39 MiB", "3.98 MiB", "3.68 MiB"]
EXPECTED_ROWS = {
    "Allocated memory": BYTES_ROW,
    "Active memory": BYTES_ROW,
    "Requested memory": BYTES_ROW,
    "Reserved memory": ["2.00 MiB", "10.00 MiB", "10.00 MiB", "8.00 MiB"],
    "Allocations": ["2", "4", "5", "3"],
    "Segments": ["1", "2", "2", "1"],
}
# Free: 2048 - 300 = 1748 KiB (1.71 MiB); the largest range is the 1148 KiB tail (1.12 MiB);
# fragmentation 1 - 1148 / 1748 = 34.3 %; reserved / allocated 2048 / 300 = 6.83.
EXPECTED_LINES = [
    "Reserved but unallocated: 1.71 MiB, largest free block 1.12 MiB",
    "Of it in cached blocks (freed, kept for reuse): 0 B",
    "Fragmentation: 34.3 %   reserved / allocated: 6.83",
    "OOMs: 0   alloc retries: 0   deferred frees: 0",
    "Device allocs: 2   device frees: 1   fast-path hits: 0",
]


def build_state(allocate: Callable[[int], Any], free: Callable[[Any], None], trim: Callable[[], int]) -> List[Any]:
    """Builds the state; returns b and d, which the caller keeps alive (a buffer is freed when
    collected)."""
    a, b, c, d = (allocate(n) for n in (300 * KIB, 200 * KIB, 300 * KIB, 100 * KIB))
    free(a)
    free(c)
    big = allocate(BIG)
    free(big)
    assert trim() == 8 * MIB
    return [b, d]


def cells(text: str) -> Dict[str, List[str]]:
    """The table's rows by label: the cells after the label, stripped."""
    rows = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if len(parts) == 5:
            rows[parts[0]] = parts[1:]
    return rows


def free_lines(text: str) -> List[str]:
    """The lines of text below the counters' rows (the title above them is text too)."""
    lines = text.splitlines()
    below = lines[next(i for i, line in enumerate(lines) if line.startswith("| Segments")) :]
    return [line.strip("| ") for line in below if line.count("|") == 2 and line.strip("|=-")]


def check_summary(text: str) -> None:
    rows = cells(text)
    for label, expected in EXPECTED_ROWS.items():
        assert rows[label] == expected, label
    assert rows["Metric"] == ["Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"]
    assert len({len(line) for line in text.splitlines()}) == 1, "ragged table"


def check_stats(s: Dict[str, float]) -> None:
    expected = {
        "allocated_bytes.all": (300 * KIB, 300 * KIB + BIG, 900 * KIB + BIG, 600 * KIB + BIG),
        "reserved_bytes.all": (2 * MIB, 10 * MIB, 10 * MIB, 8 * MIB),
        "allocation.all": (2, 4, 5, 3),
        "segment.all": (1, 2, 2, 1),
    }
    for key, values in expected.items():
        assert tuple(s[f"{key}.{f}"] for f in ("current", "peak", "allocated", "freed")) == values, key
    assert (s["largest_free_bytes"], s["free_bytes"], s["cached_bytes"]) == (1148 * KIB, 1748 * KIB, 0)
    assert s["fragmentation"] == pytest.approx(600 / 1748, abs=1e-12)
    assert s["reserved_per_allocated"] == pytest.approx(2048 / 300, abs=1e-12)


def best_fit_pool(capacity: int = 1 << 30) -> DevicePool:
    return DevicePool("sim", capacity=capacity, strategy="best_fit", expandable=False, host_backed=False)


# ---- DevicePool ----


def test_stats_and_summary_of_a_known_state() -> None:
    pool = best_fit_pool()
    _live = build_state(pool.allocate, pool.deallocate, pool.trim)
    check_stats(pool.stats())
    text = pool.memory_summary()
    check_summary(text)
    assert free_lines(text) == EXPECTED_LINES
    # The tier table: one best-fit segment of 2 MiB, b and d active, three free ranges.
    assert cells(text)["best_fit"] == ["1", "2.00 MiB", "2", "0 / 3"]


def test_summary_shows_cached_blocks_apart_from_the_free_ranges() -> None:
    # 2 MiB is a size class: freed, its block stays cached beside the free half of its 4 MiB segment.
    pool = best_fit_pool()
    pool.deallocate(pool.allocate(2 * MIB))
    s = pool.stats()
    assert (s["free_bytes"], s["cached_bytes"], s["largest_free_bytes"], s["fragmentation"]) == (4 * MIB, 2 * MIB, 2 * MIB, 0.0)
    text = pool.memory_summary()
    assert "Of it in cached blocks (freed, kept for reuse): 2.00 MiB" in free_lines(text)
    assert "Fragmentation: 0.0 %   reserved / allocated: 0.00" in free_lines(text)
    assert cells(text)["best_fit"] == ["1", "4.00 MiB", "0", "1 / 1"]


def test_peaks_after_a_rise_and_a_fall_and_a_reset() -> None:
    pool = best_fit_pool()
    _live = build_state(pool.allocate, pool.deallocate, pool.trim)
    s = pool.stats()
    assert (s["reserved_bytes.all.peak"], s["reserved_bytes.all.current"]) == (10 * MIB, 2 * MIB)
    assert (s["allocated_bytes.all.peak"], s["active_bytes.all.peak"], s["requested_bytes.all.peak"]) == (300 * KIB + BIG,) * 3
    pool.reset_peak_stats()
    s = pool.stats()
    for key in ("allocated_bytes", "active_bytes", "requested_bytes", "reserved_bytes", "allocation", "segment"):
        assert s[f"{key}.all.peak"] == s[f"{key}.all.current"], key
    assert s["reserved_bytes.all.peak"] == 2 * MIB and s["allocation.all.peak"] == 2


def test_out_of_memory_error_names_the_figures() -> None:
    # 16 MiB of device: the 2 MiB segment leaves 14 MiB; 15 MiB would need a 16 MiB segment.
    pool = best_fit_pool(16 * MIB)
    _live = build_state(pool.allocate, pool.deallocate, pool.trim)
    with pytest.raises(vrampool.OutOfMemoryError) as info:
        pool.allocate(15 * MIB)
    assert str(info.value) == (
        "out of memory: tried to allocate 15.00 MiB; pool has 300.00 KiB allocated, 2.00 MiB reserved "
        "(1.71 MiB reserved but unallocated, largest free block 1.12 MiB); device reports 14.00 MiB free"
    )
    assert (pool.stats()["num_ooms"], pool.stats()["num_alloc_retries"]) == (1, 1)


# ---- vrampool.torch, through the C ABI ----


def _abi() -> ctypes.CDLL:
    lib = ctypes.CDLL(_native.__file__)
    lib.vrampool_malloc.restype, lib.vrampool_malloc.argtypes = c_void_p, [c_size_t, c_int, c_void_p]
    lib.vrampool_free.restype, lib.vrampool_free.argtypes = None, [c_void_p, c_size_t, c_int, c_void_p]
    return lib


LIB = _abi()


@pytest.fixture
def abi(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    monkeypatch.delenv("VRAMPOOL_CONF", raising=False)

    def configure(capacity: str) -> None:
        _native._abi_reset()
        vt.configure(device="sim", sim_capacity=capacity, strategy="best_fit", expandable=False)

    yield configure
    _native._abi_reset()


def abi_state() -> List[Any]:
    sizes: Dict[int, int] = {}

    def allocate(n: int) -> int:
        p = LIB.vrampool_malloc(n, 0, None)
        assert p
        sizes[p] = n
        return p

    return build_state(allocate, lambda p: LIB.vrampool_free(p, sizes[p], 0, None), vt.empty_cache)


def test_torch_peaks_after_a_rise_and_a_fall(abi: Callable[[str], None]) -> None:
    abi("1GB")
    abi_state()
    assert (vt.memory_allocated(), vt.max_memory_allocated()) == (300 * KIB, 300 * KIB + BIG)
    assert (vt.memory_reserved(), vt.max_memory_reserved()) == (2 * MIB, 10 * MIB)
    check_stats(vt.memory_stats())
    vt.reset_peak_memory_stats()
    assert (vt.max_memory_allocated(), vt.max_memory_reserved()) == (300 * KIB, 2 * MIB)
    # A new rise counts from the reset: a 1 MiB block fits in the 1148 KiB tail, reserving nothing.
    p = LIB.vrampool_malloc(MIB, 0, None)
    LIB.vrampool_free(p, MIB, 0, None)
    assert (vt.max_memory_allocated(), vt.max_memory_reserved(), vt.memory_allocated()) == (300 * KIB + MIB, 2 * MIB, 300 * KIB)


def test_torch_summary_cell_by_cell(abi: Callable[[str], None]) -> None:
    abi("1GB")
    abi_state()
    text = vt.memory_summary()
    check_summary(text)
    assert free_lines(text) == EXPECTED_LINES
    assert cells(text)["best_fit"] == ["1", "2.00 MiB", "2", "0 / 3"]
    assert "best_fit" not in vt.memory_summary(abbreviated=True)


def test_torch_last_oom_figures_and_message(abi: Callable[[str], None]) -> None:
    abi("16MB")
    abi_state()
    assert LIB.vrampool_malloc(15 * MIB, 0, None) is None
    r = vt.last_oom()
    assert r is not None
    figures = (r.requested, r.allocated, r.reserved, r.free, r.largest_free, r.device_free, r.capacity, r.limit, r.too_large)
    assert figures == (15 * MIB, 300 * KIB, 2 * MIB, 1748 * KIB, 1148 * KIB, 14 * MIB, 16 * MIB, None, False)
    assert r.fragmentation == pytest.approx(600 / 1748, abs=1e-12)
    assert (r.strategy, r.num_ooms, r.round_up_divisions) == ("best_fit", 1, 0)
    assert r.message == (
        "CUDA out of memory. vrampool could not allocate 15.00 MiB on device 0: tried to allocate 15.00 MiB; pool has "
        "300.00 KiB allocated, 2.00 MiB reserved (1.71 MiB reserved but unallocated, largest free block 1.12 MiB); "
        "device reports 14.00 MiB free. vrampool.torch.last_oom() says what to try."
    )
    # 1.71 MiB free is less than the request: no "reserved but unallocated" hint; fragmentation
    # above 25 % suggests padding; the device has less free than the request.
    assert r.hints == (
        "pad requests to fewer distinct sizes: round_up_divisions:4 (VRAMPOOL_CONF, or install(round_up_divisions=4))",
        "the device reports only 14.00 MiB free: other processes or PyTorch's own cache hold the rest "
        "(torch.cuda.empty_cache() returns PyTorch's; nvidia-smi shows other processes)",
        "use a smaller batch (or shorter sequences), activation checkpointing, or lower precision",
    )


# ---- replay ----

# 0, 1, 2 side by side in one 2 MiB segment; 0 and 2 go and 3 (700 KiB) comes: at that moment the
# most is allocated (200 + 700 KiB). 2's range merged with the tail into [500, 2048) KiB, where 3
# went, leaving [0, 300) and [1200, 2048): 1148 KiB free, the largest range 848 KiB.
SCATTERED = [(0, 0, 3, 300 * KIB), (1, 1, 9, 200 * KIB), (2, 2, 3, 300 * KIB), (3, 3, 9, 700 * KIB)]


def test_replay_figures_of_a_known_trace() -> None:
    r = replay(SCATTERED, strategy="best_fit")
    assert (r["events"], r["lower_bound_bytes"], r["peak_allocated_bytes"]) == (8, 900 * KIB, 900 * KIB)
    assert (r["peak_reserved_bytes"], r["device_allocs"], r["device_frees"]) == (2 * MIB, 1, 0)
    assert r["fragmentation"] == pytest.approx(300 / 1148, abs=1e-12)
    assert r["timeline"]["allocated_bytes"] == [k * KIB for k in (300, 500, 800, 500, 200, 900, 700, 0)]
    assert r["events_per_s"] == pytest.approx(8 / r["seconds"], rel=1e-9)


def test_replay_command_prints_the_figures(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.csv"
    path.write_text("id,lower,upper,size\n" + "".join(f"{i},{lo},{hi},{n}\n" for i, lo, hi, n in SCATTERED))
    assert main(["replay", str(path), "--strategy", "best_fit", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    figures = {k: report[k] for k in ("strategy", "peak_reserved_bytes", "peak_allocated_bytes", "lower_bound_bytes", "events", "device_allocs", "device_frees")}
    assert figures == {"strategy": "best_fit", "peak_reserved_bytes": 2 * MIB, "peak_allocated_bytes": 900 * KIB,
                       "lower_bound_bytes": 900 * KIB, "events": 8, "device_allocs": 1, "device_frees": 0}
    assert report["fragmentation"] == pytest.approx(300 / 1148, abs=1e-12)
    assert main(["replay", str(path), "--strategy", "best_fit"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("best_fit"))
    # 2.0 MiB reserved, 2048 / 900 = 2.276 x the bound, one device allocation, 0.9 MiB allocated, fragmentation 0.26.
    assert row.split()[:8] == ["best_fit", "2.0", "MiB", "2.276x", "1", "0.9", "MiB", "0.26"]


# Each row of `vrampool replay` on SCATTERED, as the table prints it (events/s aside): peak reserved,
# reserved / bound (900 KiB), vs torch (2 MiB, one device allocation), device allocations, vs
# torch, peak allocated, fragmentation. Worked out by hand in crates/vrampool-whatif's
# every_rows_figures_on_a_small_trace_are_the_ones_worked_out_by_hand: best fit, PyTorch's pools
# and the driver's place 3 in the merged tail (1 - 848 / 1148); the slab rounds to its classes (320,
# 224, 768 KiB: 992 allocated) and its largest free is the 640 KiB class (1 - 640 / 1056); the buddy
# rounds to powers of two (1280 allocated; 1 - 512 / 768); CuPy allocates each request exactly
# (1500 KiB in four; 1 - 300 / 600); RMM grows by 300, 300, 600 and 1200 KiB (1 - 600 / 1500); the
# plan is the bound; ahead is the 2 MiB region of a plan of the whole trace, nothing free outside it,
# whose buffers (not the region) are what it allocates.
REPLAY_ROWS = {
    "default": "2.0 MiB 2.276x 1.00x 1 1.00x 1.0 MiB 0.39",
    "torch": "2.0 MiB 2.276x 1.00x 1 1.00x 0.9 MiB 0.26",
    "torch+expandable": "2.0 MiB 2.276x 1.00x 1 1.00x 0.9 MiB 0.26",
    "rmm": "2.3 MiB 2.667x 1.17x 4 4.00x 0.9 MiB 0.60",
    "cupy": "1.5 MiB 1.667x 0.73x 4 4.00x 0.9 MiB 0.50",
    "async": "2.0 MiB 2.276x 1.00x 1 1.00x 0.9 MiB 0.26",
    "slab": "2.0 MiB 2.276x 1.00x 1 1.00x 1.0 MiB 0.39",
    "best_fit": "2.0 MiB 2.276x 1.00x 1 1.00x 0.9 MiB 0.26",
    "buddy": "2.0 MiB 2.276x 1.00x 1 1.00x 1.2 MiB 0.33",
    "hybrid": "2.0 MiB 2.276x 1.00x 1 1.00x 1.0 MiB 0.39",
    "plan": "0.9 MiB 1.000x 0.44x 1 1.00x 0.9 MiB -",
    "ahead": "2.0 MiB 2.276x 1.00x 1 1.00x 0.9 MiB 0.00",
}


def test_every_row_of_the_replay_table_prints_its_figures(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 57: a figure no test checked (the RMM model's fragmentation returning 0 failed none).
    path = tmp_path / "t.csv"
    path.write_text("id,lower,upper,size\n" + "".join(f"{i},{lo},{hi},{n}\n" for i, lo, hi, n in SCATTERED))
    assert main(["replay", str(path), "--strategy", "all", "--ahead", "largest"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: 8 events, lower bound 0.9 MiB")
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[4:]}
    assert list(rows) == list(REPLAY_ROWS)
    for name, figures in REPLAY_ROWS.items():
        # Then events/s, and "approximate" for the driver's pool.
        assert rows[name][:9] == figures.split(), name
        assert rows[name][10:] == (["approximate"] if name == "async" else []), name
    # Twice over: the first pass's peak over the bound, and the last pass's device calls (none:
    # every block is cached from the first).
    assert main(["replay", str(path), "--strategy", "torch,cupy,rmm", "--repeat", "2"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[4:]}
    assert rows["torch"][:11] == "2.0 MiB 2.276x 1.00x 2.276x 1 1.00x 0 0.9 MiB 0.26".split()
    assert rows["cupy"][:11] == "1.5 MiB 1.667x 0.73x 1.667x 4 4.00x 0 0.9 MiB 0.50".split()
    assert rows["rmm"][:11] == "2.3 MiB 2.667x 1.17x 2.667x 4 4.00x 0 0.9 MiB 0.60".split()
    # Out of memory on a device of 1.5 MiB: the rows that reserve more say so.
    assert main(["replay", str(path), "--strategy", "torch,cupy", "--memory", "1500KB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert next(line for line in lines if line.startswith("torch")).endswith("  OOM")
    assert not next(line for line in lines if line.startswith("cupy")).endswith("OOM")


def test_the_fit_tables_print_each_allocators_figures() -> None:
    from vrampool.whatif.cli import format_fewest_ranks, format_fit
    from vrampool.whatif.cluster import RankProbe, RanksResult
    from vrampool.whatif.fit import FitResult, Probe

    at = {4: Probe(4, 3 * MIB, {"default": True, "torch": True}, {"default": 4 * MIB, "torch": 20 * MIB}),
          8: Probe(8, 6 * MIB, {"default": True, "torch": False}, {"default": 6 * MIB, "torch": 40 * MIB})}
    result = FitResult(64 * MIB, ["default", "torch", "plan"], {"default": 8, "torch": 4, "plan": 0}, list(at.values()))
    # Largest size, against torch's, and what the allocator reserved there beside the live bytes.
    assert [" ".join(line.split()) for line in format_fit(result, "batch size").splitlines()[2:]] == [
        "default 8 2.00x 6.0 MiB 6.0 MiB",
        "torch 4 1.00x 20.0 MiB 3.0 MiB",
        "plan 0 0.00x - -",
    ]
    ranks = RanksResult(8 << 30, 4, 64, ["default", "torch"], {"default": 16, "torch": None},
                        [RankProbe(16, 5 << 30, {"default": True}, {"default": 7 << 30}, world_size=16), RankProbe(64, 3 << 30, {"torch": False}, {"torch": 9 << 30}, world_size=64)])
    assert [" ".join(line.split()) for line in format_fewest_ranks(ranks).splitlines()[2:]] == [
        "default 16 7.00 GiB 5.00 GiB",
        "torch no number of ranks up to 64 fits: at 64 ranks a rank still holds 3.00 GiB live, mostly activations",
    ]


def test_torch_peaks_and_totals_outlast_a_released_private_pool(abi: Callable[[str], None]) -> None:
    # A CUDA graph's private pool takes a 20 MiB + 512 B block (a 22 MiB segment) beside the main
    # pool's 3 MiB + 100 KiB (an 8 MiB segment); both are live at once, so the device's peaks are
    # their sums. Released and emptied, the private pool goes: its segment is given back, and its
    # part of the peaks and the totals stays.
    class MempoolId(ctypes.Structure):
        _fields_ = [("first", ctypes.c_uint64), ("second", ctypes.c_uint64)]

    LIB.vrampool_begin_allocate_to_pool.argtypes = [c_int, MempoolId, c_void_p]
    LIB.vrampool_end_allocate_to_pool.argtypes = [c_int, MempoolId]
    LIB.vrampool_release_pool.argtypes = [c_int, MempoolId]
    abi("1GB")
    main_block = LIB.vrampool_malloc(BIG, 0, None)
    LIB.vrampool_begin_allocate_to_pool(0, MempoolId(1, 1), None)
    graph_block = LIB.vrampool_malloc(20 * MIB + 512, 0, None)
    LIB.vrampool_end_allocate_to_pool(0, MempoolId(1, 1))
    assert (vt.memory_reserved(), vt.max_memory_reserved()) == (30 * MIB, 30 * MIB)
    LIB.vrampool_free(graph_block, 20 * MIB + 512, 0, None)
    LIB.vrampool_release_pool(0, MempoolId(1, 1))
    assert _native.abi_counters()["private_pools"][0] == {"pools": [], "open": []}
    assert (vt.memory_reserved(), vt.max_memory_reserved()) == (8 * MIB, 30 * MIB)
    assert (vt.memory_allocated(), vt.max_memory_allocated()) == (BIG, BIG + 20 * MIB + 512)
    s = vt.memory_stats()
    assert tuple(s[f"allocation.all.{f}"] for f in ("current", "peak", "allocated", "freed")) == (1, 2, 2, 1)
    assert tuple(s[f"segment.all.{f}"] for f in ("current", "peak", "allocated", "freed")) == (1, 2, 2, 1)
    assert (s["reserved_bytes.all.allocated"], s["reserved_bytes.all.freed"]) == (30 * MIB, 22 * MIB)
    vt.reset_peak_memory_stats()
    assert (vt.max_memory_reserved(), vt.max_memory_allocated()) == (8 * MIB, BIG)
    LIB.vrampool_free(main_block, BIG, 0, None)
