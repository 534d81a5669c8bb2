"""Allocation traces of real PyTorch workloads, captured on the CPU.

A ``TorchDispatchMode`` sees every op's outputs; each output whose storage is new (not one of
the op's inputs' storages: views and in-place ops allocate nothing) is an allocation, and a weak
reference to the storage reports its free when PyTorch drops it. So a training step on the CPU
gives the same sequence of allocation sizes and lifetimes that it would give on a GPU, without
one. The result is a :class:`vrampool.whatif.traces.Trace`.

>>> import torch
>>> from vrampool.whatif.capture import capture
>>> trace = capture(lambda: torch.ones(256) * 2)    # ones, then the product; both die
>>> [(e.op, e.size) for e in trace.events]
[('alloc', 1024), ('alloc', 1024), ('free', 1024), ('free', 1024)]
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from vrampool.whatif.traces import Event, Trace


def _storage_tracker_class() -> type:
    """Built on first use so that importing this module doesn't import torch."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a build without torch.distributed
        DTensor = None
    wait_tensor = getattr(getattr(torch.ops, "_c10d_functional", None), "wait_tensor", None)
    # Tensors made from Python data (`torch.tensor(0.0)`, as optimizers make their step counts)
    # are host memory until moved; under fake tensors lifting them looks like an allocation.
    lifted = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default}
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
    except ImportError:
        ShardingPropagator = None

    class StorageTracker(TorchDispatchMode):
        """Reports every new storage an op creates to ``on_alloc(id, size)`` and its death to
        ``on_free(id, size)``. A storage resized in place (``UntypedStorage.resize_``, as FSDP2
        frees and re-allocates its unsharded parameters) dies and is born again at its new size."""

        def __init__(self, on_alloc: Callable[[int, int], None], on_free: Callable[[int, int], None]) -> None:
            super().__init__()
            self._on_alloc, self._on_free = on_alloc, on_free
            # storage address (_cdata) -> (id, size, weak reference)
            self._live: Dict[int, Tuple[int, int, Any]] = {}
            self._next_id = 0
            self._resize: Any = None
            self._fake_mode: Any = None
            self._propagate: Any = None
            self._closed = False
            # Inside DTensor's sharding propagation, which runs the op on stand-ins of the global
            # shapes in the current fake mode to learn the output's shape: nothing is kept.
            self._propagating = 0

        def __enter__(self) -> Any:
            original = torch.UntypedStorage.resize_

            def resize_(storage: Any, size: int) -> Any:
                out = original(storage, size)
                self._resized(storage)
                return out

            self._resize = original
            torch.UntypedStorage.resize_ = resize_
            self._fake_mode = _active_fake_mode()
            propagate = getattr(ShardingPropagator, "_propagate_tensor_meta_non_cached", None)
            if propagate is not None:

                def propagating(*args: Any, **kwargs: Any) -> Any:
                    self._propagating += 1
                    try:
                        return propagate(*args, **kwargs)
                    finally:
                        self._propagating -= 1

                self._propagate = propagate
                ShardingPropagator._propagate_tensor_meta_non_cached = propagating
            return super().__enter__()

        def __exit__(self, *exc: Any) -> Any:
            # Storages that die later (the model, as the caller lets go of it) die after the
            # trace: they live to its end.
            self._closed = True
            torch.UntypedStorage.resize_ = self._resize
            if self._propagate is not None:
                ShardingPropagator._propagate_tensor_meta_non_cached = self._propagate
            return super().__exit__(*exc)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            # DTensor turns its ops into ops on local tensors, which come back here (as torch's
            # MemTracker lets them).
            if DTensor is not None and any(t is DTensor for t in types):
                return NotImplemented
            # Under fake tensors a collective's wait returns a new tensor, which eager mode does
            # not (torch's MemTracker does the same).
            if func is getattr(wait_tensor, "default", None) and _active_fake_mode() is not None:
                return args[0]
            out = func(*args, **(kwargs or {}))
            # DTensor's sharding propagation runs ops under a fake mode (its own, or the one in
            # force): they compute shapes, not tensors anyone keeps.
            if self._propagating or func in lifted or _active_fake_mode() is not self._fake_mode:
                return out
            inputs = {t.untyped_storage()._cdata for t in _tensors((args, kwargs), torch.Tensor)}
            for t in _tensors(out, torch.Tensor):
                if t.device.type != "meta":
                    storage = t.untyped_storage()
                    key = storage._cdata
                    if key not in inputs and key not in self._live and storage.nbytes() > 0:
                        self._track(storage, key)
            return out

        def _resized(self, storage: Any) -> None:
            key = storage._cdata
            entry = self._live.pop(key, None)
            if entry is not None:
                self._on_free(entry[0], entry[1])
            if storage.nbytes() > 0:
                self._track(storage, key)

        def _track(self, storage: Any, key: int) -> None:
            self._next_id += 1
            ident, size = self._next_id, storage.nbytes()

            def died(ref: Any) -> None:
                entry = self._live.get(key)
                if entry is not None and entry[2] is ref and not self._closed:
                    del self._live[key]
                    self._on_free(ident, size)

            self._live[key] = (ident, size, weakref.ref(storage, died))
            self._on_alloc(ident, size)

    return StorageTracker


def _active_fake_mode() -> Any:
    from torch._guards import active_fake_mode

    return active_fake_mode()


def _tensors(value: Any, tensor_type: type) -> List[Any]:
    """The tensors in an op's arguments or results (nested tuples, lists and dicts). Written
    out rather than pytree's flatten, which costs as much as the small ops it would watch."""
    if isinstance(value, tensor_type):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v, tensor_type)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v, tensor_type)]
    return []


def storage_tracker(on_alloc: Callable[[int, int], None], on_free: Callable[[int, int], None]) -> Any:
    """A ``TorchDispatchMode`` (use it in a ``with``) that calls ``on_alloc(id, size)`` for each
    storage created inside it and ``on_free(id, size)`` when that storage dies."""
    return _storage_tracker_class()(on_alloc, on_free)


class Recorder:
    """Collects a ``Trace`` from a ``storage_tracker``; ``step()`` marks iteration boundaries."""

    def __init__(self) -> None:
        self.trace = Trace()

    def on_alloc(self, ident: int, size: int) -> None:
        self.trace.events.append(Event("alloc", ident, size))

    def on_free(self, ident: int, size: int) -> None:
        self.trace.events.append(Event("free", ident, size))

    def step(self) -> None:
        self.trace.events.append(Event("step"))

    def tracker(self) -> Any:
        return storage_tracker(self.on_alloc, self.on_free)


def capture(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Trace:
    """Runs ``fn(*args, **kwargs)`` and returns the allocations it made (its result is dropped
    before the capture ends, so what it returned is freed in the trace too)."""
    recorder = Recorder()
    with recorder.tracker():
        fn(*args, **kwargs)
    return recorder.trace


def training_steps(
    model: Any,
    batches: Iterable[Tuple[Any, Any]],
    loss_fn: Callable[[Any, Any], Any],
    optimizer: Any,
) -> Iterator[None]:
    """Runs one training step (forward, loss, backward, optimizer step, zero_grad) per
    ``(input, target)`` batch, yielding after each: the loop that ``capture_training`` and the
    planned arena's tests drive under a ``storage_tracker``."""
    for inputs, target in batches:
        loss = loss_fn(model(inputs), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
        yield


def capture_training(
    model: Any,
    batches: Iterable[Tuple[Any, Any]],
    loss_fn: Optional[Callable[[Any, Any], Any]] = None,
    optimizer: Any = None,
) -> Trace:
    """The trace of training ``model`` on the CPU over ``batches`` (pairs of input and target),
    with a ``step`` event after each iteration. ``loss_fn`` defaults to cross-entropy and
    ``optimizer`` to Adam (whose state is allocated in the first step, as on a GPU)."""
    import torch

    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=1e-3)
    recorder = Recorder()
    with recorder.tracker():
        for _ in training_steps(model, batches, loss_fn, optimizer):
            recorder.step()
    return recorder.trace
