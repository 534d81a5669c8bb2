"""pytest-benchmark: capture and replay from Python (BENCHMARKS.md, "Python benchmarks").

- capture: two CPU training steps of the demo's `gpt` model (vrampool.whatif.workloads) recorded by
  `capture_training`, against the same two steps unrecorded (`training_steps`);
- replay: that model's 4-step trace, once (a cold pool, as `vrampool replay` does) and 50 times
  back to back (`--repeat 50`: warm), through `vrampool.whatif.replay.replay` (hybrid, on the simulated
  device), against a Python loop that only walks the same events in replay order (a dict insert
  or pop each): what any Python-level replay costs before it models a pool; and against
  `Trace.rows()` alone, the conversion `replay` makes before the native replay.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest

torch = pytest.importorskip("torch")

from vrampool.whatif.capture import capture_training, training_steps  # noqa: E402
from vrampool.whatif.replay import repeated, replay  # noqa: E402
from vrampool.whatif.traces import Trace, TraceRow  # noqa: E402
from vrampool.whatif.workloads import capture_workload, gpt_batches, gpt_loss, gpt_model  # noqa: E402

STEPS = 2
ROUNDS = 10
TIMES = [1, 50]


@pytest.fixture(scope="module")
def model() -> Tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = gpt_model()
    return m, torch.optim.Adam(m.parameters(), lr=1e-3)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return capture_workload("gpt", steps=4)


def test_capture_training(benchmark, model) -> None:
    benchmark.group = "capture: 2 gpt training steps"
    m, opt = model
    captured = benchmark.pedantic(
        lambda: capture_training(m, gpt_batches(STEPS), loss_fn=gpt_loss, optimizer=opt), rounds=ROUNDS, warmup_rounds=1
    )
    assert sum(e.op == "step" for e in captured.events) == STEPS


def test_training_uncaptured_baseline(benchmark, model) -> None:
    benchmark.group = "capture: 2 gpt training steps"
    m, opt = model

    def train() -> None:
        for _ in training_steps(m, gpt_batches(STEPS), gpt_loss, opt):
            pass

    benchmark.pedantic(train, rounds=ROUNDS, warmup_rounds=1)


@pytest.fixture(scope="module")
def traces(trace: Trace) -> Dict[int, Trace]:
    """The trace once and 50 times back to back, as `Trace`s made outside the timing."""
    return {times: Trace.from_rows(repeated(trace.rows(), times)) for times in TIMES}


@pytest.mark.parametrize("times", TIMES)
def test_replay_hybrid(benchmark, traces: Dict[int, Trace], times: int) -> None:
    benchmark.group = f"replay: gpt trace x{times}"
    report = benchmark(replay, traces[times], "hybrid")
    assert report["events"] == 2 * len(traces[times].rows())
    benchmark.extra_info["events"] = report["events"]


@pytest.mark.parametrize("times", TIMES)
def test_walk_events_in_python_baseline(benchmark, traces: Dict[int, Trace], times: int) -> None:
    benchmark.group = f"replay: gpt trace x{times}"
    rows: List[TraceRow] = traces[times].rows()
    events: List[Tuple[int, int, int, int]] = sorted(
        e for ident, lower, upper, size, _ in rows for e in ((lower, 1, ident, size), (upper, 0, ident, -size))
    )

    def walk() -> int:
        live: Dict[int, int] = {}
        for _, is_alloc, ident, size in events:
            if is_alloc:
                live[ident] = size
            else:
                live.pop(ident)
        return len(live)

    assert benchmark(walk) == 0
    benchmark.extra_info["events"] = len(events)


@pytest.mark.parametrize("times", TIMES)
def test_trace_rows_baseline(benchmark, traces: Dict[int, Trace], times: int) -> None:
    benchmark.group = f"replay: gpt trace x{times}"
    assert len(benchmark(traces[times].rows)) == len(traces[1].rows()) * times
