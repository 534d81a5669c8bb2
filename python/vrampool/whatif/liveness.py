"""Tensor lifetimes: when each storage is born and when it dies, from PyTorch graphs or from
recorded allocation traces.

``from_graph`` works on a ``torch.fx.GraphModule`` whose nodes carry fake-tensor metadata
(``meta["val"]``, as ``make_fx(..., tracing_mode="fake")`` and ``torch.export`` leave them) and
on a ``torch.export.ExportedProgram``, so no real memory or GPU is needed. Views and aliases
share their base's storage and extend its life; in-place ops allocate nothing; inputs
(parameters, buffers, user inputs) and outputs are reported apart. ``from_trace`` takes a trace
that :mod:`vrampool.whatif.capture` recorded (or its rows).

>>> import torch
>>> from vrampool.whatif.liveness import from_graph, trace_training_step
>>> model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
>>> live = from_graph(trace_training_step(model, (torch.randn(2, 8),)))
>>> live.plan().arena_bytes >= live.lower_bound_bytes()
True
"""

from __future__ import annotations

import dataclasses
import operator
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from vrampool.planner import PlanResult, Row, plan

KINDS = ("intermediate", "input", "output")


@dataclasses.dataclass(frozen=True)
class Interval:
    """One storage: live on ``[lower, upper)`` in node steps, ``size`` bytes."""

    id: int
    lower: int
    upper: int
    size: int
    name: str
    kind: str


@dataclasses.dataclass(frozen=True)
class Liveness:
    """The storages of a graph and their lifetimes; ``steps`` is the number of nodes."""

    intervals: List[Interval]
    steps: int

    def rows(self, kinds: Iterable[str] = ("intermediate", "output")) -> List[Row]:
        """``(id, lower, upper, size)`` rows of the given kinds, for the planner."""
        wanted = set(kinds)
        return [(i.id, i.lower, i.upper, i.size) for i in self.intervals if i.kind in wanted and i.size > 0]

    def lower_bound_bytes(self, kinds: Iterable[str] = ("intermediate", "output")) -> int:
        """The most bytes live at one step."""
        rows = self.rows(kinds)
        events = sorted([(lo, s) for _, lo, _, s in rows] + [(up, -s) for _, _, up, s in rows])
        live = best = 0
        for _, delta in events:  # frees sort before allocations at the same step
            live += delta
            best = max(best, live)
        return best

    def plan(self, kinds: Iterable[str] = ("intermediate", "output"), **options: Any) -> PlanResult:
        """Offsets for these storages in one arena (``vrampool.plan`` options pass through)."""
        return plan(self.rows(kinds), **options)


def _tensors(value: Any) -> List[Tuple[int, Any]]:
    """(index, tensor) pairs of a node's value: one tensor, or a tuple/list of them."""
    import torch

    if isinstance(value, torch.Tensor):
        return [(0, value)]
    if isinstance(value, (tuple, list)):
        return [(i, v) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
    return []


def _nbytes(tensor: Any) -> int:
    try:
        return int(tensor.untyped_storage().nbytes())
    except Exception:  # symbolic or storage-less tensors: the dense size
        return int(tensor.numel()) * tensor.element_size()


def _aliased_argument(node: Any) -> Optional[Any]:
    """The input node whose storage `node`'s output shares (a view or an in-place op), if any."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns or schema.returns[0].alias_info is None:
        return None
    ret_sets = set(schema.returns[0].alias_info.before_set)
    for arg_schema, arg in zip(schema.arguments, node.args):
        info = arg_schema.alias_info
        if info is not None and set(info.before_set) & ret_sets and hasattr(arg, "op"):
            return arg
    return next((a for a in node.args if hasattr(a, "op")), None)


def from_graph(graph: Any, *, inputs: str = "exclude", outputs: str = "pin") -> Liveness:
    """Lifetimes of every storage in ``graph`` (a GraphModule or an ExportedProgram).

    ``inputs``: ``"exclude"`` (default) leaves placeholders out of the intervals' kinds you plan
    (they are still reported, as kind ``input``, pinned for the whole run); ``outputs``:
    ``"pin"`` (default) keeps outputs alive to the end of the graph, ``"exclude"`` drops them.
    """
    if inputs not in ("exclude", "pin") or outputs not in ("pin", "exclude"):
        raise ValueError("inputs must be 'exclude' or 'pin'; outputs 'pin' or 'exclude'")
    gm = getattr(graph, "graph_module", graph)
    nodes = list(gm.graph.nodes)
    steps = len(nodes)
    # storage id -> [lower, last use, size, name, kind]
    storages: Dict[int, List[Any]] = {}
    # node -> {output index: storage id}; a node's own outputs, or its base's for views
    owner: Dict[Any, Dict[int, int]] = {}

    def new_storage(node: Any, index: int, tensor: Any, step: int, kind: str) -> None:
        sid = len(storages)
        storages[sid] = [step, step, _nbytes(tensor), node.name if index == 0 else f"{node.name}[{index}]", kind]
        owner.setdefault(node, {})[index] = sid

    for step, node in enumerate(nodes):
        value = node.meta.get("val")
        if node.op in ("placeholder", "get_attr"):
            for index, tensor in _tensors(value):
                new_storage(node, index, tensor, 0, "input")
            continue
        # Every storage this node reads lives at least until this step.
        read = [sid for arg in node.all_input_nodes for sid in owner.get(arg, {}).values()]
        for sid in read:
            storages[sid][1] = max(storages[sid][1], step)
        if node.op == "output":
            for sid in read:
                if storages[sid][4] == "intermediate":
                    storages[sid][4] = "output"
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            src, index = node.args[0], node.args[1]
            if index in owner.get(src, {}):
                owner[node] = {0: owner[src][index]}
            continue
        aliased = _aliased_argument(node)
        if aliased is not None:
            if aliased in owner:
                owner[node] = dict(owner[aliased])
            continue
        for index, tensor in _tensors(value):
            new_storage(node, index, tensor, step, "intermediate")

    intervals = []
    for sid, (lower, last, size, name, kind) in storages.items():
        if kind == "input":
            lower, upper = 0, steps
        elif kind == "output":
            if outputs == "exclude":
                continue
            upper = steps
        else:
            upper = last + 1
        intervals.append(Interval(sid, lower, upper, size, name, kind))
    if inputs == "pin":
        intervals = [dataclasses.replace(i, kind="intermediate") if i.kind == "input" else i for i in intervals]
    return Liveness(intervals, steps)


def from_trace(trace: Union[str, Path, Any]) -> Liveness:
    """Lifetimes from a recorded allocation trace, so a captured run plans like a graph: a
    ``vrampool.whatif.traces.Trace``, its rows ``(id, lower, upper, size[, stream])``, or a trace file
    (JSON lines, or the ``id,lower,upper,size[,stream]`` CSV, MiniMalloc's format, times kept).

    Every buffer is an ``intermediate`` interval named after its trace id; interval ids are the
    rows' positions, since a trace may reuse an id once it is freed. Streams are not kept apart:
    the plan follows the trace's one order of events. ``steps`` is the trace's length in events
    (for rows and files, the latest end). A trace of several iterations is planned as one run;
    ``Trace.steps()`` cuts it into iterations.
    """
    if isinstance(trace, (str, Path)):
        from vrampool.whatif.traces import read_trace

        trace = read_trace(trace)
    rows = trace.rows() if hasattr(trace, "rows") else list(trace)
    intervals = []
    for position, row in enumerate(rows):
        if len(row) not in (4, 5):
            raise ValueError(f"a trace row is (id, lower, upper, size[, stream]), got {row!r}")
        ident, lower, upper, size = (int(v) for v in row[:4])
        if not 0 <= lower < upper or size < 0:
            raise ValueError(f"a trace row needs 0 <= lower < upper and size >= 0, got {row!r}")
        intervals.append(Interval(position, lower, upper, size, str(ident), "intermediate"))
    steps = len(trace.events) if hasattr(trace, "events") else max((i.upper for i in intervals), default=0)
    return Liveness(intervals, steps)


def trace_forward(model: Any, example_inputs: Sequence[Any]) -> Any:
    """The model's forward as an fx graph over fake tensors (parameters are graph inputs)."""
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    params = {**dict(model.named_parameters()), **dict(model.named_buffers())}

    def forward(params: Dict[str, Any], *inputs: Any) -> Any:
        return functional_call(model, params, tuple(inputs))

    return make_fx(forward, tracing_mode="fake")(params, *example_inputs)


def trace_training_step(
    model: Any, example_inputs: Sequence[Any], loss_fn: Optional[Callable[[Any], Any]] = None
) -> Any:
    """Forward, loss and backward as one joint fx graph over fake tensors, so saved activations
    live until their backward use. ``loss_fn`` maps the output to a scalar (default: sum)."""
    import torch
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())

    # Buffers (e.g. batch-norm statistics) are graph inputs too, so that every tensor is fake.
    def step(params: Dict[str, Any], buffers: Dict[str, Any], *inputs: Any) -> Any:
        out = functional_call(model, {**params, **buffers}, tuple(inputs))
        loss = loss_fn(out) if loss_fn is not None else out.sum()
        grads = torch.autograd.grad(loss, list(params.values()))
        return loss, grads

    return make_fx(step, tracing_mode="fake")(params, buffers, *example_inputs)
