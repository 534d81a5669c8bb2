"""`vrampool fit` for a cluster: what fits on every rank of FSDP2 or data-parallel training,
each rank's steps captured under torch's fake process group (as ``capture --parallel`` does)
and replayed on a simulated device of ``memory`` bytes per rank.

Ranks are symmetric when FSDP2 gives each the same parameter shard shapes: that is decided per
probe from the model built on the meta device, before any capture (:func:`layout`). One rank of
each group of alike ranks is captured, and the rank that fits least decides. The same check
comes before :func:`capture_ranks`, which captures every rank (``vrampool capture --parallel``).

>>> import torch
>>> from vrampool.whatif.cluster import layout
>>> def stack(batch):
...     layers = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(2)])
...     return layers, torch.randn(batch, 64)
>>> layout(stack, "fsdp", 4).symmetric, layout(stack, "fsdp", 3).groups   # 64 rows: 22, 22, 20
(True, [[0, 1], [2]])
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from vrampool.whatif.fit import ALLOCATORS, MAX_SIZE, DoesNotFit, FitResult, Probe, answer_rows, replay_into, search_largest
from vrampool.whatif.traces import Trace
from vrampool.whatif.training import ModelFunctionError, Optimizer, adamw

#: The most ranks ``--over ranks`` tries.
MAX_RANKS = 4096


class CannotShard(ValueError):
    """A world size at which FSDP2 would leave some rank none of a layer's parameter."""


@dataclasses.dataclass
class Layout:
    """How ``world_size`` ranks share a model's parameters: ``groups`` of ranks whose shards have
    the same shapes (one group when the ranks are symmetric), and the most parameter and buffer
    bytes any rank holds."""

    world_size: int
    groups: List[List[int]]
    rank_parameter_bytes: int

    @property
    def symmetric(self) -> bool:
        return len(self.groups) == 1

    @property
    def captured(self) -> List[int]:
        """The rank of each group that is captured: its first."""
        return [group[0] for group in self.groups]


@dataclasses.dataclass
class RankProbe(Probe):
    """A probe of a cluster: each allocator's verdict is that of the rank that fits least
    (``deciding_rank``), of the ``captured`` ranks (one per group of alike ranks among
    ``world_size``); ``lower_bound_bytes`` is the most any of them holds live."""

    world_size: int = 1
    captured: List[int] = dataclasses.field(default_factory=list)
    deciding_rank: Dict[str, int] = dataclasses.field(default_factory=dict)


@contextlib.contextmanager
def _no_own_process_group(name: str) -> Iterator[None]:
    """Refuses a model function that makes its own process group: the ranks run in the fake one
    that the capture makes."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    refusal = f"{name} builds its own process group; with --parallel, vrampool runs every rank in torch's fake process group: return (model, batch) and leave the group to it"

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ModelFunctionError(refusal)

    # Patched for the build only: the one way to catch the call before it blocks on a rendezvous.
    originals = dist.init_process_group, c10d.init_process_group
    dist.init_process_group = c10d.init_process_group = refuse
    try:
        yield
    finally:
        dist.init_process_group, c10d.init_process_group = originals
    if dist.is_initialized():  # made through a name bound before the patch
        dist.destroy_process_group()
        raise ModelFunctionError(refusal)


def _meta_model(fn: Callable[[], Any], name: str) -> Any:
    """The model of ``fn()``, built on the meta device."""
    import torch

    from vrampool.whatif.training import _call, _is_step, _unpack

    with torch.device("meta"), _no_own_process_group(name):
        built = _call(fn, name, True)
    if _is_step(built):
        raise ModelFunctionError(f"{name} returned a training step: ranks need (model, batch), which the capture shards")
    return _unpack(built, name)[0]


def _rows(n: int, world_size: int) -> List[int]:
    """The rows of dim 0 of ``n`` that each rank holds, as ``torch.chunk`` splits them for FSDP2
    (``_chunk_with_empty``): ``ceil(n / world)`` each, the last ranks fewer or none."""
    chunk = -(-n // world_size)
    return [max(0, min(chunk, n - r * chunk)) for r in range(world_size)]


def _layer_rows(model: Any) -> List[int]:
    """The rows of dim 0 of each parameter of the model's layer stack: what FSDP2 shards."""
    from vrampool.whatif.training import _layer_stack

    return [p.shape[0] for layer in _layer_stack(model) for p in layer.parameters() if p.dim() > 0]


def _unshardable(rows: Iterable[int], world_size: int) -> Optional[int]:
    """The rows of the first layer parameter that ``world_size`` ranks cannot all hold part of."""
    return next((n for n in rows if _rows(n, world_size)[-1] == 0), None)


def shardable_world_sizes(fn: Callable[[], Any], candidates: Iterable[int], name: str = "the model function") -> List[int]:
    """The world sizes of ``candidates`` over which FSDP2 gives every rank part of every
    parameter of ``fn()``'s layer stack."""
    rows = _layer_rows(_meta_model(fn, name))
    return [w for w in candidates if _unshardable(rows, w) is None]


def layout(fn: Callable[[int], Any], parallel: str, world_size: int, size: int = 1, name: str = "the model function") -> Layout:
    """How ``world_size`` ranks of ``parallel`` (``"fsdp"`` or ``"ddp"``) training share the
    model of ``fn(size)``, from its parameters' shapes alone. Raises ``CannotShard`` when some
    rank would hold none of a layer's parameter."""
    from vrampool.whatif.training import PARALLEL

    if parallel not in PARALLEL:
        raise ValueError(f"parallel must be one of {', '.join(PARALLEL)}, got {parallel!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    model = _meta_model(lambda: fn(size), name)
    shards = 1 if parallel == "ddp" else world_size  # data parallel: every rank holds it all
    n = _unshardable(_layer_rows(model), shards)
    if n is not None:
        chunk = _rows(n, shards)[0]
        raise CannotShard(f"{world_size:,} ranks: FSDP splits each layer's parameters on dim 0 in chunks of ceil(rows / ranks), and {n:,} rows in chunks of {chunk:,} leave the last ranks none")
    rows_by_rank: List[List[int]] = [[] for _ in range(world_size)]
    held = [sum(b.numel() * b.element_size() for b in model.buffers())] * world_size
    for p in model.parameters():
        n = p.shape[0] if p.dim() > 0 else 1
        rows = _rows(n, shards) * (world_size // shards)
        for r in range(world_size):
            rows_by_rank[r].append(rows[r])
            held[r] += rows[r] * (p.numel() // n) * p.element_size()
    groups: Dict[Tuple[int, ...], List[int]] = {}
    for r, rows in enumerate(rows_by_rank):
        groups.setdefault(tuple(rows), []).append(r)
    return Layout(world_size, list(groups.values()), max(held))


def capture_ranks(
    fn: Callable[[], Any],
    world_size: int,
    parallel: str,
    steps: int = 1,
    *,
    fake: bool = True,
    optimizer: Optimizer = adamw,
    name: Optional[str] = None,
    progress: Callable[[Iterable[int]], Iterable[int]] = lambda ranks: ranks,
) -> List[Trace]:
    """One trace per rank of ``world_size`` (see :func:`vrampool.whatif.training.capture_model`).
    The model is checked first, by the rule ``vrampool fit --parallel`` follows (:func:`layout`):
    one that makes its own process group, or FSDP over more ranks than a layer has rows (the last
    ranks would hold none of it), is refused before any rank is captured (``ModelFunctionError``,
    :class:`CannotShard`)."""
    from vrampool.whatif.training import capture_model

    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    layout(lambda _size: fn(), parallel, world_size, name=name or getattr(fn, "__qualname__", "the model function"))
    return [
        capture_model(fn, steps, fake=fake, parallel=parallel, world_size=world_size, rank=r, optimizer=optimizer, name=name)
        for r in progress(range(world_size))
    ]


def measure_ranks(
    fn: Callable[[int], Any],
    parallel: str,
    world_size: int,
    size: int,
    allocators: List[str],
    memory: int,
    *,
    steps: int = 2,
    name: str = "the model function",
    note: Callable[[str], None] = lambda text: None,
) -> RankProbe:
    """A probe of ``fn(size)`` on ``world_size`` ranks: one rank of each group of alike ranks
    captured and replayed under ``allocators``; for each allocator the verdict of the rank that
    fits least (one that runs out, else the one that reserves the most)."""
    from vrampool.whatif.training import capture_model

    ranks = layout(fn, parallel, world_size, size, name)
    probe = RankProbe(size, 0, world_size=world_size, captured=ranks.captured)
    for rank in ranks.captured:
        note(f"size {size:,}, rank {rank} of {world_size:,}")
        trace = capture_model(lambda: fn(size), steps, parallel=parallel, world_size=world_size, rank=rank, name=f"{name} at size {size}")
        part = Probe(size, trace.peak_allocated_bytes())
        replay_into(part, trace, allocators, memory)
        probe.lower_bound_bytes = max(probe.lower_bound_bytes, part.lower_bound_bytes)
        for n in allocators:
            worse = (not part.fits[n], part.peak_reserved_bytes[n]) > (not probe.fits.get(n, True), probe.peak_reserved_bytes.get(n, -1))
            if worse:
                probe.fits[n], probe.peak_reserved_bytes[n], probe.deciding_rank[n] = part.fits[n], part.peak_reserved_bytes[n], rank
    return probe


def _check_parameters(ranks: Layout, memory: int) -> None:
    if ranks.rank_parameter_bytes > memory:
        raise DoesNotFit(
            f"a rank's share of the model's parameters and buffers alone takes {ranks.rank_parameter_bytes / 2**30:,.2f} GiB on {ranks.world_size:,} ranks, more than the {memory / 2**30:,.2f} GiB of memory"
        )


def fit_cluster(
    fn: Callable[[int], Any],
    memory: int,
    parallel: str,
    world_size: int,
    allocators: Sequence[str] = ALLOCATORS,
    *,
    steps: int = 2,
    max_size: int = MAX_SIZE,
    name: str = "the model function",
    progress: Callable[[Iterable[int]], Iterable[int]] = lambda sizes: sizes,
    note: Callable[[str], None] = lambda text: None,
) -> FitResult:
    """:func:`vrampool.whatif.fit.fit_model` on every rank of ``world_size``: the largest size whose
    steps fit in ``memory`` on every rank, per allocator (probes are :class:`RankProbe`). Raises
    ``CannotShard`` or ``DoesNotFit`` before any search."""
    _check_parameters(layout(fn, parallel, world_size, 1, name), memory)

    def measure(size: int, searching: List[str]) -> Probe:
        return measure_ranks(fn, parallel, world_size, size, searching, memory, steps=steps, name=name, note=note)

    return search_largest(measure, memory, allocators, max_size=max_size, progress=progress)


@dataclasses.dataclass
class RanksResult:
    """``fewest[allocator]``: the fewest ranks (a power of two up to ``bound``, the most tried) at which a
    batch of ``batch`` fits on every rank, or None when none does; ``probes`` (their ``size``
    is the world size) in the order they were tried."""

    memory: int
    batch: int
    bound: int
    allocators: List[str]
    fewest: Dict[str, Optional[int]]
    probes: List[RankProbe]

    def probe(self, world_size: Optional[int]) -> Optional[RankProbe]:
        return next((p for p in self.probes if p.world_size == world_size), None)

    def to_json(self) -> Dict[str, Any]:
        rows = answer_rows({name: self.fewest[name] for name in self.allocators}, "fewest_ranks", self.probe, "deciding_rank")
        probes = [dataclasses.asdict(p) for p in sorted(self.probes, key=lambda p: p.world_size)]
        return {"memory_bytes": self.memory, "batch": self.batch, "max_ranks": self.bound, "rows": rows, "probes": probes}


def fewest_ranks(
    fn: Callable[[int], Any],
    memory: int,
    batch: int,
    allocators: Sequence[str] = ALLOCATORS,
    *,
    steps: int = 2,
    max_ranks: int = MAX_RANKS,
    name: str = "the model function",
    progress: Callable[[Iterable[int]], Iterable[int]] = lambda sizes: sizes,
    note: Callable[[str], None] = lambda text: None,
) -> RanksResult:
    """For each allocator, the fewest FSDP ranks at which ``fn(batch)``'s steps fit in
    ``memory`` on every rank. World sizes are powers of two, the sizes clusters are built in, up
    to ``max_ranks``, those over which every rank holds part of every layer; they are bisected, each
    capture shared by every allocator still searching, a world size that fits taken to mean every
    larger one does (sharding shrinks parameters, gradients and optimizer state; activations stay)."""
    from vrampool.whatif.replay import strategy_names

    allocators = strategy_names(list(allocators))
    if memory < 1 or batch < 1 or max_ranks < 1:
        raise ValueError(f"memory, batch and max_ranks must be at least 1, got {memory}, {batch} and {max_ranks}")
    powers = [1 << k for k in range(int(math.log2(min(max_ranks, MAX_RANKS))) + 1)]
    candidates = shardable_world_sizes(lambda: fn(batch), powers, name)
    fits_from = {n: len(candidates) for n in allocators}  # the smallest index known to fit
    fails_to = {n: -1 for n in allocators}  # the largest known not to
    probes: Dict[int, RankProbe] = {}

    def open_() -> List[str]:
        return [n for n in allocators if fits_from[n] - fails_to[n] > 1]

    def world_sizes() -> Iterable[int]:
        while open_():
            widest = max(open_(), key=lambda n: fits_from[n] - fails_to[n])
            yield candidates[(fits_from[widest] + fails_to[widest]) // 2]

    for world_size in progress(world_sizes()):
        index = candidates.index(world_size)
        searching = [n for n in open_() if fails_to[n] < index < fits_from[n]]
        probe = probes[world_size] = measure_ranks(fn, "fsdp", world_size, batch, searching, memory, steps=steps, name=name, note=note)
        probe.size = world_size
        for n in searching:
            if probe.fits[n]:
                fits_from[n] = index
            else:
                fails_to[n] = index
    fewest = {n: candidates[fits_from[n]] if fits_from[n] < len(candidates) else None for n in allocators}
    return RanksResult(memory, batch, candidates[-1], allocators, fewest, list(probes.values()))
