"""A readable table of a pool's figures, in the manner of ``torch.cuda.memory_summary``.

>>> import vrampool
>>> pool = vrampool.DevicePool("sim", capacity=1 << 30)
>>> buf = pool.allocate(3 << 20)
>>> text = pool.memory_summary()
>>> "Allocated memory" in text and "best_fit" in text
True
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

__all__ = ["block_state", "format_summary", "format_size", "tier_counts"]

_NAME, _CELL, _CELLS = 21, 11, 4
_WIDTH = 2 + _NAME + 3 + _CELLS * _CELL + (_CELLS - 1) * 3 + 2  # "| name | c | c | c | c |"
_STATES = ("active", "pending_free", "cached", "free")


def format_size(n: Union[int, float]) -> str:
    """Bytes in the largest binary unit that keeps the number at or above 1.

    >>> format_size(512), format_size(3 << 20), format_size(1536)
    ('512 B', '3.00 MiB', '1.50 KiB')
    """
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def block_state(block: Mapping[str, Any]) -> str:
    """What a snapshot block is doing, in vrampool's terms (its ``vrampool_state``, beside torch's
    ``state``): ``active``, ``pending_free`` (freed, waiting for another stream), ``cached`` (freed,
    kept at its size) or ``free``.

    >>> block_state({"state": "inactive", "vrampool_state": "cached"})
    'cached'
    """
    return str(block["vrampool_state"])


def tier_counts(segments: Iterable[Mapping[str, Any]]) -> Dict[str, Dict[str, int]]:
    """Per strategy tier: segments, reserved bytes, and blocks and bytes in each block state,
    from the ``segments`` of a snapshot (``DevicePool.snapshot()["segments"]``).

    >>> tier_counts([{"strategy": "slab", "total_size": 4096, "blocks": [
    ...     {"size": 1024, "vrampool_state": "active"}, {"size": 3072, "vrampool_state": "free"}]}])["slab"]["active_blocks"]
    1
    """
    tiers: Dict[str, Dict[str, int]] = {}
    for seg in segments:
        t = tiers.setdefault(
            seg["strategy"],
            {"segments": 0, "reserved_bytes": 0, **{f"{s}_{k}": 0 for s in _STATES for k in ("blocks", "bytes")}},
        )
        t["segments"] += 1
        t["reserved_bytes"] += seg["total_size"]
        for block in seg["blocks"]:
            state = block_state(block)
            t[f"{state}_blocks"] += 1
            t[f"{state}_bytes"] += block["size"]
    return tiers


def format_summary(
    stats: Mapping[str, Union[int, float]],
    segments: Optional[Sequence[Mapping[str, Any]]] = None,
    title: str = "vrampool memory summary",
) -> str:
    """The table ``DevicePool.memory_summary()`` prints, from ``stats()`` and the ``segments`` of
    ``snapshot()``.

    >>> print(format_summary({"allocated_bytes.all.current": 1024}).splitlines()[5][:37])
    | Allocated memory      |    1.00 KiB
    """
    def g(key: str) -> Union[int, float]:
        return stats.get(key, 0)  # a key another version lacks reads as 0
    rule = "|" + "-" * (_WIDTH - 2) + "|"
    heavy = "|" + "=" * (_WIDTH - 2) + "|"

    def row(cells: List[str]) -> str:
        name, *rest = cells
        return f"| {name:<{_NAME}} | " + " | ".join(f"{c:>{_CELL}}" for c in rest) + " |"

    def line(text: str) -> str:
        return "| " + f"{text:<{_WIDTH - 4}}" + " |"

    out = [heavy, line(title.center(_WIDTH - 4)), rule]
    out.append(row(["Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"]))
    out.append(rule)
    for label, key in (
        ("Allocated memory", "allocated_bytes"),
        ("Active memory", "active_bytes"),
        ("Requested memory", "requested_bytes"),
        ("Reserved memory", "reserved_bytes"),
    ):
        out.append(row([label] + [format_size(g(f"{key}.all.{f}")) for f in ("current", "peak", "allocated", "freed")]))
    out.append(rule)
    for label, key in (("Allocations", "allocation"), ("Segments", "segment")):
        out.append(row([label] + [f"{int(g(f'{key}.all.{f}')):,}" for f in ("current", "peak", "allocated", "freed")]))
    out.append(rule)
    free = g("free_bytes") or max(0, g("reserved_bytes.all.current") - g("allocated_bytes.all.current"))
    out.append(line(f"Reserved but unallocated: {format_size(free)}, largest free block {format_size(g('largest_free_bytes'))}"))
    out.append(line(f"Of it in cached blocks (freed, kept for reuse): {format_size(g('cached_bytes'))}"))
    out.append(
        line(
            f"Fragmentation: {100 * float(g('fragmentation')):.1f} %   "
            f"reserved / allocated: {float(g('reserved_per_allocated')):.2f}"
        )
    )
    out.append(
        line(
            f"OOMs: {int(g('num_ooms'))}   alloc retries: {int(g('num_alloc_retries'))}   "
            f"deferred frees: {int(g('deferred_frees'))}"
        )
    )
    out.append(
        line(
            f"Device allocs: {int(g('num_device_alloc'))}   device frees: {int(g('num_device_free'))}   "
            f"fast-path hits: {int(g('fast_path_hits'))}"
        )
    )
    if segments is not None:
        out.append(rule)
        out.append(row(["Strategy tier", "Segments", "Reserved", "Active blks", "Cached/free"]))
        out.append(rule)
        tiers = tier_counts(segments)
        if not tiers:
            out.append(line("(no segments)"))
        for name in sorted(tiers):
            t = tiers[name]
            cached = t["cached_blocks"] + t["pending_free_blocks"]
            out.append(
                row(
                    [
                        name,
                        f"{t['segments']:,}",
                        format_size(t["reserved_bytes"]),
                        f"{t['active_blocks']:,}",
                        f"{cached:,} / {t['free_blocks']:,}",
                    ]
                )
            )
    out.append(heavy)
    return "\n".join(out)
