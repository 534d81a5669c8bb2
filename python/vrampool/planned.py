"""`PlannedPool`: a planned arena over a `DevicePool` (static plan, dynamic fallback).

The first iteration of each signature runs on the pool and is recorded; its buffers that are born
and die inside it are planned into one arena. Later iterations with the same signature that make
the same allocations and frees in the same order are served from the arena at the planned
offsets, with no pool call at all. On the first difference (another size, stream or order) the
rest of the iteration goes to the pool, and the iteration is planned anew. Plans are kept per
signature key, as ONNX Runtime keeps memory patterns per input shape.

Pointers are plain ints (the arena's buffers are slices of one pool block, not blocks of their
own): ``allocate`` returns one, ``deallocate`` takes it back.

>>> from vrampool import DevicePool
>>> planned = DevicePool("sim", capacity=1 << 30).planned()
>>> for _ in range(3):
...     a, b = planned.allocate(4096), planned.allocate(8192)
...     planned.deallocate(a)
...     planned.deallocate(b)
...     planned.step()
>>> s = planned.stats()
>>> (s["dynamic_allocations"], s["planned_allocations"], s["fallbacks"])
(2, 4, 0)
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, Hashable, Optional, Protocol

from vrampool._native import InvalidSizeError, NativePlannedPool, NativePool
from vrampool.streams import as_int, stream_handle

#: The key of iterations whose caller names none.
DEFAULT_KEY = 0
#: The key that lets an iteration's first allocation pick its plan (the plan of an iteration that began
#: with an allocation of the same size on the same stream): what automatic boundaries use.
AUTO_KEY = (1 << 64) - 1


def signature_key(key: Optional[Hashable]) -> int:
    """A stable 64-bit key for ``key`` (the same in every process): ``None`` is the default key;
    anything else is hashed by its ``repr``, with tuples and lists (``torch.Size`` is a tuple)
    read as plain tuples, so pass shapes (``x.shape``, a tuple of them), not tensors.

    >>> signature_key(None)
    0
    >>> signature_key((8, 3, 32, 32)) == signature_key([8, 3, 32, 32]) != signature_key((16, 3, 32, 32))
    True
    """
    if key is None:
        return DEFAULT_KEY
    digest = hashlib.blake2b(repr(_plain(key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


def _plain(key: Any) -> Any:
    if isinstance(key, (tuple, list)):
        return tuple(_plain(k) for k in key)
    return key


class Pool(Protocol):
    """What a planned arena needs of its pool (a :class:`vrampool.DevicePool`): the native pool beneath."""

    _native: NativePool


class PlannedPool:
    """A planned arena over ``pool``: ``allocate`` / ``deallocate`` by pointer, ``step(key)``
    between iterations (``key``: the next iteration's signature, e.g. its input shapes).

    ``budget_ms`` caps the search for each plan (taken at a ``step``). Leaving the context
    manager gives the arena back to the pool unless arena buffers are still live.
    """

    def __init__(self, pool: Pool, *, budget_ms: int = 10) -> None:
        self._pool = pool
        self._native = NativePlannedPool(pool._native, budget_ms=budget_ms)

    def allocate(self, nbytes: int, stream: Any = None) -> int:
        """The address of ``nbytes`` bytes for use on ``stream`` (None: the default stream)."""
        size = as_int(nbytes)
        if size is None:
            raise TypeError(f"nbytes must be an int, not {type(nbytes).__name__}")
        if not 0 <= size < 1 << 64:
            raise InvalidSizeError(f"invalid size {size}: not a byte count")
        return self._native.allocate(size, stream_handle(stream))

    def deallocate(self, ptr: int, stream: Any = None) -> None:
        """Frees ``ptr``; ``stream``, when given, is the stream that used it last. A pointer
        this pool did not hand out (or freed already) raises ``InvalidFreeError``."""
        self._native.free(ptr, None, None if stream is None else stream_handle(stream))

    def record_stream(self, ptr: int, stream: Any) -> None:
        """Marks ``ptr`` as used on ``stream`` too (such buffers are left to the pool)."""
        self._native.record_stream(ptr, stream_handle(stream))

    def step(self, key: Optional[Hashable] = None) -> None:
        """Ends the iteration (planning it if it had no plan or left it) and starts the next,
        whose signature is ``key`` (see :func:`signature_key`)."""
        self._native.step(signature_key(key))

    def stats(self) -> Dict[str, Any]:
        """``planned_allocations`` (from the arena), ``dynamic_allocations`` (from the pool),
        ``fallbacks`` (iterations that left their plan), ``recorded_iterations`` (iterations
        without a plan yet), ``replayed_iterations``, ``arena_bytes``, ``arena_live`` (buffers) and
        ``arena_live_bytes``, ``planned_bytes`` (every arena buffer's), ``arena_blocks_taken`` and
        ``arena_blocks_returned`` (arenas taken from the pool and given back), and ``plans``: per key, ``arena_bytes`` against ``lower_bound_bytes``, ``arena_buffers``,
        ``dynamic_buffers`` and ``events``."""
        return self._native.stats()

    def release_arena(self) -> int:
        """Gives the arena back to the pool if no arena buffer is live; returns its bytes."""
        return self._native.release_idle_arena()

    @property
    def pool(self) -> Pool:
        return self._pool

    def __enter__(self) -> "PlannedPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release_arena()

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"PlannedPool(planned={s['planned_allocations']}, dynamic={s['dynamic_allocations']}, "
            f"fallbacks={s['fallbacks']}, plans={len(s['plans'])}, arena_bytes={s['arena_bytes']})"
        )
