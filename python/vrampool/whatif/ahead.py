"""Plans made ahead (:mod:`vrampool.ahead`) from what the what-if reads and captures: one step of a
captured trace (:func:`from_trace`), or a training step run under fake tensors (:func:`capture`:
no GPU, no memory). Give the plan to ``vrampool.torch.install(plan=...)``, ``DevicePool(plan=...)``,
or save it (``plan.save(path)``).

>>> from vrampool.whatif.ahead import step_rows
>>> rows = [(1, 0, 4, 4096), (2, 1, 2, 512)]     # (id, lower, upper, size): one step
>>> step_rows(rows)                               # (stream, size, lower, upper) rows, and the step
([(0, 4096, 0, 3), (0, 512, 1, 2)], 0)
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from vrampool.ahead import ALIGNMENT, BUDGET_MS, Plan, plan_step
from vrampool.inputs import quote
from vrampool.whatif.capture import Recorder
from vrampool.whatif.traces import Trace, TraceLike, load
from vrampool.whatif.training import ModelFunctionError, _failure, _quiet_fake_tensor_log, capture_model

#: One buffer of a step, as :data:`vrampool.ahead.StepRow`: (stream, size, lower, upper).
Row = Tuple[int, int, int, int]


def step_rows(trace: TraceLike, step: Optional[int] = None) -> Tuple[List[Row], int]:
    """The rows of one step of ``trace`` (a file :func:`vrampool.whatif.traces.read` reads, a
    ``Trace``, or ``(id, lower, upper, size[, stream])`` rows), in allocation order, times being
    event indices within the step, and the step's index: the steps lie between its ``step``
    events (a trace without one is one step); those that allocate are counted from 0.

    ``step`` None takes the largest step by peak live bytes among those that leave the fewest
    buffers live at their end (see :func:`from_trace`). A buffer the step does not
    free is live for the whole step."""
    steps = _steps(load(trace))
    if not steps:
        raise ValueError("the trace holds no allocations")
    if step is None:
        fewest = min(left for _, left in steps)
        step = max((i for i, (_, left) in enumerate(steps) if left == fewest), key=lambda i: (_peak(steps[i][0]), -i))
    elif isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < len(steps):
        raise ValueError(f"step {quote(step)} is not a step of the trace: it has {len(steps)} steps with allocations (0 to {len(steps) - 1})")
    return steps[step][0], step


def first_and_step_rows(trace: TraceLike, step: Optional[int] = None) -> Tuple[List[Row], int, int]:
    """The rows of ``trace``'s first step followed by those of one step (as :func:`step_rows`
    picks it) on one timeline, the step's index, and how many rows are the first step's. What
    the first step leaves live (the weights, the optimizer's state) stays live to the end, so the
    step's buffers are planned beside it; one the next step frees (the first batch) lives on into
    the step as far as it did into the next. With no first step apart (the trace is one step, or
    the step is the first), the step's rows alone and 0."""
    loaded = load(trace)
    rows, step = step_rows(loaded, step)
    first = _first_step(loaded)
    if step == 0 or first is None:
        return rows, step, 0
    warm, length = first
    end = length + max((upper for _, _, _, upper in rows), default=0)
    joint = [(stream, size, lower, end if upper is None else min(upper, end)) for stream, size, lower, upper in warm]
    joint += [(stream, size, length + lower, length + upper) for stream, size, lower, upper in rows]
    return joint, step, len(warm)


def _first_step(trace: Trace) -> Optional[Tuple[List[Tuple[int, int, int, Optional[int]]], int]]:
    """The first step's rows (stream, size, lower, upper), in allocation order, and its length in
    events; upper None for a buffer no later step frees, and past the length for one the next
    step frees (by as many events as it lived into it). None when the trace has no step marker
    after an allocation."""
    rows: List[List[Any]] = []
    born: Dict[int, int] = {}
    time, length = 0, None
    for e in trace.events:
        if e.op == "step":
            if length is not None:
                break
            if rows:
                length = time
            continue
        if e.op == "alloc":
            if length is None:
                born[e.id] = len(rows)
                rows.append([e.stream, e.size, time, None])
        elif e.id in born:
            rows[born.pop(e.id)][3] = time
        time += 1
    if length is None:
        return None
    return [(r[0], r[1], r[2], r[3]) for r in rows], length


def _steps(trace: Trace) -> List[Tuple[List[Row], int]]:
    """Each step's rows in allocation order, times being event indices within the step, and how
    many of its buffers it leaves live. Such a buffer is live for the whole step: its bytes stay
    taken into the next step, so none of this step's buffers may share them either."""
    steps: List[Tuple[List[Row], int]] = []
    rows: List[List[int]] = []
    born: Dict[int, int] = {}
    time = 0

    def close() -> None:
        for index in born.values():
            rows[index][2:4] = [0, time]
        if rows:
            steps.append(([(r[0], r[1], r[2], r[3]) for r in rows], len(born)))

    for e in trace.events:
        if e.op == "step":
            close()
            rows, born, time = [], {}, 0
            continue
        if e.op == "alloc":
            born[e.id] = len(rows)
            rows.append([e.stream, e.size, time, time + 1])
        elif e.id in born:  # a free of this step's buffer (others were born before it)
            rows[born.pop(e.id)][3] = time
        time += 1
    close()
    return steps


def _peak(rows: Sequence[Row]) -> int:
    """The most bytes of ``rows`` live at once (frees before allocations at the same time)."""
    events = sorted([(lo, size) for _, size, lo, _ in rows] + [(up, -size) for _, size, _, up in rows])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def capture_steps(fn: Callable[..., Any], example_inputs: Sequence[Any], steps: int, name: str) -> Trace:
    """The trace of ``steps`` training steps under fake tensors, a ``step`` event after each
    (see :func:`capture`): with ``example_inputs``, ``fn(*inputs)`` on fresh fake
    copies of them per step, the model and optimizer ``fn`` closes over left as they were;
    without, ``fn`` is a model function (:func:`vrampool.whatif.training.capture_model`)."""
    if example_inputs:
        return _capture_step(fn, example_inputs, steps, name)
    return capture_model(fn, steps, name=name)


def _capture_step(fn: Callable[..., Any], inputs: Sequence[Any], steps: int, name: str) -> Trace:
    """The trace of ``steps`` calls of ``fn`` on fresh fake copies of ``inputs``, a step each."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fresh(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        device = "cpu" if value.device.type == "meta" else value.device
        return torch.empty(value.shape, dtype=value.dtype, device=device)

    recorder = Recorder()
    with _optimizers_kept(), _quiet_fake_tensor_log(), FakeTensorMode(allow_non_fake_inputs=True), recorder.tracker():
        for _ in range(steps):
            batch = [fresh(v) for v in inputs]
            try:
                fn(*batch)
            except (ModelFunctionError, KeyboardInterrupt):
                raise
            except BaseException as e:  # the user's code: one line, whatever it raised
                raise ModelFunctionError(_failure(name, e, True)) from None
            del batch
            recorder.step()
    return recorder.trace


@contextlib.contextmanager
def _optimizers_kept() -> Iterator[None]:
    """Every optimizer that steps inside gets back the state it had before (the capture's is
    fake tensors), and its parameters lose the fake gradients the capture left them, so that the
    model and optimizer ``fn`` closes over train for real afterwards."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    kept: Dict[int, Tuple[Any, Dict[Any, Dict[str, Any]]]] = {}

    def remember(optimizer: Any, args: Any, kwargs: Any) -> None:
        if id(optimizer) not in kept:
            kept[id(optimizer)] = (optimizer, {p: dict(state) for p, state in optimizer.state.items()})

    handle = register_optimizer_step_pre_hook(remember)
    try:
        yield
    finally:
        handle.remove()
        for optimizer, state in kept.values():
            optimizer.state.clear()
            optimizer.state.update(state)
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if isinstance(p.grad, FakeTensor):
                        p.grad = None


def from_trace(
    trace: Any,
    step: Optional[int] = None,
    alignment: int = ALIGNMENT,
    budget_ms: int = BUDGET_MS,
    *,
    source: Optional[str] = None,
    first_step: bool = True,
) -> Plan:
    """Plans one step of a captured trace (a file :func:`vrampool.whatif.traces.read` reads, a
    ``Trace``, or ``(id, lower, upper, size[, stream])`` rows): the steps lie between its
    ``step`` events (a trace without one is one step); those that allocate are counted from 0.

    ``step`` None takes the largest step by peak live bytes among those that leave the fewest
    buffers live at their end (none, where a step frees everything it allocates): a capture's
    first step also makes what lives across steps (the parameters, the optimizer's state), and a
    plan holding those would find their bytes taken in every later step. A buffer the step does
    not free is planned as live for the whole step (:func:`step_rows`).

    With ``first_step`` (and a first step apart from the planned one), the trace's first step is
    planned too, on one timeline before the step (:attr:`Plan.first`): what it leaves live stays
    in the arena's bytes, and the run's first step is served from the plan as well. Leave it out
    when the run's first step does not begin as the trace's (weights made before the trace began)."""
    loaded = load(trace)
    if first_step:
        rows, step, first = first_and_step_rows(loaded, step)
    else:
        (rows, step), first = step_rows(loaded, step), 0
    name = source if source is not None else str(trace) if isinstance(trace, (str, Path)) else "trace"
    return plan_step(rows, alignment, budget_ms, source=name, step=step, first=first)


def capture(
    fn: Callable[..., Any],
    *example_inputs: Any,
    steps: int = 2,
    alignment: int = ALIGNMENT,
    budget_ms: int = BUDGET_MS,
) -> Plan:
    """Plans a training step at the shape of ``example_inputs``, captured under fake tensors (no
    GPU and no memory: only shapes and lifetimes), ``steps`` times over; the plan is of the step
    :func:`from_trace` picks (the first step also makes what lives across steps, such as the
    optimizer's state, hence two by default).

    With ``example_inputs``, ``fn(*inputs)`` runs one step; each step takes fresh copies of the
    example tensors (as a loop copies its batch to the device), of their shapes and dtypes (meta
    tensors will do), and drops them at its end. The model and optimizer ``fn`` closes over are
    left as they were: ops on their tensors run on fake copies, an optimizer that steps gets its
    state back afterwards, and the fake gradients the capture leaves on its parameters are dropped.
    Without ``example_inputs``, ``fn`` is a model function as ``vrampool capture --model`` takes
    (:mod:`vrampool.whatif.training`: it returns ``(model, batch)``, ``(model, batch, loss_fn)``
    or a training step). The offsets are aligned to ``alignment``, by default a pool's (a pool
    whose blocks are aligned more refuses the plan, saying at which alignment to plan). Raises
    ``ValueError`` (one line) when ``fn`` fails under fake tensors."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {quote(steps)}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    name = getattr(fn, "__qualname__", type(fn).__name__)
    trace = capture_steps(fn, example_inputs, steps, name)
    return from_trace(trace, None, alignment, budget_ms, source=f"capture of {name}", first_step=False)
