"""The static planner from Python and the `vrampool plan` command, over the instances in tests/data/static."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import vrampool
from vrampool.whatif.cli import main

# MiniMalloc's instances come with the repository; ResNet-50's only from ../shared (see tests/data/static/README.md).
TRACES = Path(__file__).resolve().parent / "data" / "static"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "static"
needs_resnet50 = pytest.mark.skipif(
    not (SHARED / "somas-resnet50.csv").is_file(),
    reason="somas-resnet50.csv is not carried in the repo (no licence named) and ../shared/traces/static is not beside it",
)


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
        best_bound_bytes=report["best_bound_bytes"],
        algorithm=report["algorithm"],
        seconds=report["seconds"],
        optimal=report["optimal"],
    )
    check(plan)


@needs_resnet50
def test_resnet50_reaches_its_lower_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--input", str(SHARED / "somas-resnet50.csv"), "--budget-ms", "5000"]) == 0
    out = capsys.readouterr().out
    assert "arena / bound = 1.0000" in out


def test_cli_reports_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("id,lower,upper,size\n0,0,1,8\n1,zero,2,8\n")
    assert main(["plan", "--input", str(bad)]) == 1
    assert "line 3" in capsys.readouterr().err
    assert main(["plan", "--input", str(tmp_path / "missing.csv")]) == 1


def test_decide_gives_a_plan_within_the_capacity_or_says_why_not() -> None:
    rows = [(0, 0, 2, 100), (1, 1, 3, 50), (2, 2, 4, 100), (3, 0, 4, 8)]
    fits = vrampool.decide(rows, 158)
    assert fits.status == "fits" and fits.capacity == 158
    assert fits.plan is not None
    check(fits.plan)
    assert fits.plan.arena_bytes <= 158
    below = vrampool.decide(rows, 157)
    assert (below.status, below.plan) == ("infeasible", None)
    # A heuristic proves nothing: where its plan does not fit, the answer is "unknown".
    tight = [(0, 5, 6, 5), (1, 0, 3, 5), (2, 4, 8, 4), (3, 4, 6, 2), (4, 2, 5, 2), (5, 1, 3, 2)]
    assert vrampool.decide(tight, 12, algorithm="greedy-by-size").status == "unknown"
    assert vrampool.decide(tight, 11).status == "fits"


@pytest.mark.parametrize("capacity, message", [(0, "capacity"), (99, "below buffer 0"), (-1, "capacity"), (True, "capacity"), (1.5, "capacity")])
def test_decide_refuses_capacities_no_plan_can_meet(capacity: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        vrampool.decide([(0, 0, 2, 100), (1, 1, 3, 50)], capacity)  # type: ignore[arg-type]


def test_plan_reports_its_best_bound() -> None:
    result = vrampool.plan([(0, 0, 2, 100), (1, 1, 3, 50)])
    assert result.lower_bound_bytes == result.best_bound_bytes == result.arena_bytes == 150
    assert result.to_json()["best_bound_bytes"] == 150


def test_cli_decides_a_capacity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = str(TRACES / "minimalloc-challenging-F.csv")
    out = tmp_path / "plan.csv"
    assert main(["plan", "--input", source, "--capacity", "1048576", "--output", str(out)]) == 0
    assert "(fits in 1,048,576 B)" in capsys.readouterr().out
    assert out.exists()
    assert main(["plan", "--input", source, "--capacity", "1048576", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "fits" and report["arena_bytes"] <= report["capacity"] == 1048576
    # Below F's lower bound (and above its largest buffer): proven at once.
    assert main(["plan", "--input", source, "--capacity", "1000000"]) == 2
    assert capsys.readouterr().out.startswith("proven infeasible: no plan fits in 1,000,000 B")
    assert main(["plan", "--input", source, "--capacity", "1000000", "--json"]) == 2
    assert json.loads(capsys.readouterr().out) == {"status": "infeasible", "capacity": 1000000}
    # Greedy by size needs more than F's bound, and proves nothing.
    assert main(["plan", "--input", source, "--capacity", "1048576", "--algorithm", "greedy-by-size"]) == 2
    assert capsys.readouterr().out.startswith("greedy-by-size's plan does not fit in 1,048,576 B")
    # The search's budget can run out: with none, no plan and no proof.
    assert main(["plan", "--input", source, "--capacity", "1048576", "--budget-ms", "0"]) == 2
    assert capsys.readouterr().out.startswith("no plan found in the budget (0 ms) within 1,048,576 B")


def test_cli_refuses_a_capacity_below_the_largest_buffer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "two.csv"
    source.write_text("id,lower,upper,size\n0,0,2,100\n1,1,3,50\n")
    for capacity in ("0", "99"):
        assert main(["plan", "--input", str(source), "--capacity", capacity]) == 1
        err = capsys.readouterr().err
        assert "capacity" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
