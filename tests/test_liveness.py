"""Lifetimes from real PyTorch graphs (fake tensors on the CPU), planned into one arena."""

from __future__ import annotations

import operator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from vrampool.whatif.capture import capture_training  # noqa: E402
from vrampool.whatif.liveness import Liveness, from_graph, from_trace, trace_forward, trace_training_step  # noqa: E402
from vrampool.whatif.models import gpt, gpt2_small, resnet, resnet50  # noqa: E402


def mlp(inplace: bool = False) -> "torch.nn.Module":
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(inplace=inplace), torch.nn.Linear(32, 8))


def cnn() -> "torch.nn.Module":
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )


def transformer() -> "torch.nn.Module":
    return torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True, dropout=0.0),
        num_layers=2,
    )


def check_sane(live: Liveness, graph: Any = None) -> None:
    """Every interval lies inside the run and has a known kind; given the graph, each interval's
    size is its tensor's elements times their size (what a fresh storage holds)."""
    nodes = {} if graph is None else {n.name: n for n in getattr(graph, "graph_module", graph).graph.nodes}
    for i in live.intervals:
        assert 0 <= i.lower < i.upper <= live.steps, i
        assert i.kind in ("intermediate", "input", "output"), i
        if graph is not None:
            name, _, index = i.name.partition("[")
            value = nodes[name].meta["val"]
            tensor = value if isinstance(value, torch.Tensor) else value[int(index.rstrip("]") or 0)]
            assert i.size == tensor.numel() * tensor.element_size(), (i, tensor.shape, tensor.dtype)


def test_training_step_intervals_follow_the_graph() -> None:
    gm = trace_training_step(mlp(), (torch.randn(4, 16),))
    live = from_graph(gm)
    check_sane(live, gm)
    nodes = list(gm.graph.nodes)
    by_name = {i.name: i for i in live.intervals}
    # The forward activation saved for backward lives until its last backward use, which reads
    # it through an alias: the ReLU backward (threshold_backward).
    relu = by_name["relu"]
    step_of = {n.name: k for k, n in enumerate(nodes)}
    assert relu.upper == step_of["threshold_backward"] + 1 > step_of["mm_1"]
    # Views (t, expand, view, alias) own no storage: one interval per allocating node output.
    allocating = [n for n in nodes if n.op == "call_function" and n.target is not operator.getitem
                  and getattr(n.target, "_schema", None) is not None and n.target._schema.returns[0].alias_info is None]
    assert len([i for i in live.intervals if i.kind != "input"]) == len(allocating)
    # Parameters and the batch are inputs, pinned for the whole run and left out of the plan.
    inputs = [i for i in live.intervals if i.kind == "input"]
    assert len(inputs) == 5 and all((i.lower, i.upper) == (0, live.steps) for i in inputs)
    assert {r[0] for r in live.rows()}.isdisjoint({i.id for i in inputs})
    # Gradients are outputs: kept to the end.
    assert all(i.upper == live.steps for i in live.intervals if i.kind == "output")
    # Sizes by hand (float32, batch 4): the weights 32x16 and 8x32, their biases, the batch 4x16;
    # the hidden activation 4x32 and its gradient; the logits 4x8; the loss, a scalar.
    assert sorted(i.size for i in inputs) == [8 * 4, 32 * 4, 4 * 16 * 4, 8 * 32 * 4, 32 * 16 * 4]
    sizes = {name: by_name[name].size for name in ("relu", "threshold_backward", "addmm_1", "sum_1", "mm_1", "mm_2")}
    assert sizes == {"relu": 512, "threshold_backward": 512, "addmm_1": 128, "sum_1": 4, "mm_1": 1024, "mm_2": 2048}


def test_in_place_ops_allocate_nothing() -> None:
    plain = from_graph(trace_training_step(mlp(), (torch.randn(4, 16),)))
    inplace = from_graph(trace_training_step(mlp(inplace=True), (torch.randn(4, 16),)))
    # ReLU(inplace=True) writes into the linear layer's output: one storage fewer.
    assert sum(i.kind != "input" for i in inplace.intervals) == sum(i.kind != "input" for i in plain.intervals) - 1
    assert not any(i.name.startswith("relu") for i in inplace.intervals)


def test_options_pin_or_drop_inputs_and_outputs() -> None:
    gm = trace_forward(mlp(), (torch.randn(4, 16),))
    assert all(i.kind != "output" for i in from_graph(gm, outputs="exclude").intervals)
    pinned = from_graph(gm, inputs="pin")
    assert sum(i.lower == 0 and i.upper == pinned.steps for i in pinned.intervals) >= 5
    assert len(pinned.rows()) > len(from_graph(gm).rows())
    with pytest.raises(ValueError):
        from_graph(gm, inputs="maybe")


@pytest.mark.parametrize("make, shape", [(cnn, (8, 3, 32, 32)), (transformer, (4, 16, 64))])
def test_real_models_plan_within_one_percent_of_the_bound(make, shape) -> None:
    model = make()
    for gm in (trace_forward(model, (torch.randn(*shape),)), trace_training_step(model, (torch.randn(*shape),))):
        live = from_graph(gm)
        check_sane(live, gm)
        result = live.plan(budget_ms=2000)
        assert result.lower_bound_bytes == live.lower_bound_bytes()
        assert result.arena_bytes <= 1.01 * result.lower_bound_bytes, (result.arena_bytes, result.lower_bound_bytes)


def test_exported_program() -> None:
    model = mlp()
    ep = torch.export.export(model, (torch.randn(4, 16),))
    live = from_graph(ep)
    check_sane(live, ep)
    assert sum(i.kind == "input" for i in live.intervals) == 5  # 4 parameters and the input
    assert live.plan().arena_bytes >= live.lower_bound_bytes() > 0


def test_trace_plans_like_a_graph() -> None:
    torch.manual_seed(0)
    batches = [(torch.randn(8, 16), torch.randint(0, 8, (8,))) for _ in range(2)]
    trace = capture_training(mlp(), batches)
    live = from_trace(trace)
    check_sane(live)
    assert live.steps == len(trace.events)
    assert [(i.lower, i.upper, i.size) for i in live.intervals] == [r[1:4] for r in trace.rows()]
    assert live.lower_bound_bytes() == trace.peak_allocated_bytes() > 0
    result = live.plan()
    assert result.arena_bytes == result.lower_bound_bytes == trace.peak_allocated_bytes()


def test_trace_rows_may_reuse_an_id_once_it_is_freed() -> None:
    rows = [(7, 0, 2, 100), (7, 2, 4, 300), (8, 1, 3, 50, 1)]  # id 7 again after its free; a stream
    live = from_trace(rows)
    assert [(i.id, i.name) for i in live.intervals] == [(0, "7"), (1, "7"), (2, "8")]
    assert live.steps == 4 and live.lower_bound_bytes() == 350
    assert live.plan().arena_bytes == 350
    for bad in ([(1, 3, 3, 10)], [(1, 0, 2)], [(1, 0, 2, -5)]):
        with pytest.raises(ValueError):
            from_trace(bad)


def test_trace_files_keep_their_times(tmp_path) -> None:
    trace = capture_training(mlp(), [(torch.randn(8, 16), torch.randint(0, 8, (8,)))])
    jsonl, csv = tmp_path / "step.jsonl", tmp_path / "minimalloc.csv"
    trace.write(jsonl)
    csv.write_text("id,lower,upper,size\n0,10,30,100\n1,20,40,50\n2,30,50,100\n")
    assert [(i.lower, i.upper, i.size) for i in from_trace(jsonl).intervals] == [r[1:4] for r in trace.rows()]
    live = from_trace(csv)
    assert [(i.lower, i.upper) for i in live.intervals] == [(10, 30), (20, 40), (30, 50)]
    assert live.steps == 50 and live.lower_bound_bytes() == live.plan().arena_bytes == 150


def test_full_size_structures_have_the_published_parameter_counts() -> None:
    with torch.device("meta"):  # no memory: the benchmark traces these, the tests count them
        assert sum(p.numel() for p in gpt2_small().parameters()) == 124_439_808
        assert sum(p.numel() for p in resnet50().parameters()) == 25_557_032


@pytest.mark.parametrize(
    "make, example",
    [
        (lambda: gpt(layers=2, d_model=64, heads=4, seq_len=64, vocab=512), lambda: torch.randint(0, 512, (2, 64))),
        (lambda: resnet([1, 1], num_classes=10, width=8), lambda: torch.randn(2, 3, 32, 32)),
    ],
    ids=["gpt", "resnet"],
)
def test_scaled_down_models_plan_within_one_percent_of_the_bound(make, example) -> None:
    model = make()
    for gm in (trace_forward(model, (example(),)), trace_training_step(model, (example(),))):
        live = from_graph(gm)
        check_sane(live, gm)
        result = live.plan(budget_ms=2000)
        assert result.lower_bound_bytes == live.lower_bound_bytes() > 0
        assert result.arena_bytes <= 1.01 * result.lower_bound_bytes, (result.arena_bytes, result.lower_bound_bytes)


def test_gpt_attention_matrices_live_until_their_backward_use() -> None:
    batch, heads, seq = 2, 4, 64
    model = gpt(layers=1, d_model=64, heads=heads, seq_len=seq, vocab=128)
    gm = trace_training_step(model, (torch.randint(0, 128, (batch, seq)),))
    live = from_graph(gm)
    softmax = next(i for i in live.intervals if i.name.startswith("_softmax"))
    assert softmax.size == batch * heads * seq * seq * 4
    nodes = list(gm.graph.nodes)
    backward = next(k for k, n in enumerate(nodes) if n.name.startswith("_softmax_backward"))
    assert softmax.upper == backward + 1
