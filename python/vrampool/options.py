"""Keyword options in the one text form the core parses (``VRAMPOOL_CONF``'s:
``strategy:hybrid,limit:0.9``). Nothing is parsed or checked here beyond Python types: the core
reads every value, so ``DevicePool(...)``, ``vrampool.torch.install(...)``, ``VRAMPOOL_CONF`` and
``replay --conf`` take the same keys and mean the same by the same text.

A value becomes text as Python writes it: an ``int`` is a whole number (bytes, for a size or a
limit), a ``float`` keeps its point (a ``limit`` of ``0.9`` or ``1.0`` is a fraction of the
device; ``1`` is one byte), a ``bool`` is ``true`` / ``false`` (and the keys that take a bool take
nothing else), a string is passed as it is (``"64KB"``).

>>> conf_text({"strategy": "best_fit", "limit": 0.5, "expandable": True, "small_max": 1 << 20})
'strategy:best_fit,limit:0.5,expandable:true,small_max:1048576'
>>> conf_text({"limit": None})
''
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

from vrampool._native import conf_pairs, config_keys
from vrampool.streams import as_int

__all__ = ["ALLOCATOR_KEYS", "KEYS", "POOL_KEYS", "conf_text", "pool_pairs"]

#: Every key the core takes, with the kind of its value (``choice``, ``bytes``, ``count``,
#: ``bytes_or_fraction``, ``bool``).
KEYS: Dict[str, str] = {name: kind for name, kind, _ in config_keys()}
#: The keys of every pool (``DevicePool``'s options).
POOL_KEYS: Dict[str, str] = {name: kind for name, kind, scope in config_keys() if scope == "pool"}
#: Every key, with those of the allocator PyTorch is given (``device``, ``sim_capacity``).
ALLOCATOR_KEYS = KEYS


def _text(key: str, kind: str, value: Any) -> str:
    if kind == "bool" and not isinstance(value, bool):
        raise TypeError(f"{key} must be a bool, not {type(value).__name__}")
    if isinstance(value, bool):
        return "true" if value else "false"
    number = as_int(value)
    if number is not None:
        return str(number)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        if any(c in value for c in ",:="):
            raise ValueError(f"option {key}={value!r}: a value cannot hold ',', ':' or '='")
        return value.strip()
    raise TypeError(f"option {key} must be a bool, number or string, not {type(value).__name__}")


def conf_text(options: Mapping[str, Any], keys: Mapping[str, str] = ALLOCATOR_KEYS) -> str:
    """The text form of ``options``, in their order; None values are left out. An option that
    is none of ``keys`` is a ``TypeError`` naming them."""
    parts = []
    for key, value in options.items():
        kind = keys.get(key)
        if kind is None:
            raise TypeError(f"unknown vrampool option {key!r}; options: {', '.join(keys)}")
        if value is not None:
            parts.append(f"{key}:{_text(key, kind, value)}")
    return ",".join(parts)


def pool_pairs(text: str) -> str:
    """The pairs of a ``VRAMPOOL_CONF`` text whose key is a pool's (``ipc:true`` of
    ``device:cuda,ipc:true``), split as the core splits them; the core checks their values.

    >>> pool_pairs("device:sim,small_max:[64KB],ipc:true")
    'small_max:[64KB],ipc:true'
    """
    return ",".join(f"{key}:{value}" for key, value in conf_pairs(text) if key in POOL_KEYS)
