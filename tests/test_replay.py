"""Trace replay: `vrampool.trace` and `vrampool replay`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vrampool.cli import main
from vrampool.trace import REPORT_KEYS, STRATEGIES, read_trace, replay

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "static"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces/static is not beside the repo")

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


def test_small_trace_figures() -> None:
    for strategy in STRATEGIES:
        r = replay(SMALL, strategy=strategy)
        assert set(REPORT_KEYS) <= set(r)
        assert r["strategy"] == strategy
        assert r["events"] == 6
        assert r["lower_bound_bytes"] == 6 * MIB
        assert r["peak_allocated_bytes"] == 6 * MIB
        assert r["peak_reserved_bytes"] >= 6 * MIB
        assert r["device_allocs"] >= 1
        assert r["events_per_s"] > 0


def test_replay_all_returns_every_strategy(tmp_path: Path) -> None:
    reports = replay(write_trace(tmp_path / "t.csv", SMALL), strategy="all")
    assert [r["strategy"] for r in reports] == list(STRATEGIES)
    assert {r["lower_bound_bytes"] for r in reports} == {6 * MIB}


def test_replay_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown strategy"):
        replay(SMALL, strategy="fastest")
    with pytest.raises(ValueError, match="row 0"):
        replay([(0, 1, 2)])
    with pytest.raises(ValueError, match="upper"):
        replay([(0, 2, 2, 100)])


def test_cli_json_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_trace(tmp_path / "t.csv", SMALL)
    assert main(["replay", str(path), "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert isinstance(one, dict) and set(REPORT_KEYS) <= set(one)
    assert one["strategy"] == "hybrid" and one["lower_bound_bytes"] == 6 * MIB
    assert main(["replay", str(path), "--strategy", "all", "--json"]) == 0
    several = json.loads(capsys.readouterr().out)
    assert isinstance(several, list) and [r["strategy"] for r in several] == list(STRATEGIES)
    for r in several:
        assert set(REPORT_KEYS) <= set(r)


def test_cli_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_trace(tmp_path / "t.csv", SMALL)
    assert main(["replay", str(path), "--strategy", "all"]) == 0
    out = capsys.readouterr().out
    assert "6 events" in out and "reserved/bound" in out
    for strategy in STRATEGIES:
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


@needs_traces
def test_shared_instances_reserve_at_least_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    for path in sorted(TRACES.glob("*.csv")):
        for r in replay(path, strategy="all"):
            assert r["peak_reserved_bytes"] >= r["lower_bound_bytes"] > 0, (path.name, r)
    assert main(["replay", str(TRACES / "somas-resnet50.csv"), "--strategy", "all", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == len(STRATEGIES)
