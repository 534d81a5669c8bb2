"""`DevicePool`: raw device buffers from a vrampool pool."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

from vrampool._native import NativeBuffer, NativePool

#: A block of device memory; freed exactly once (``close()``, ``DevicePool.deallocate`` or when
#: collected). Attributes: ``ptr``, ``size``, ``stream``, ``device``, ``freed``.
DeviceBuffer = NativeBuffer

_STRATEGIES = ("hybrid", "slab", "best_fit", "buddy")
_SIZE_KEYS = ("small_max", "large_min", "alignment")
_DEFAULT_SIM_CAPACITY = 16 << 30


def _check_size(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    if value >= 1 << 64:
        raise ValueError(f"{name} of {value} bytes is larger than any device")
    return value


def _check_stream(stream: Any) -> int:
    if stream is None:
        return 0
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError(f"stream must be an int handle or None, not {type(stream).__name__}")
    if not 0 <= stream < 1 << 64:
        raise ValueError(f"stream handle {stream} is out of range")
    return stream


def _conf_text(strategy: str, options: Dict[str, Any]) -> str:
    if strategy not in _STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(_STRATEGIES)}")
    parts = [f"strategy:{strategy}"]
    for key, value in options.items():
        if value is None:
            continue
        if key in _SIZE_KEYS:
            parts.append(f"{key}:{_check_size(key, value)}")
        elif key == "limit":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"limit must be a positive byte count or a fraction in (0, 1], got {value!r}")
            parts.append(f"limit:{value}")
        elif key == "round_up_divisions":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"round_up_divisions must be a non-negative int, got {value!r}")
            parts.append(f"round_up_divisions:{value}")
        elif key == "record_events":
            parts.append(f"record_events:{bool(value)}")
        else:
            raise TypeError(f"unknown pool option {key!r}")
    return ",".join(parts)


class DevicePool:
    """A pool of device memory: small blocks from slabs, the middle best-fit, large blocks buddy.

    ``device="sim"`` runs on the simulated device (host memory, so tests can write through the
    pointers). Thread-safe; the GIL is released inside the Rust calls.

    >>> with DevicePool("sim", capacity=1 << 30, strategy="best_fit") as pool:
    ...     buf = pool.allocate(1 << 20)
    ...     pool.stats()["allocated_bytes.all.current"] >= 1 << 20
    True
    """

    def __init__(
        self,
        device: Union[int, str] = "sim",
        *,
        capacity: Optional[int] = None,
        strategy: str = "hybrid",
        host_backed: bool = True,
        small_max: Optional[int] = None,
        large_min: Optional[int] = None,
        alignment: Optional[int] = None,
        round_up_divisions: Optional[int] = None,
        limit: Optional[Union[int, float]] = None,
        record_events: bool = False,
    ) -> None:
        conf = _conf_text(
            strategy,
            {
                "small_max": small_max,
                "large_min": large_min,
                "alignment": alignment,
                "round_up_divisions": round_up_divisions,
                "limit": limit,
                "record_events": record_events or None,
            },
        )
        if device == "sim":
            cap = _DEFAULT_SIM_CAPACITY if capacity is None else _check_size("capacity", capacity)
            self._native = NativePool(cap, conf, host_backed)
        elif isinstance(device, int) and not isinstance(device, bool) and device >= 0:
            if capacity is not None:
                raise ValueError("capacity is for the simulated device; use limit= on a GPU")
            self._native = NativePool.cuda(device, conf)
        else:
            raise ValueError(f"device must be 'sim' or a CUDA device ordinal >= 0, got {device!r}")

    def allocate(self, nbytes: int, stream: Optional[int] = None) -> DeviceBuffer:
        """A buffer of at least ``nbytes`` bytes for use on ``stream`` (0 / None: the default)."""
        return self._native.allocate(_check_size("nbytes", nbytes), _check_stream(stream))

    def deallocate(self, buffer: DeviceBuffer, stream: Optional[int] = None) -> None:
        """Frees ``buffer``; freeing it twice raises ``InvalidFreeError``."""
        if not isinstance(buffer, NativeBuffer):
            raise TypeError(f"deallocate takes a DeviceBuffer, not {type(buffer).__name__}")
        if not buffer.belongs_to(self._native):
            raise ValueError(f"{buffer!r} belongs to another pool")
        if buffer.freed:
            from vrampool._native import InvalidFreeError

            raise InvalidFreeError(f"{buffer!r} was already freed")
        buffer.free(None if stream is None else _check_stream(stream))

    def record_stream(self, buffer: DeviceBuffer, stream: int) -> None:
        """Marks ``buffer`` as used on ``stream`` too: its memory is not reused until ``stream``
        has passed the free."""
        self._native.record_stream(buffer.ptr, _check_stream(stream))

    def stats(self) -> Dict[str, Union[int, float]]:
        """Counters under PyTorch's key names (``allocated_bytes.all.current``, ...)."""
        return self._native.stats()

    def reset_peak_stats(self) -> None:
        self._native.reset_peak_stats()

    def snapshot(self) -> List[Dict[str, Any]]:
        """Segments and their blocks, as data."""
        return self._native.snapshot()

    def trim(self) -> int:
        """Gives every wholly free segment back to the device; returns the bytes released."""
        return self._native.trim()

    empty_cache = trim

    def close(self) -> List[Dict[str, int]]:
        """Closes the pool; returns the blocks still live (leaks)."""
        return [
            {"ptr": p, "size": s, "requested": r, "stream": st} for p, s, r, st in self._native.close()
        ]

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def strategy(self) -> str:
        return self._native.strategy

    @property
    def native(self) -> NativePool:
        """The extension object (simulated-device controls for tests: ``sim_write``, ...)."""
        return self._native

    def __enter__(self) -> "DevicePool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"DevicePool(strategy={self.strategy!r}, allocated={s['allocated_bytes.all.current']}, "
            f"reserved={s['reserved_bytes.all.current']}{', closed' if self.closed else ''})"
        )
