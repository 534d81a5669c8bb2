"""The largest batch size (or sequence length) whose training steps fit in a device's memory,
under each allocator: captures of the steps at each size probed (under fake tensors), replayed
on a simulated device of that memory, running out of memory (after the allocator's own release
and retry) being the verdict. All figures are simulated.

>>> import torch
>>> from vrampool.whatif.fit import fit_model
>>> def mlp(batch):
...     return torch.nn.Linear(1024, 1024), torch.randn(batch, 1024)
>>> result = fit_model(mlp, memory=64 << 20, allocators=["default", "torch"])
>>> result.largest["default"] >= result.largest["torch"] > 0
True
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from vrampool.whatif.traces import Trace

#: The rows of ``vrampool fit``, in order. ``ahead`` is ``default`` served by a plan made ahead of
#: each size's own largest step (as ``vrampool plan --trace`` would make it for that size).
ALLOCATORS = ("default", "ahead", "torch", "torch+expandable", "rmm", "cupy", "plan")
#: The largest size probed unless told otherwise.
MAX_SIZE = 1 << 16


@dataclasses.dataclass
class Probe:
    """One size tried: the live bytes of its capture, and for each allocator whether the steps fit
    and what it reserved (up to where it ran out, if it did)."""

    size: int
    lower_bound_bytes: int
    fits: Dict[str, bool] = dataclasses.field(default_factory=dict)
    peak_reserved_bytes: Dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class FitResult:
    """``largest[allocator]``: the largest size that fits (0 if none does); ``probes`` in the
    order they were tried."""

    memory: int
    allocators: List[str]
    largest: Dict[str, int]
    probes: List[Probe]

    def probe(self, size: int) -> Optional[Probe]:
        return next((p for p in self.probes if p.size == size), None)

    def to_json(self) -> Dict[str, Any]:
        rows = answer_rows({name: self.largest[name] for name in self.allocators}, "largest", self.probe)
        probes = [dataclasses.asdict(p) for p in sorted(self.probes, key=lambda p: p.size)]
        return {"memory_bytes": self.memory, "rows": rows, "probes": probes}


def answer_rows(answers: Mapping[str, Any], key: str, probe_at: Callable[[Any], Any], *per_allocator: str) -> List[Dict[str, Any]]:
    """The JSON rows of a search's answers, one per allocator: its answer under ``key``, and the
    figures of the probe at that answer (``probe_at``): peak reserved, the lower bound, and each
    figure of ``per_allocator`` the probe keeps per allocator; None where no probe fits."""
    rows = []
    for name, answer in answers.items():
        at = probe_at(answer)
        row = {"allocator": name, key: answer, "peak_reserved_bytes": at.peak_reserved_bytes[name] if at else None, "lower_bound_bytes": at.lower_bound_bytes if at else None}
        row.update({figure: getattr(at, figure)[name] if at else None for figure in per_allocator})
        rows.append(row)
    return rows


class DoesNotFit(ValueError):
    """The model cannot fit at all: its parameters alone exceed the memory."""


def parameter_bytes(fn: Callable[[int], Any]) -> int:
    """The bytes of the parameters and buffers of ``fn(1)``'s model, built on the meta device."""
    import torch

    from vrampool.whatif.training import _call, _is_step, _unpack

    with torch.device("meta"):
        built = _call(lambda: fn(1), "the model function", True)
    if _is_step(built):
        return 0
    model = _unpack(built, "the model function")[0]
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def fit_model(
    fn: Callable[[int], Any],
    memory: int,
    allocators: Sequence[str] = ALLOCATORS,
    *,
    steps: int = 2,
    max_size: int = MAX_SIZE,
    progress: Callable[[Iterable[int]], Iterable[int]] = lambda probes: probes,
) -> FitResult:
    """:func:`fit` over ``steps`` fake-tensor training steps of ``fn(size)`` (a model function of
    :mod:`vrampool.whatif.training` that takes the size). Raises ``DoesNotFit`` when the parameters
    alone exceed the memory, before any search."""
    from vrampool.whatif.training import capture_model

    params = parameter_bytes(fn)
    if params > memory:
        raise DoesNotFit(f"the model's parameters and buffers alone take {params / 2**30:,.2f} GiB, more than the {memory / 2**30:,.2f} GiB of memory")

    def capture(size: int) -> Trace:
        return capture_model(lambda: fn(size), steps, name=f"the model function at size {size}")

    return fit(capture, memory, allocators, max_size=max_size, progress=progress)


def fit(
    capture: Callable[[int], Trace],
    memory: int,
    allocators: Sequence[str] = ALLOCATORS,
    *,
    max_size: int = MAX_SIZE,
    progress: Callable[[Iterable[int]], Iterable[int]] = lambda probes: probes,
) -> FitResult:
    """For each allocator, the largest size ``s`` (up to ``max_size``) whose trace
    ``capture(s)`` fits in ``memory`` bytes of the simulated device. Sizes are tried by doubling
    and then bisection, each capture shared by every allocator still searching; a size that fits
    is taken to mean every smaller one does. ``progress`` wraps the stream of sizes tried."""

    def measure(size: int, searching: List[str]) -> Probe:
        trace = capture(size)
        probe = Probe(size, trace.peak_allocated_bytes())
        replay_into(probe, trace, searching, memory)
        return probe

    return search_largest(measure, memory, allocators, max_size=max_size, progress=progress)


def replay_into(probe: Probe, trace: Trace, allocators: List[str], memory: int) -> None:
    """Replays ``trace`` on a simulated device of ``memory`` bytes under each allocator and
    records in ``probe`` whether it fit and what it reserved (``ahead``: served by the plan of the
    trace's largest step, its arena taken before the first allocation)."""
    from vrampool.whatif.replay import replay_each

    for report in replay_each(trace, allocators, samples=0, capacity=memory):
        name = report["strategy"]
        probe.fits[name] = report["out_of_memory"] is None
        probe.peak_reserved_bytes[name] = report["peak_reserved_bytes"]


def search_largest(
    measure: Callable[[int, List[str]], Probe],
    memory: int,
    allocators: Sequence[str] = ALLOCATORS,
    *,
    max_size: int = MAX_SIZE,
    progress: Callable[[Iterable[int]], Iterable[int]] = lambda probes: probes,
) -> FitResult:
    """The search of :func:`fit` over any ``measure(size, allocators) -> Probe``, which fills in
    the probe's verdict for each allocator it is given (those still searching at that size)."""
    from vrampool.whatif.replay import strategy_names

    allocators = strategy_names(list(allocators))
    if memory < 1 or max_size < 1:
        raise ValueError(f"memory and max_size must be at least 1, got {memory} and {max_size}")
    probes: Dict[int, Probe] = {}
    fits_at = {name: 0 for name in allocators}  # the largest size known to fit
    fails_at = {name: max_size + 1 for name in allocators}  # the smallest known not to

    def open_() -> List[str]:
        return [n for n in allocators if fails_at[n] - fits_at[n] > 1]

    def sizes() -> Iterable[int]:
        # Doubling while some allocator has not failed yet, then halving the widest interval.
        size = 1
        while size <= max_size and any(fails_at[n] > max_size for n in open_()):
            yield size
            size *= 2
        while open_():
            widest = max(open_(), key=lambda n: fails_at[n] - fits_at[n])
            yield (fits_at[widest] + fails_at[widest]) // 2

    for size in progress(sizes()):
        searching = [n for n in open_() if fits_at[n] < size < fails_at[n]]
        probe = probes[size] = measure(size, searching)
        for name in searching:
            if probe.fits[name]:
                fits_at[name] = size
            else:
                fails_at[name] = size
    largest = {n: fits_at[n] for n in allocators}
    return FitResult(memory, allocators, largest, list(probes.values()))
