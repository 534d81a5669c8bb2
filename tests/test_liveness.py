"""Lifetimes from real PyTorch graphs (fake tensors on the CPU), planned into one arena."""

from __future__ import annotations

import operator

import pytest

torch = pytest.importorskip("torch")

from vrampool.liveness import Liveness, from_graph, trace_forward, trace_training_step  # noqa: E402


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


def check_sane(live: Liveness) -> None:
    for i in live.intervals:
        assert 0 <= i.lower < i.upper <= live.steps, i
        assert i.size >= 0 and i.kind in ("intermediate", "input", "output")


def test_training_step_intervals_follow_the_graph() -> None:
    gm = trace_training_step(mlp(), (torch.randn(4, 16),))
    live = from_graph(gm)
    check_sane(live)
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
        check_sane(live)
        result = live.plan(budget_ms=2000)
        assert result.lower_bound_bytes == live.lower_bound_bytes()
        assert result.arena_bytes <= 1.01 * result.lower_bound_bytes, (result.arena_bytes, result.lower_bound_bytes)


def test_exported_program() -> None:
    model = mlp()
    ep = torch.export.export(model, (torch.randn(4, 16),))
    live = from_graph(ep)
    check_sane(live)
    assert sum(i.kind == "input" for i in live.intervals) == 5  # 4 parameters and the input
    assert live.plan().arena_bytes >= live.lower_bound_bytes() > 0
