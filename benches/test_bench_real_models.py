"""pytest-benchmark: `benches/real_models.py`'s four graphs (GPT-2 small and ResNet-50, forward
and training step, on fake tensors): vrampool's analysis of a traced graph (`from_graph`, then
`plan`) against torch's trace of it (`make_fx`), timed in the same run: the ratio is what
liveness and planning add to the tracing that any analysis needs (BENCHMARKS.md, "Python
benchmarks"). The traces take seconds a round; `-k forward` keeps the two quicker graphs."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import pytest

pytest.importorskip("torch")

from real_models import model_graphs  # noqa: E402  (benches/ is on sys.path: pytest's rootdir-relative import)
from vrampool.whatif.liveness import from_graph  # noqa: E402

TRACE_ROUNDS = 5
GRAPHS: List[Tuple[str, Callable[[], Any]]] = model_graphs()
IDS = ["gpt2-forward", "gpt2-training", "resnet50-forward", "resnet50-training"]


@pytest.fixture(scope="module")
def traced() -> Dict[int, Any]:
    """Each graph traced once, outside the timing (the first trace also pays torch's warm-up)."""
    return {graph: trace() for graph, (_, trace) in enumerate(GRAPHS)}


@pytest.mark.parametrize("graph", range(len(GRAPHS)), ids=IDS)
def test_liveness_and_plan(benchmark, traced: Dict[int, Any], graph: int) -> None:
    benchmark.group = GRAPHS[graph][0]
    result = benchmark(lambda: from_graph(traced[graph]).plan())
    assert result.arena_bytes >= result.lower_bound_bytes > 0
    benchmark.extra_info["arena_over_bound"] = result.arena_bytes / result.lower_bound_bytes


@pytest.mark.parametrize("graph", range(len(GRAPHS)), ids=IDS)
def test_torch_trace_baseline(benchmark, traced: Dict[int, Any], graph: int) -> None:
    benchmark.group = GRAPHS[graph][0]
    benchmark.pedantic(GRAPHS[graph][1], rounds=TRACE_ROUNDS)
