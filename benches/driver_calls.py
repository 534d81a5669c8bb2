"""The emulated CUDA driver's call counts, for the benchmarks that show the driver calls a piece of
work makes (run under ``scripts/emulated-cuda.sh``)."""

from __future__ import annotations

import ctypes
from typing import Dict, Optional


def driver_counts() -> Optional[Dict[str, int]]:
    """Every driver call count since the emulator started, by name; None where the loaded libcuda is
    not the emulated driver."""
    lib = ctypes.CDLL("libcuda.so.1")
    if not hasattr(lib, "emucuda_call_counts"):
        return None
    lib.emucuda_call_counts.restype = ctypes.c_size_t
    lib.emucuda_call_counts.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    n = lib.emucuda_call_counts(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.emucuda_call_counts(buf, n + 1)
    return {name: int(count) for name, count in (line.split() for line in buf.value.decode().splitlines())}
