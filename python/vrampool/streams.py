"""Stream objects of every CUDA Python library, as the raw handles the pool keys its arenas by.

>>> from vrampool.streams import stream_handle
>>> stream_handle(None), stream_handle(0), stream_handle(0x7F00)
(0, 0, 32512)
>>> class Fake:                     # cuda.core's Stream, recent CuPy and PyTorch streams
...     def __cuda_stream__(self):
...         return (0, 0x1234)
>>> stream_handle(Fake())
4660
"""

from __future__ import annotations

import operator
import sys
from typing import Any

from vrampool._native import canonical_stream, set_stream_reader

__all__ = ["as_int", "stream_handle", "LEGACY_DEFAULT_STREAM", "PER_THREAD_DEFAULT_STREAM"]

#: ``CU_STREAM_LEGACY``: the legacy default stream, also named by handle 0.
LEGACY_DEFAULT_STREAM = 1
#: ``CU_STREAM_PER_THREAD``: the calling thread's default stream.
PER_THREAD_DEFAULT_STREAM = 2

_MAX_HANDLE = 1 << 64

_ACCEPTED = (
    "None, an int handle, a cuda.bindings CUstream, an object with __cuda_stream__ "
    "(cuda.core, CuPy, PyTorch streams) or a torch.cuda.Stream"
)


def stream_handle(stream: Any) -> int:
    """The ``CUstream`` handle of ``stream``, as an int.

    Accepted: ``None`` (the legacy default stream, 0); an ``int`` handle; any object with
    ``__cuda_stream__()`` returning ``(0, handle)`` (cuda.core ``Stream``, recent CuPy and
    PyTorch streams); a ``torch.cuda.Stream`` (its ``cuda_stream``); a cuda.bindings
    ``CUstream`` or ``cudaStream_t`` (``int(obj)`` is the handle: their ``getPtr()`` is the
    address of the handle, not the handle); a CuPy stream (its ``ptr``). Anything else raises
    ``TypeError``; a handle out of range raises ``ValueError``.

    ``CU_STREAM_LEGACY`` (1) names the same stream as 0 and comes back as 0, so that the legacy
    default stream has one arena in the pool whichever library named it.

    >>> stream_handle(1)
    0
    >>> stream_handle("default")
    Traceback (most recent call last):
    ...
    TypeError: stream must be None, an int handle, a cuda.bindings CUstream, an object with __cuda_stream__ (cuda.core, CuPy, PyTorch streams) or a torch.cuda.Stream; got str
    """
    if stream is None:
        return 0
    handle = _raw_handle(stream)
    if not 0 <= handle < _MAX_HANDLE:
        raise ValueError(f"stream handle {handle} is out of range (a CUstream is an unsigned 64-bit value)")
    return canonical_stream(handle)


def as_int(value: Any) -> "int | None":
    """``value`` as an int if it is one: an ``int`` or anything with ``__index__`` (a NumPy
    integer, say), but not a ``bool`` (NumPy's either), whose ``__index__`` would make True a 1;
    None otherwise (a float, a string, ...).

    >>> import numpy as np
    >>> as_int(7), as_int(np.int64(7)), as_int(True), as_int(7.0), as_int("7")
    (7, 7, None, None, None)
    """
    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_") or not hasattr(type(value), "__index__"):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _raw_handle(stream: Any) -> int:
    if type(stream) is int:
        return stream
    if isinstance(stream, bool) or type(stream).__name__ in ("bool", "bool_"):
        raise TypeError(f"stream must be {_ACCEPTED}; got bool")
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        return _from_protocol(stream, protocol)
    torch_handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream, torch.cuda.ExternalStream
    if torch_handle is not None:
        return _as_int(torch_handle, f"{type(stream).__name__}.cuda_stream")
    if _is_bindings_stream(stream):
        return int(stream)
    if _is_cupy_stream(stream):
        return _as_int(stream.ptr, f"{type(stream).__name__}.ptr")
    handle = as_int(stream)
    # cuda.bindings handles have `__index__` too: only its stream types (above) are streams.
    if handle is not None and not callable(getattr(stream, "getPtr", None)):
        return handle
    raise TypeError(f"stream must be {_ACCEPTED}; got {type(stream).__name__}")


def _from_protocol(stream: Any, protocol: Any) -> int:
    # The protocol is a method; very early cuda.core releases had a property.
    value = protocol() if callable(protocol) else protocol
    if not (isinstance(value, tuple) and len(value) == 2):
        raise TypeError(
            f"{type(stream).__name__}.__cuda_stream__() must return (version, handle), got {value!r}"
        )
    version, handle = value
    if as_int(version) != 0:
        raise ValueError(f"{type(stream).__name__}.__cuda_stream__() speaks version {version!r}; vrampool knows version 0")
    return _as_int(handle, f"{type(stream).__name__}.__cuda_stream__()[1]")


def _as_int(value: Any, what: str) -> int:
    """A handle an object gives: an int (see `as_int`), or a cuda.bindings handle object (whose
    ``int()`` is the handle); a float, a string or a bool is refused, not truncated or parsed."""
    if _is_bindings_stream(value):
        return int(value)
    handle = as_int(value)
    if handle is not None and not callable(getattr(value, "getPtr", None)):
        return handle
    raise TypeError(f"{what} must be an int handle, not {type(value).__name__}")


_BINDINGS_STREAM_TYPES = {"cuda.bindings.driver": "CUstream", "cuda.bindings.runtime": "cudaStream_t"}


def _is_bindings_stream(stream: Any) -> bool:
    """A cuda.bindings ``CUstream`` / ``cudaStream_t`` (or one of the same name from an older
    ``cuda`` package): ``getPtr()`` and ``__int__`` as every cuda.bindings handle has, and the
    name, so that a ``CUevent`` or ``CUdeviceptr`` is not taken for a stream."""
    for module_name, type_name in _BINDINGS_STREAM_TYPES.items():
        kind = getattr(sys.modules.get(module_name), type_name, None)
        if kind is not None and isinstance(stream, kind):
            return True
    kind = type(stream)
    return (
        kind.__name__ in _BINDINGS_STREAM_TYPES.values()
        and callable(getattr(kind, "getPtr", None))
        and callable(getattr(kind, "__int__", None))
    )


def _is_cupy_stream(stream: Any) -> bool:
    cuda = getattr(sys.modules.get("cupy"), "cuda", None)
    base = getattr(getattr(cuda, "stream", None), "BaseStream", None)
    return base is not None and isinstance(stream, base)


# The native layer reads `buffer.free(stream)` with this module's reader, never importing it.
set_stream_reader(stream_handle)
