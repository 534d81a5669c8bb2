"""Training steps of any model captured as allocation traces, under fake tensors by default: the
shapes and lifetimes of every storage of a GPU-scale step (GBs live) in seconds, on a CPU, with
no memory behind them. ``--real`` runs the step for real on the CPU instead.

A model function takes no arguments and returns one of:

- ``(model, batch)``: an ``nn.Module`` and its input. ``batch`` is a tensor (the loss is the
  output's mean), a tuple ``(inputs, target)`` (cross-entropy, over the last dimension for
  sequence outputs), or a list or an iterator of either, one per step (e.g. a new sequence
  length each step; a list is cycled). A batch of a list or an iterator is made when its step
  asks for it, as a GPU run copies it to the device; a single batch is made once and kept.
- ``(model, batch, loss_fn)``: the same with ``loss_fn(output, target)``.
- a training step: a function of no arguments that runs one step (made inside the capture, so
  that the tensors it closes over are fake too).

For ``(model, batch)`` the capture runs forward, loss, backward, the optimizer (``AdamW``,
``foreach`` as PyTorch picks on a GPU, unless told otherwise) and ``zero_grad(set_to_none=True)``
per step. The model is built on the
meta device and materialised under the fake mode inside the capture, so its parameters and
buffers are the trace's first allocations, as ``model.cuda()`` would make them.

Ranks of data-parallel and FSDP2 training come through torch's fake process group (as torch's
``FSDPMemTracker`` uses it): ``parallel="fsdp"`` shards each layer of the model's largest layer
stack and then the root with ``fully_shard``; ``parallel="ddp"`` replicates the model on every
rank with ``fully_shard`` over a ``(world, 1)`` mesh (FSDP2's data-parallel layout), since
``DistributedDataParallel`` runs its reducer on the data and cannot run under fake tensors. One
trace per rank.

>>> import torch
>>> from vrampool.whatif.training import capture_model
>>> def tiny():
...     return torch.nn.Linear(256, 256), torch.randn(64, 256)
>>> trace = capture_model(tiny)   # fake tensors: no memory behind them
>>> trace.peak_allocated_bytes() > 2 * 256 * 256 * 4
True
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import logging
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

from vrampool.whatif.capture import Recorder
from vrampool.whatif.traces import Trace

#: What ``parallel`` takes.
PARALLEL = ("ddp", "fsdp")
#: The learning rate of the default optimizer (the value makes no difference to memory).
LR = 1e-4


class ModelFunctionError(ValueError):
    """A model function that cannot be captured: the message is one line for the command line."""


def load_model_function(spec: str) -> Callable[[], Any]:
    """The function ``spec`` names: ``module:function`` (an importable module) or
    ``path/to/file.py:function``."""
    module_name, sep, function_name = spec.rpartition(":")
    if not sep or not module_name or not function_name:
        raise ModelFunctionError(f"{spec!r}: expected module:function or path/to/file.py:function")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ModelFunctionError(f"{spec}: no file {path}")
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except (ModelFunctionError, KeyboardInterrupt):
        raise
    except BaseException as e:  # the user's module: anything may go wrong at import, sys.exit too
        raise ModelFunctionError(f"{spec}: importing {module_name} {_outcome(e)}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ModelFunctionError(f"{spec}: {module_name} has no function {function_name}")
    return function


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


def _call(fn: Callable[[], Any], name: str, fake: bool) -> Any:
    try:
        return fn()
    except (ModelFunctionError, KeyboardInterrupt):
        raise
    except BaseException as e:
        raise ModelFunctionError(_failure(name, e, fake)) from None


def _outcome(error: BaseException) -> str:
    """How the user's code ended, for a line: ``raised KeyError: ...``, or ``exited with code N``
    (``sys.exit``, which would otherwise end the capture with no word and no trace)."""
    if isinstance(error, SystemExit):
        code = error.code
        if code is None or isinstance(code, int):
            return f"exited with code {code or 0}"
        return f"exited with code 1 ({_first_line(error)})"
    return f"raised {type(error).__name__}: {_first_line(error)}"


def _failure(name: str, error: BaseException, fake: bool) -> str:
    """One line for an exception out of the user's code (any but ``KeyboardInterrupt``, which
    stays an interrupt); under fake tensors, one naming the op fake tensors cannot run, with
    ``--real`` as the way out."""
    if isinstance(error, SystemExit):
        return f"{name} {_outcome(error)} before its steps finished"
    if not isinstance(error, Exception):
        return f"{name} {_outcome(error)}"
    op = getattr(error, "func", None)
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedFakeTensorException,
        UnsupportedOperatorException,
    )

    if fake and isinstance(error, (DataDependentOutputException, DynamicOutputShapeException, UnsupportedOperatorException)):
        why = {
            DataDependentOutputException: "its result depends on the data (e.g. .item() or a branch on a value)",
            DynamicOutputShapeException: "its output's shape depends on the data",
            UnsupportedOperatorException: "it has no fake-tensor implementation",
        }[type(error)]
        return f"{name}: op {op} cannot run on fake tensors: {why}; capture with --real instead"
    if fake and isinstance(error, UnsupportedFakeTensorException):
        return f"{name}: fake tensors cannot run it: {error.reason}; capture with --real instead"
    hint = " (under fake tensors: if it runs for real, capture with --real)" if fake else ""
    return f"{name} {_outcome(error)}{hint}"


def _module_type() -> type:
    import torch

    return torch.nn.Module


def _unpack(built: Any, name: str) -> Tuple[Any, Any, Optional[Callable[..., Any]]]:
    """(model, batch or batches, loss_fn) of a model function's result; a clear error for
    anything else (each batch is checked when a step draws it)."""
    expected = "expected (model, batch), (model, batch, loss_fn) or a training step (a function of no arguments)"
    if not isinstance(built, tuple) or len(built) not in (2, 3):
        raise ModelFunctionError(f"{name} returned {_describe(built)}; {expected}")
    model, batch = built[0], built[1]
    loss = built[2] if len(built) == 3 else None
    if not isinstance(model, _module_type()):
        raise ModelFunctionError(f"{name} returned {_describe(model)} as the model; {expected}")
    if loss is not None and not callable(loss):
        raise ModelFunctionError(f"{name} returned {_describe(loss)} as the loss function; {expected}")
    if isinstance(batch, list) and not batch:
        raise ModelFunctionError(f"{name} returned an empty list of batches")
    return model, batch, loss


def _batches(batch: Any, name: str) -> Iterator[Any]:
    """The batches of the steps in turn: one batch every step, a list cycled, an iterator as it goes."""
    if _is_tensor(batch) or isinstance(batch, tuple):
        return itertools.repeat(_materialised(_checked(batch, name)))
    if isinstance(batch, list):
        return itertools.cycle(batch)
    try:
        return iter(batch)
    except TypeError:
        raise ModelFunctionError(f"{name} returned {_describe(batch)} as the batch; expected a tensor, (inputs, target), or a list or iterator of them") from None


def _checked(batch: Any, name: str) -> Tuple[Any, ...]:
    parts = batch if isinstance(batch, tuple) else (batch,)
    if not 1 <= len(parts) <= 2 or not all(_is_tensor(p) for p in parts):
        raise ModelFunctionError(f"{name} gave {_describe(batch)} as a batch; expected a tensor or (inputs, target) tensors")
    return parts


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    return f"a {type(value).__name__}"


def _is_step(built: Any) -> bool:
    return callable(built) and not isinstance(built, (_module_type(), tuple))


def _default_loss(output: Any, target: Any) -> Any:
    import torch

    if output.dim() > 2:  # (batch, sequence, classes): every position's class
        return torch.nn.functional.cross_entropy(output.flatten(0, -2), target.flatten())
    return torch.nn.functional.cross_entropy(output, target)


#: Makes the optimizer of a ``(model, batch)`` capture from the model's parameters.
Optimizer = Callable[[Iterable[Any]], Any]


def adamw(parameters: Iterable[Any]) -> Any:
    """``AdamW`` with ``foreach``, as PyTorch picks it for parameters on a GPU (the CPU would pick
    the one-tensor-at-a-time loop, whose temporaries differ)."""
    import torch

    return torch.optim.AdamW(parameters, lr=LR, foreach=True)


def _training_step(model: Any, batch: Any, loss: Optional[Callable[..., Any]], optimizer: Optimizer, name: str) -> Callable[[], None]:
    """One forward, loss, backward and optimizer step per call, over the batches in turn."""
    try:
        opt = optimizer(list(model.parameters()))
    except Exception as e:
        raise ModelFunctionError(f"{name}: making the optimizer raised {type(e).__name__}: {_first_line(e)}") from None
    loss = loss or _default_loss
    turns = _batches(batch, name)

    def step() -> None:
        drawn = next(turns, None)
        if drawn is None:
            raise ModelFunctionError(f"{name} ran out of batches")
        parts = _materialised(_checked(drawn, name))
        value = loss(model(parts[0]), parts[1]) if len(parts) == 2 else model(parts[0]).mean()
        del parts, drawn
        value.backward()
        del value
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _materialised(parts: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """A batch's tensors of the meta device made tensors of the fake mode in force, views of one
    storage as views of one storage again (a target sliced from the inputs' tokens stays a
    strided view, as on a GPU); others as they are. Their values don't matter to memory."""
    import torch

    bases: dict = {}

    def made(t: Any) -> Any:
        if t.device.type != "meta":
            return t
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in bases:
            bases[key] = torch.empty(storage.nbytes() // t.element_size(), dtype=t.dtype, device="cpu")
        return bases[key].as_strided(t.shape, t.stride(), t.storage_offset())

    return tuple(made(t) for t in parts)


def _layer_stack(model: Any) -> List[Any]:
    """The modules of the model's largest ``ModuleList`` or ``Sequential``: the layers FSDP2
    shards one by one."""
    import torch

    stacks = [m for m in model.modules() if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential))]
    return list(max(stacks, key=len)) if stacks else []


@contextlib.contextmanager
def _process_group(world_size: int, rank: int) -> Iterator[None]:
    """Torch's fake process group as rank ``rank`` of ``world_size``: collectives return at once."""
    import torch.distributed as dist
    import torch.distributed._tools.fake_collectives  # noqa: F401 (fake implementations of the collectives)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ModelFunctionError("a process group is already initialised in this process: capture ranks from a fresh one")
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _mesh(parallel: str, world_size: int) -> Any:
    """The device mesh FSDP2 shards over: every rank one shard (``fsdp``), or every rank one
    replica (``ddp``). Made before the capture: its setup reads tensor values."""
    from torch.distributed.device_mesh import init_device_mesh

    if parallel == "fsdp":
        return init_device_mesh("cpu", (world_size,))
    return init_device_mesh("cpu", (world_size, 1), mesh_dim_names=("replicate", "shard"))


def _shard(model: Any, mesh: Any) -> None:
    """FSDP2: each layer of the model's layer stack, then the root."""
    from torch.distributed.fsdp import fully_shard

    for layer in _layer_stack(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def capture_model(
    fn: Callable[[], Any],
    steps: int = 1,
    *,
    fake: bool = True,
    parallel: Optional[str] = None,
    world_size: int = 1,
    rank: int = 0,
    optimizer: Optimizer = adamw,
    name: Optional[str] = None,
    progress: Callable[[Iterable[int]], Iterable[int]] = lambda steps: steps,
) -> Trace:
    """The trace of ``steps`` training steps of what ``fn`` returns (see the module's docstring),
    with a ``step`` event after each. ``fake`` (the default) captures under fake tensors; with
    ``parallel`` (``"ddp"`` or ``"fsdp"``), as rank ``rank`` of ``world_size``. ``optimizer``
    makes the optimizer of a ``(model, batch)`` capture (default :func:`adamw`). Raises
    ``ModelFunctionError`` (a ``ValueError``) with one line when ``fn`` raises, returns something
    else, or runs an op fake tensors cannot."""
    name = name or getattr(fn, "__qualname__", "the model function")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if parallel is not None and parallel not in PARALLEL:
        raise ValueError(f"parallel must be one of {', '.join(PARALLEL)}, got {parallel!r}")
    if parallel is None and (world_size, rank) != (1, 0):
        raise ValueError("world_size and rank need parallel='ddp' or 'fsdp'")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, {world_size}), got {rank}")
    distributed = _process_group(world_size, rank) if parallel else contextlib.nullcontext()
    with distributed, _quiet_fake_tensor_log():
        return _capture(fn, steps, name, progress, parallel, world_size, fake, optimizer)


@contextlib.contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """The fake mode logs a traceback before it raises an op's error; the capture reports the
    error in one line instead."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _capture(
    fn: Callable[[], Any],
    steps: int,
    name: str,
    progress: Callable[[Iterable[int]], Iterable[int]],
    parallel: Optional[str],
    world_size: int,
    fake: bool,
    optimizer: Optimizer,
) -> Trace:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    mesh = _mesh(parallel, world_size) if parallel else None
    recorder = Recorder()
    built = None
    if fake:
        # The model is built on the meta device and materialised in the fake mode below:
        # building it inside the fake mode would break models that deep-copy their layers
        # (nn.TransformerEncoder does). FSDP2 shards it there too, as it shards meta models.
        with torch.device("meta"):
            built = _call(fn, name, fake)
        if not _is_step(built):
            model, batch, loss = _unpack(built, name)
            if mesh is not None:
                _shard(model, mesh)
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with mode, _same_dtypes() if fake else contextlib.nullcontext(), recorder.tracker():
        if built is None or _is_step(built):
            built = _call(fn, name, fake)
            if not _is_step(built):
                model, batch, loss = _unpack(built, name)
                if mesh is not None:
                    _shard(model, mesh)
        if _is_step(built):
            if parallel:
                raise ModelFunctionError(f"{name} returned a training step: ranks need (model, batch), which the capture shards")
            step = built
        else:
            if fake:
                model.to_empty(device="cpu")
            step = _training_step(model, batch, loss, optimizer, name)
        for _ in progress(range(steps)):
            try:
                step()
            except (ModelFunctionError, KeyboardInterrupt):
                raise
            except BaseException as e:
                raise ModelFunctionError(_failure(f"{name}'s training step", e, fake)) from None
            recorder.step()
    return recorder.trace


#: Ops whose meta kernels (which fake tensors run) check shapes but not that these operands share
#: a dtype, which torch's CPU and CUDA kernels require ("mat1 and mat2 must have the same dtype").
_SAME_DTYPE_OPERANDS = {"mm": (0, 1), "addmm": (1, 2), "mv": (0, 1), "convolution": (0, 1)}


def _same_dtypes() -> Any:
    """A dispatch mode, above the fake mode, that raises where torch's kernels would on operands
    of different dtypes (:data:`_SAME_DTYPE_OPERANDS`): without it an int64 batch fed to a
    ``Linear`` is captured as if the step ran."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    operands = {getattr(torch.ops.aten, op).default: at for op, at in _SAME_DTYPE_OPERANDS.items()}

    class SameDtypes(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            at = operands.get(func)
            if at is not None and len(args) > max(at):
                first, second = (args[i] for i in at)
                if first.dtype != second.dtype:
                    names = [func._schema.arguments[i].name for i in at]
                    raise RuntimeError(f"{func.name()}: {names[0]} and {names[1]} must have the same dtype, but got {first.dtype} and {second.dtype}")
            return func(*args, **(kwargs or {}))

    return SameDtypes()


def memtracker_peak_bytes(fn: Callable[[], Any], optimizer: Optimizer = adamw, name: Optional[str] = None) -> int:
    """The peak that torch's own ``MemTracker`` reports for one training step of ``fn``'s
    ``(model, batch)`` under fake tensors, the model built as :func:`capture_model` builds it
    (its parameters and buffers tracked with ``track_external``; the optimizer's states as it
    makes them in the step)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    name = name or getattr(fn, "__qualname__", "the model function")
    with torch.device("meta"):
        model, batch, loss = _unpack(_call(fn, name, True), name)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")
        step = _training_step(model, batch, loss, optimizer, name)
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            step()
        peaks = tracker.get_tracker_snapshot("peak")
    return max((snap["Total"] for snap in peaks.values()), default=0)
