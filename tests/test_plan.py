"""The static planner from Python and the `vrampool plan` command, over the shared instances."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import vrampool
from vrampool.cli import main

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "static"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces/static is not beside the repo")


def overlaps(a: tuple, b: tuple) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def check(result: vrampool.PlanResult) -> None:
    rows = list(zip(result.buffers, result.offsets))
    for i, (a, oa) in enumerate(rows):
        for b, ob in rows[i + 1 :]:
            if overlaps(a, b):
                assert oa + a[3] <= ob or ob + b[3] <= oa, f"{a} at {oa} and {b} at {ob} share bytes"
    assert result.arena_bytes == max(o + r[3] for r, o in rows)
    assert result.arena_bytes >= result.lower_bound_bytes


def test_small_instance_reaches_the_bound() -> None:
    result = vrampool.plan([(0, 0, 2, 100), (1, 1, 3, 50), (2, 2, 4, 100), (3, 0, 4, 8)])
    check(result)
    assert result.arena_bytes == result.lower_bound_bytes == 158
    for algorithm in ("greedy-by-size", "best-fit", "exact"):
        check(vrampool.plan(result.buffers, algorithm=algorithm))


def test_alignment_is_kept() -> None:
    result = vrampool.plan([(0, 0, 2, 100), (1, 1, 3, 50)], alignment=64)
    assert all(o % 64 == 0 for o in result.offsets)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([(0, 5, 5, 10)], "lifetime"),
        ([(0, 0, 1, 0)], "size"),
        ([(0, 0, 1, 8), (0, 1, 2, 8)], "id"),
        ([(0, 0, 1)], "ints"),
        ([(0, 0, 1, -4)], "negative"),
    ],
)
def test_bad_buffers_are_value_errors(rows: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        vrampool.plan(rows)


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="algorithm"):
        vrampool.plan([(0, 0, 1, 8)], algorithm="magic")
    with pytest.raises(ValueError, match="alignment"):
        vrampool.plan([(0, 0, 1, 8)], alignment=0)


@needs_traces
def test_cli_plans_a_shared_instance_to_json_and_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.csv"
    source = TRACES / "minimalloc-challenging-F.csv"
    assert main(["plan", "--input", str(source), "--budget-ms", "3000", "--output", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) >= {"arena_bytes", "lower_bound_bytes", "algorithm", "seconds", "buffers"}
    assert report["arena_bytes"] >= report["lower_bound_bytes"] > 0
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["id", "lower", "upper", "size", "offset"]
    assert len(rows) == len(report["buffers"]) == sum(1 for _ in source.open()) - 1
    plan = vrampool.PlanResult(
        buffers=[(int(r["id"]), int(r["lower"]), int(r["upper"]), int(r["size"])) for r in rows],
        offsets=[int(r["offset"]) for r in rows],
        arena_bytes=report["arena_bytes"],
        lower_bound_bytes=report["lower_bound_bytes"],
        algorithm=report["algorithm"],
        seconds=report["seconds"],
        optimal=report["optimal"],
    )
    check(plan)


@needs_traces
def test_resnet50_reaches_its_lower_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--input", str(TRACES / "somas-resnet50.csv"), "--budget-ms", "5000"]) == 0
    out = capsys.readouterr().out
    assert "arena / bound = 1.0000" in out


def test_cli_reports_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("id,lower,upper,size\n0,0,1,8\n1,zero,2,8\n")
    assert main(["plan", "--input", str(bad)]) == 1
    assert "line 3" in capsys.readouterr().err
    assert main(["plan", "--input", str(tmp_path / "missing.csv")]) == 1
