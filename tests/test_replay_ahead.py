"""The replay's `ahead` row: vrampool as installed, served by a plan made ahead of one step at its
largest shape (`vrampool replay --ahead STEP`, `--ahead largest`, and `vrampool fit`'s row)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import pytest

from vrampool.ahead import Plan
from vrampool.whatif.cli import main
from vrampool.whatif.fit import ALLOCATORS, fit
from vrampool.whatif.replay import COMPARE, ahead_plan, replay, replay_each
from vrampool.whatif.traces import Event, Trace

MIB = 1 << 20
UNIT = 64 << 10


def steps_trace(seqs: Sequence[int], weights: Sequence[int] = (2 * MIB, 4 * MIB)) -> Trace:
    """Weights made first (never freed), then a training step per length in ``seqs``, a ``step``
    event after each: activations kept for the backward, a temporary per layer, a gradient each."""
    events: List[Event] = []
    ids = iter(range(1, 1 << 30))

    def alloc(size: int) -> Event:
        e = Event("alloc", next(ids), size)
        events.append(e)
        return e

    def free(e: Event) -> None:
        events.append(Event("free", e.id, e.size))

    for size in weights:
        alloc(size)
    for seq in seqs:
        kept = []
        for layer in range(4):
            kept.append(alloc(seq * UNIT * (1 + layer % 2)))
            free(alloc(seq * seq * UNIT // 4 + UNIT))
        for activation in reversed(kept):
            gradient = alloc(seq * UNIT)
            free(activation)
            free(gradient)
        events.append(Event("step"))
    return Trace(events)


RUN = [3, 8, 5, 1, 7, 2, 6]


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.jsonl"
    steps_trace(RUN).write(path)
    return path


@pytest.fixture
def step_file(tmp_path: Path) -> Path:
    """The run's largest shape captured on its own, twice over: its first step also makes the
    weights, its second is the one to plan."""
    path = tmp_path / "step.jsonl"
    steps_trace([max(RUN)] * 2).write(path)
    return path


def by_row(reports: Sequence[Dict]) -> Dict[str, Dict]:
    return {r["strategy"]: r for r in reports}


def test_the_ahead_row_serves_every_step_within_the_bound_and_below_the_other_rows() -> None:
    trace = steps_trace(RUN)
    reports = by_row(replay_each(trace, list(COMPARE), ahead="largest", repeat=10))
    assert list(reports) == [*COMPARE, "ahead"]
    ahead, bound = reports["ahead"], reports["ahead"]["lower_bound_bytes"]
    for figure in ("peak_reserved_bytes", "first_pass_peak_reserved_bytes"):
        assert ahead[figure] <= 1.02 * bound + 2 * MIB, (figure, ahead[figure], bound)
        assert all(ahead[figure] <= r[figure] for r in reports.values()), {n: r[figure] for n, r in reports.items()}
    assert ahead["last_pass_device_allocs"] + ahead["last_pass_device_frees"] == 0
    once = replay(trace, "ahead")
    assert once["strategy"] == "ahead" and once["device_allocs"] + once["device_frees"] <= 64
    assert once["peak_reserved_bytes"] == ahead["first_pass_peak_reserved_bytes"]


def test_ahead_plans_the_largest_step_that_leaves_nothing_live(run_file: Path, step_file: Path) -> None:
    largest = ahead_plan("largest", run_file)
    assert largest.step == RUN.index(max(RUN)), "the first step also makes the weights: not that one"
    own = ahead_plan(step_file)

    def steps_part(plan: Plan) -> List[Tuple[int, int, int, int]]:
        """The rows that serve the steps after the first, their times from the part's start."""
        rows = plan.rows[plan.first :]
        start = min(lower for _, _, lower, _ in rows)
        return [(stream, size, lower - start, upper - start) for stream, size, lower, upper in rows]

    assert steps_part(own) == steps_part(largest), "a step captured on its own plans the same step"
    # Each also plans its first step (the weights and a step of its own shape): 2 weights, 12 buffers.
    assert own.first == largest.first == 2 + 12
    assert own.without_first_step().first == 0
    assert ahead_plan(largest) is largest


def test_replay_ahead_step_adds_the_row_in_the_table_and_json(run_file: Path, step_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(run_file), "--ahead", str(step_file)]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[4:]]
    assert rows == [*COMPARE, "ahead"]
    figures = {}
    for ahead in (str(step_file), "largest"):
        assert main(["replay", str(run_file), "--ahead", ahead, "--json", "--repeat", "3"]) == 0
        reports = json.loads(capsys.readouterr().out)
        assert [r["strategy"] for r in reports] == [*COMPARE, "ahead"]
        figures[ahead] = {k: v for k, v in reports[-1].items() if k not in ("seconds", "events_per_s")}
    assert figures[str(step_file)] == figures["largest"], "the step on its own and the run's largest plan alike"
    saved = tmp_path / "plan.json"
    ahead_plan("largest", run_file).save(saved)
    assert main(["replay", str(run_file), "--ahead", str(saved), "--strategy", "ahead", "--json", "--repeat", "3"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in one.items() if k not in ("seconds", "events_per_s")} == figures["largest"]


def test_a_trace_without_steps_is_one_step_planned_from_its_first_allocation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("id,lower,upper,size\n0,0,2,4194304\n1,1,3,2097152\n2,2,4,4194304\n")
    assert main(["replay", str(csv), "--strategy", "ahead", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["strategy"] == "ahead" and report["peak_reserved_bytes"] == report["lower_bound_bytes"] == 6 * MIB


def test_bad_ahead_arguments_are_one_line_and_exit_nonzero(run_file: Path, tmp_path: Path) -> None:
    not_a_trace = tmp_path / "notes.txt"
    not_a_trace.write_text("this is no trace\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"op": "step"}\n')
    bad_plan = tmp_path / "plan.json"
    bad_plan.write_text('{"format": "something else"}\n')
    for ahead, extra, message in [
        (str(tmp_path / "missing.jsonl"), [], f"--ahead {tmp_path / 'missing.jsonl'}: "),
        (str(not_a_trace), [], f"--ahead {not_a_trace}: "),
        (str(empty), [], "holds no allocations"),
        (str(bad_plan), [], "not a usable vrampool plan"),
        ("largest", ["--conf", "steady:false"], "would turn that off"),
    ]:
        done = subprocess.run([sys.executable, "-m", "vrampool.whatif.cli", "replay", str(run_file), "--ahead", ahead, *extra], capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and done.stdout == "", (ahead, done)
        assert done.stderr.count("\n") == 1 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_fit_has_an_ahead_row_that_plans_each_size() -> None:
    assert "ahead" in ALLOCATORS

    def capture(size: int) -> Trace:
        # `size` buffers of 3 MiB live at once, a step twice over: its plan needs 3 MiB each.
        rows = [(i + k * size, 3 * k, 3 * k + 2, 3 * MIB) for k in range(2) for i in range(size)]
        trace = Trace.from_rows(rows)
        trace.events.insert(2 * size, Event("step"))
        return trace

    # 64 MiB: 21 buffers' plan takes 63 MiB, and its arena is mapped in 2 MiB chunks.
    result = fit(capture, 64 * MIB, ["default", "ahead", "plan"])
    assert result.largest == {"default": 21, "ahead": 21, "plan": 21}
    assert result.probe(21).peak_reserved_bytes["ahead"] <= 64 * MIB
    assert result.probe(22).fits["ahead"] is False
