"""The `vrampool` command: each subcommand through main([...]) and as a process."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import List

import pytest

from vrampool.whatif.cli import DEMO_STRATEGIES, main
from vrampool.whatif.replay import ALL, REPORT_KEYS

MIB = 1 << 20
JSONL = "".join(
    json.dumps(e) + "\n"
    for e in [
        {"op": "alloc", "id": 1, "size": 3 * MIB},
        {"op": "alloc", "id": 2, "size": 4096},
        {"op": "free", "id": 1},
        {"op": "step"},
        {"op": "alloc", "id": 3, "size": 2 * MIB, "stream": 1},
        {"op": "free", "id": 2},
        {"op": "free", "id": 3},
    ]
)


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(JSONL)
    return path


def run(args: List[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vrampool.whatif.cli", *args], capture_output=True, text=True, timeout=120)


def test_replay_all_prints_every_row_and_plots(trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "plots" / "memory.svg"
    assert main(["replay", str(trace_file), "--strategy", "all", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "5 events" not in out and "6 events" in out and "lower bound 3.0 MiB" in out
    rows = [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] in ALL]
    assert rows == list(ALL)
    drawn = {e.get("data-strategy") for e in ET.parse(plot).getroot().iter() if e.get("class") == "series"}
    assert drawn == set(ALL) | {"lower bound"}


def test_replay_json_is_one_dict_or_a_list(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(trace_file), "--strategy", "buddy+vm", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["strategy"] == "buddy+vm" and set(REPORT_KEYS) <= set(one) and "timeline" not in one
    assert main(["replay", str(trace_file), "--strategy", "all", "--json", "--conf", "round_up_divisions:4"]) == 0
    several = json.loads(capsys.readouterr().out)
    assert [r["strategy"] for r in several] == list(ALL)
    assert {r["lower_bound_bytes"] for r in several} == {3 * MIB + 4096}


def test_replay_repeat_runs_the_trace_back_to_back(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(trace_file), "--strategy", "best_fit", "--repeat", "50", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    # The copies follow one another, so the bound stays one copy's.
    assert (r["events"], r["lower_bound_bytes"]) == (300, 3 * MIB + 4096)


def test_summary_table_and_json(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(trace_file), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["events"], s["buffers"], s["steps"], s["streams"]) == (6, 3, 1, 2)
    assert s["peak_live_bytes"] == 3 * MIB + 4096
    assert s["tiers"]["slab (<= 1 MiB)"] == {"buffers": 1, "bytes": 4096}
    assert s["tiers"]["best_fit"] == {"buffers": 2, "bytes": 5 * MIB}
    assert s["size_histogram"] == {"4096": 1, str(2 * MIB): 1, str(4 * MIB): 1}
    # Lifetimes in events: 1 lives [0, 2), 2 [1, 5), 3 [4, 6); 2 outlives the step at 3.
    assert s["lifetime_events"] == {"median": 2, "p90": 4, "max": 4}
    assert s["buffers_across_steps"] == 1
    assert main(["summary", str(trace_file)]) == 0
    out = capsys.readouterr().out
    assert "6 (3 buffers, 1 steps, 2 streams)" in out and "peak live       3.0 MiB" in out


def test_plan_still_works(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "b.csv"
    csv.write_text("id,lower,upper,size\n0,0,2,100\n1,1,3,50\n2,2,4,100\n")
    assert main(["plan", "--input", str(csv), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["arena_bytes"] == 150


def test_capture_writes_a_trace_that_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "cnn.jsonl"
    assert main(["capture", "--model", "cnn", "--steps", "2", "--output", str(out), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["model"] == "cnn" and figures["steps"] == 2 and figures["peak_live_bytes"] > MIB
    assert main(["summary", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2
    assert main(["replay", str(out), "--strategy", "hybrid", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lower_bound_bytes"] == figures["peak_live_bytes"]
    assert main(["capture", "--model", "cnn", "--steps", "2", "--scale", "2", "--output", str(tmp_path / "big.jsonl"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_live_bytes"] > figures["peak_live_bytes"]


def test_demo_prints_the_table_and_writes_the_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    assert main(["demo", "--steps", "1", "--scale", "1", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    for model in ("gpt", "cnn"):
        assert f"{model}: a small" in out
        for name in ("memory.svg", "segments.svg", "trace.jsonl"):
            assert (tmp_path / "demo" / f"{model}-{name}").stat().st_size > 0
        drawn = {e.get("data-strategy") for e in ET.parse(tmp_path / "demo" / f"{model}-memory.svg").getroot().iter() if e.get("class") == "series"}
        assert drawn == set(DEMO_STRATEGIES) | {"lower bound"}
    assert out.count("reserved/bound") == 2
    assert out.count("vs torch") == 4, "reserved and device calls beside torch's, in both tables"
    for strategy in DEMO_STRATEGIES:
        assert out.count(f"\n{strategy} ") == 2, strategy


@pytest.mark.parametrize(
    "args, message",
    [
        (["replay", "{missing}"], "missing.jsonl"),
        (["replay", "{bad}"], "line 2"),
        (["summary", "{bad}"], "line 2"),
        (["replay", "{trace}", "--conf", "colour:blue"], "unknown option `colour`"),
        (["replay", "{trace}", "--strategy", "torch", "--conf", "small_max:64KB"], "valid: torch: max_split_size_mb"),
        (["replay", "{trace}", "--memory", "lots"], "--memory"),
        (["capture", "--model", "gpt", "--steps", "0"], "--steps must be at least 1"),
        (["replay", "{trace}", "--repeat", "0"], "--repeat must be at least 1"),
        (["demo", "--steps", "1", "--out", "{tmp}/demo", "--conf", "small_max:1TB"], "small_max must lie between"),
        (["replay", "{trace}", "--plot", "{trace}/x.svg"], "cannot write"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(args: List[str], message: str, trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"op": "alloc", "id": 1, "size": 10}\n{"op": "free", "id": 9}\n')
    paths = {"missing": tmp_path / "missing.jsonl", "bad": bad, "trace": trace_file, "tmp": tmp_path}
    assert main([a.format(**paths) for a in args]) == 1
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1 and captured.err.startswith("vrampool ")
    assert captured.out == ""


def test_capture_refuses_an_output_it_cannot_write_before_capturing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import vrampool.whatif.workloads

    def no_capture(*_: object, **__: object) -> None:
        raise AssertionError("captured before the output path was checked")

    monkeypatch.setattr(vrampool.whatif.workloads, "capture_workload", no_capture)
    for output, message in [(tmp_path / "missing" / "t.jsonl", "no folder"), (tmp_path, "it is a folder")]:
        assert main(["capture", "--model", "cnn", "--output", str(output)]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and err.startswith("vrampool capture: cannot write"), err
    assert not (tmp_path / "missing").exists()


def test_plan_refuses_a_save_it_cannot_write_before_planning(trace_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 57: the plan was made, then saving it failed, in a line that named the trace.
    import vrampool.whatif.ahead

    def no_plan(*_: object, **__: object) -> None:
        raise AssertionError("planned before the output path was checked")

    monkeypatch.setattr(vrampool.whatif.ahead, "from_trace", no_plan)
    for save, message in [(tmp_path / "missing" / "p.json", "no folder"), (tmp_path, "it is a folder")]:
        assert main(["plan", "--trace", str(trace_file), "--save", str(save)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"vrampool plan: cannot write {save}: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize("code", [0, 3])
def test_capture_of_a_model_function_that_exits_is_one_line_and_no_file(code: int, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "quitter.py"
    script.write_text(f"import sys\ndef build():\n    sys.exit({code})\nclass Halt(BaseException):\n    pass\ndef halt():\n    raise Halt('no more')\n")
    out = tmp_path / "t.jsonl"
    for function, message in [("build", f"build exited with code {code} before its steps finished"), ("halt", "halt raised Halt: no more")]:
        done = run(["capture", "--model", f"{script}:{function}", "--output", str(out)])
        assert done.returncode == 1 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and done.stdout == "" and not out.exists()


def test_as_a_process(trace_file: Path, tmp_path: Path) -> None:
    done = run(["replay", str(trace_file), "--strategy", "all", "--json"])
    assert done.returncode == 0, done.stderr
    assert [r["strategy"] for r in json.loads(done.stdout)] == list(ALL)
    assert done.stderr == ""  # no progress bar without a terminal
    snap = tmp_path / "snap.pickle"
    snap.write_bytes(pickle.dumps({"device_traces": [[{"action": "alloc", "addr": 1 << 30, "size": "x"}]]}))
    done = run(["summary", str(snap)])
    assert done.returncode == 1 and "device_traces[0][0] (alloc): size" in done.stderr
    assert "Traceback" not in done.stderr
    done = run(["replay", str(trace_file), "--strategy", "fastest"])
    assert done.returncode == 1 and "unknown strategy 'fastest'" in done.stderr and "Traceback" not in done.stderr


def test_gpu_comparison_prints_both_allocators(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # No GPU here: the child processes are stood in for, so only the table and the failure path are checked.
    from vrampool.whatif import cli

    def fake_run(argv: List[str], **_: object) -> subprocess.CompletedProcess:
        assert argv[-1].endswith("3, scale=8)))"), argv[-1]
        if "'vrampool'" in argv[-1]:
            return subprocess.CompletedProcess(argv, 1, "", "Traceback ...\nRuntimeError: no CUDA driver\n")
        figures = {"allocator": "pytorch", "peak_reserved_bytes": 96 * MIB, "peak_allocated_bytes": 80 * MIB, "seconds": 1.5}
        return subprocess.CompletedProcess(argv, 0, json.dumps(figures) + "\n", "")

    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    cli.gpu_comparison(steps=3, scale=8)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines if line.startswith(("gpt", "cnn"))] == [
        ["gpt", "pytorch"], ["gpt", "vrampool"], ["cnn", "pytorch"], ["cnn", "vrampool"],
    ]
    assert any("96.0 MiB" in line and "80.0 MiB" in line for line in lines)
    assert any(line.endswith("failed: RuntimeError: no CUDA driver") for line in lines)


def test_progress_bars_only_on_a_terminal_and_never_with_json(monkeypatch: pytest.MonkeyPatch) -> None:
    from tqdm import tqdm

    from vrampool.whatif import cli

    items = [1, 2, 3]
    assert cli._progress(items, 3, "replay") is items  # pytest's stderr is no terminal
    monkeypatch.setattr(cli.sys.stderr, "isatty", lambda: True)
    bar = cli._progress(items, 3, "replay")
    assert isinstance(bar, tqdm) and list(bar) == items
    assert cli._progress(items, 3, "replay", quiet=True) is items
