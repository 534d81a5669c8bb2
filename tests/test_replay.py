"""Trace replay: `vrampool.whatif.replay` and `vrampool replay`."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest

import vrampool
from vrampool.whatif.cli import main
from vrampool.whatif.replay import (
    ALL,
    COMPARE,
    PEERS,
    REPORT_KEYS,
    STRATEGIES,
    live_bytes_timeline,
    peak_segments,
    recorded_reserved_timeline,
    replay,
    summary,
)
from vrampool.whatif.traces import from_snapshot, read_trace

# MiniMalloc's instances come with the repository; ResNet-50's only from ../shared (see tests/data/static/README.md).
TRACES = Path(__file__).resolve().parent / "data" / "static"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "static"
needs_resnet50 = pytest.mark.skipif(
    not (SHARED / "somas-resnet50.csv").is_file(),
    reason="somas-resnet50.csv is not carried in the repo (no licence named) and ../shared/traces/static is not beside it",
)

MIB = 1 << 20
# 0 and 1 overlap on [1, 2); 2 starts when 0 ends (frees come first): at most 6 MiB live.
SMALL = [(0, 0, 2, 4 * MIB), (1, 1, 3, 2 * MIB), (2, 2, 4, 4 * MIB)]


def write_trace(path: Path, rows, header: str = "id,lower,upper,size") -> Path:
    path.write_text(header + "\n" + "".join(",".join(str(v) for v in row) + "\n" for row in rows))
    return path


def test_read_trace_adds_the_default_stream(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.csv", SMALL)
    assert read_trace(path) == [row + (0,) for row in SMALL]
    with_streams = write_trace(tmp_path / "s.csv", [(0, 0, 2, 512, 1), (1, 1, 3, 512, 2)], "id,lower,upper,size,stream")
    assert [row[4] for row in read_trace(with_streams)] == [1, 2]


def check_timing(report, wall: float) -> None:
    """The replay's own time lies within the call's, and events per second are events over it."""
    assert 0 < report["seconds"] <= wall, (report["seconds"], wall)
    assert report["events_per_s"] == pytest.approx(report["events"] / report["seconds"], rel=1e-9)
    assert report["events_per_s"] >= report["events"] / wall


def test_small_trace_figures() -> None:
    for strategy in STRATEGIES:
        start = time.perf_counter()
        r = replay(SMALL, strategy=strategy)
        check_timing(r, time.perf_counter() - start)
        assert set(REPORT_KEYS) <= set(r)
        assert r["strategy"] == strategy
        assert r["events"] == 6
        assert r["lower_bound_bytes"] == 6 * MIB
        assert r["peak_allocated_bytes"] == 6 * MIB
        assert r["peak_reserved_bytes"] >= 6 * MIB
        assert r["device_allocs"] >= 1


def test_replay_all_returns_every_strategy_and_the_plan(tmp_path: Path) -> None:
    reports = replay(write_trace(tmp_path / "t.csv", SMALL), strategy="all")
    assert [r["strategy"] for r in reports] == list(ALL) == ["default", *PEERS, *STRATEGIES, "plan"]
    assert {r["lower_bound_bytes"] for r in reports} == {6 * MIB}
    for r in reports:
        assert set(REPORT_KEYS) <= set(r), r["strategy"]
    # 0 at offset 0, 1 above it, 2 where 0 was: the plan meets the bound.
    planned = reports[-1]
    assert (planned["peak_reserved_bytes"], planned["device_allocs"], planned["fragmentation"]) == (6 * MIB, 1, None)


def test_plan_row_is_the_planners_arena() -> None:
    # Sizes that are no multiple of 512: the plan is held to the pool's alignment.
    rows = [(0, 0, 3, 1000), (1, 1, 4, 3000), (2, 2, 5, 700), (3, 4, 6, 5000)]
    start = time.perf_counter()
    report = replay(rows, strategy="plan")
    check_timing(report, time.perf_counter() - start)
    expected = vrampool.plan(rows, alignment=512, budget_ms=500)
    assert report["peak_reserved_bytes"] == expected.arena_bytes == 6144
    # Requested bytes peak at time 4 (700 + 5000, 3000 freed first); rounded to 512, at 6144.
    assert (report["lower_bound_bytes"], report["peak_allocated_bytes"]) == (5700, 6144)
    assert report["lower_bound_bytes"] == replay(rows, strategy="best_fit")["lower_bound_bytes"]
    assert report["events"] == 8


def test_timeline_follows_the_live_bytes() -> None:
    # Events: alloc 0, alloc 1, free 0, alloc 2, free 1, free 2.
    live = [4 * MIB, 6 * MIB, 2 * MIB, 6 * MIB, 4 * MIB, 0]
    for strategy in ("best_fit", "plan"):
        line = replay(SMALL, strategy=strategy)["timeline"]
        assert line["event"] == [1, 2, 3, 4, 5, 6], strategy
        assert line["allocated_bytes"] == live, strategy
        assert all(r >= a for r, a in zip(line["reserved_bytes"], line["allocated_bytes"])), strategy
    halves = replay(SMALL, strategy="hybrid", samples=2)["timeline"]
    assert halves["event"] == [3, 6] and halves["allocated_bytes"] == [2 * MIB, 0]
    assert replay(SMALL, strategy="slab", samples=0)["timeline"]["event"] == []
    assert live_bytes_timeline([r + (0,) for r in SMALL], 4) == ([2, 4, 6], [6 * MIB, 6 * MIB, 0])


def test_a_replay_on_ten_thousand_streams_samples_within_a_bound_of_work_an_event(tmp_path: Path) -> None:
    # Issue 57: every timeline sample reads the pool's stats, which visit each stream's arena
    # holding memory; 20,000 events on 10,000 streams (each buffer its own, all live at once) took
    # 15 s a row with 1,000 samples. A sample may visit every stream: at most 16 an event in all.
    streams = 10_000
    path = write_trace(tmp_path / "streams.csv", [(i, i, 2 * streams - i, 4096, i + 1) for i in range(streams)], "id,lower,upper,size,stream")
    for report in replay(path, strategy=["default", "torch"]):
        points = len(report["timeline"]["event"])
        assert (points - 1) * streams <= 16 * report["events"], (report["strategy"], points)
        assert report["timeline"]["event"][-1] == report["events"] == 2 * streams
        assert report["peak_allocated_bytes"] == report["lower_bound_bytes"] == streams * 4096


# At time 4 buffer 0 dies while 1 and 2 are born, on two streams: frees come first, so the most
# live at once is 2 and 3 (7 MiB), never 0 with them (13 MiB).
TIES = [(0, 0, 4, 6 * MIB, 0), (1, 4, 8, 3 * MIB, 0), (2, 4, 6, 4 * MIB, 7), (3, 6, 9, 1 * MIB, 7)]


def test_the_plan_row_and_the_pools_order_ties_alike() -> None:
    plan, pool = replay(TIES, strategy=["plan", "best_fit"])
    assert plan["lower_bound_bytes"] == pool["lower_bound_bytes"] == 7 * MIB
    assert plan["timeline"]["event"] == pool["timeline"]["event"]
    assert plan["timeline"]["allocated_bytes"] == pool["timeline"]["allocated_bytes"] == [6 * MIB, 0, 3 * MIB, 7 * MIB, 3 * MIB, 4 * MIB, 1 * MIB, 0]


def test_peak_segments_hold_the_buffers_live_at_the_peak_on_their_streams() -> None:
    segments = peak_segments(TIES, "best_fit")
    active = sorted((b["requested_size"], seg["stream"]) for seg in segments for b in seg["blocks"] if b["state"] == "active_allocated")
    assert active == [(3 * MIB, 0), (4 * MIB, 7)]
    with pytest.raises(ValueError, match="no vrampool segments"):
        peak_segments(TIES, "torch")


def test_virtual_memory_growth_reserves_less_for_middle_sizes() -> None:
    # Five 3 MiB buffers live at once: a plain segment for a 1-10 MiB request has room for two
    # (6 MiB here), growth by mapping reserves what is used, in 2 MiB chunks.
    rows = [(i, i, 10, 3 * MIB) for i in range(5)]
    plain, grown = replay(rows, strategy=["best_fit", "best_fit+vm"])
    assert plain["peak_reserved_bytes"] == 18 * MIB
    assert 15 * MIB <= grown["peak_reserved_bytes"] < 18 * MIB
    with pytest.raises(ValueError, match="unknown strategy"):
        replay(rows, strategy="plan+vm")


def test_what_if_reports_what_pytorch_reserved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seg = 1 << 40
    snapshot = {
        "device_traces": [
            [
                {"action": "segment_alloc", "addr": seg, "size": 20 * MIB, "stream": 0},
                {"action": "alloc", "addr": seg, "size": 3 * MIB, "stream": 0},
                {"action": "alloc", "addr": seg + 3 * MIB, "size": 3 * MIB, "stream": 0},
                {"action": "free_completed", "addr": seg, "size": 3 * MIB, "stream": 0},
            ]
        ],
        "segments": [{"device": 0, "total_size": 20 * MIB, "stream": 0, "blocks": []}],
    }
    trace = from_snapshot(snapshot)
    reports = replay(trace, strategy="all")
    assert {r["recorded_reserved_bytes"] for r in reports} == {20 * MIB}
    assert recorded_reserved_timeline(trace) == ([0, 0], [0, 20 * MIB])
    assert "recorded_reserved_bytes" not in replay(SMALL)
    assert summary(trace)["recorded_reserved_bytes"] == 20 * MIB and summary(trace)["peak_live_bytes"] == 6 * MIB
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    assert main(["replay", str(path), "--strategy", "all"]) == 0
    out = capsys.readouterr().out
    assert "vs recorded" in out
    assert any(line.startswith("recorded") and "20.0 MiB" in line for line in out.splitlines()), out
    # The model of PyTorch's allocator predicts the 20 MiB segment two 3 MiB blocks share.
    assert "PyTorch reserved 20.0 MiB; the torch model predicts 20.0 MiB (1.000x)" in out
    assert main(["replay", str(path), "--strategy", "default"]) == 0
    assert "the torch model predicts" in capsys.readouterr().out, "the model's row is added to any selection"
    # A snapshot that mapped memory was made with expandable segments: that model stands beside it.
    # Two 3 MiB blocks in the large pool's one 20 MiB page.
    mapped = {
        "device_traces": [[{"action": "segment_map", "addr": seg, "size": 20 * MIB, "stream": 0}] + snapshot["device_traces"][0][1:]],
        "segments": [{"device": 0, "total_size": 20 * MIB, "stream": 0, "blocks": [], "is_expandable": True}],
    }
    path.write_bytes(pickle.dumps(mapped))
    assert main(["replay", str(path), "--strategy", "default"]) == 0
    assert "PyTorch reserved 20.0 MiB; the torch+expandable model predicts 20.0 MiB (1.000x)" in capsys.readouterr().out


def test_replay_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown strategy"):
        replay(SMALL, strategy="fastest")
    with pytest.raises(ValueError, match="row 0"):
        replay([(0, 1, 2)])
    with pytest.raises(ValueError, match="upper"):
        replay([(0, 2, 2, 100)])
    with pytest.raises(ValueError, match="unknown option `colour`"):
        replay(SMALL, conf="colour:blue")


def test_cli_json_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_trace(tmp_path / "t.csv", SMALL)
    assert main(["replay", str(path), "--json"]) == 0
    compared = json.loads(capsys.readouterr().out)
    assert [r["strategy"] for r in compared] == list(COMPARE)
    assert main(["replay", str(path), "--strategy", "default", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert isinstance(one, dict) and set(REPORT_KEYS) <= set(one)
    assert one["strategy"] == "default" and one["lower_bound_bytes"] == 6 * MIB
    assert main(["replay", str(path), "--strategy", "all", "--json"]) == 0
    several = json.loads(capsys.readouterr().out)
    assert isinstance(several, list) and [r["strategy"] for r in several] == list(ALL)
    for r in several:
        assert set(REPORT_KEYS) <= set(r) and "timeline" not in r


def test_cli_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_trace(tmp_path / "t.csv", SMALL)
    assert main(["replay", str(path), "--strategy", "all"]) == 0
    out = capsys.readouterr().out
    assert "6 events" in out and "reserved/bound" in out
    for strategy in ALL:
        assert strategy in out


def test_cli_bad_input_exits_1_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("id,lower,upper,size\n0,0,2,100\n1,0,x,100\n")
    assert main(["replay", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "line 3" in err and "bad.csv" in err
    dup = write_trace(tmp_path / "dup.csv", [(0, 0, 2, 100), (0, 1, 3, 100)])
    assert main(["replay", str(dup)]) == 1
    assert "line 3" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.csv")]) == 1
    assert "missing.csv" in capsys.readouterr().err


def test_carried_instances_reserve_at_least_the_bound() -> None:
    paths = sorted(TRACES.glob("*.csv"))
    assert len(paths) == 6
    for path in paths:
        for r in replay(path, strategy="all"):
            assert r["peak_reserved_bytes"] >= r["lower_bound_bytes"] > 0, (path.name, r)


@needs_resnet50
def test_resnet50_replays_with_every_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(SHARED / "somas-resnet50.csv"), "--strategy", "all", "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert len(reports) == len(ALL)
    assert all(r["peak_reserved_bytes"] >= r["lower_bound_bytes"] > 0 for r in reports)


@pytest.mark.parametrize("model", ["gpt", "cnn"])
def test_default_reserves_no_more_than_pytorchs_allocator_on_the_demos_traces(model: str) -> None:
    pytest.importorskip("torch")
    from vrampool.whatif.workloads import capture_workload

    trace = capture_workload(model, steps=6, scale=2, fake=True)
    default, torch, expandable = replay(trace, strategy="compare")
    assert default["peak_reserved_bytes"] <= min(torch["peak_reserved_bytes"], expandable["peak_reserved_bytes"]), (default, torch, expandable)
