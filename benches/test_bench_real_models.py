"""pytest-benchmark: `benches/real_models.py`'s four graphs (GPT-2 small and ResNet-50, forward
and training step, on fake tensors), each analysed and planned (torch's `make_fx` trace, then
`from_graph` and `plan`) against torch's trace alone, timed in the same run: the ratio is what
vrampool's liveness and planning add to torch's tracing (BENCHMARKS.md, "Python benchmarks").
A few seconds a round; `-k forward` keeps the two quicker graphs."""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

import pytest

pytest.importorskip("torch")

from real_models import model_graphs  # noqa: E402  (benches/ is on sys.path: pytest's rootdir-relative import)

from vrampool.liveness import from_graph  # noqa: E402

ROUNDS = 5
GRAPHS: List[Tuple[str, Callable[[], Any]]] = model_graphs()
IDS = ["gpt2-forward", "gpt2-training", "resnet50-forward", "resnet50-training"]


@pytest.fixture(scope="module", autouse=True)
def torch_warm() -> None:
    # The first trace in a process pays torch's one-time warm-up (imports, decompositions).
    GRAPHS[0][1]()


@pytest.mark.parametrize("graph", range(len(GRAPHS)), ids=IDS)
def test_analyse_and_plan(benchmark, graph: int) -> None:
    name, trace = GRAPHS[graph]
    benchmark.group = name
    result = benchmark.pedantic(lambda: from_graph(trace()).plan(), rounds=ROUNDS)
    assert result.arena_bytes >= result.lower_bound_bytes > 0
    benchmark.extra_info["arena_over_bound"] = result.arena_bytes / result.lower_bound_bytes


@pytest.mark.parametrize("graph", range(len(GRAPHS)), ids=IDS)
def test_torch_trace_baseline(benchmark, graph: int) -> None:
    name, trace = GRAPHS[graph]
    benchmark.group = name
    benchmark.pedantic(trace, rounds=ROUNDS)
