"""pytest-benchmark: one allocation and its free from Python, on the simulated device, beside
baselines timed in the same run (BENCHMARKS.md, "Python benchmarks").

- `DevicePool.allocate` + `deallocate` (a `DeviceBuffer` made and dropped) against making and
  dropping a NumPy array and a bytearray of the same size;
- `vrampool_malloc` + `vrampool_free` through ctypes (the C ABI that PyTorch calls) against the
  same two ctypes calls answered at once (size 0, null), which is ctypes' own cost, and libc's
  malloc + free through ctypes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from ctypes import c_int, c_size_t, c_void_p
from typing import Iterator

import numpy as np
import pytest

from vrampool import DevicePool, _native

SIZES = [512, 1 << 20]


@pytest.fixture(scope="module")
def pool() -> Iterator[DevicePool]:
    with DevicePool("sim", capacity=1 << 30, strategy="hybrid") as p:
        yield p


@pytest.fixture(scope="module")
def abi() -> ctypes.CDLL:
    _native.configure("device:sim,sim_capacity:1GB,strategy:hybrid")
    lib = ctypes.CDLL(_native.__file__)
    lib.vrampool_malloc.restype, lib.vrampool_malloc.argtypes = c_void_p, [c_size_t, c_int, c_void_p]
    lib.vrampool_free.restype, lib.vrampool_free.argtypes = None, [c_void_p, c_size_t, c_int, c_void_p]
    return lib


@pytest.fixture(scope="module")
def libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("c"))
    lib.malloc.restype, lib.malloc.argtypes = c_void_p, [c_size_t]
    lib.free.restype, lib.free.argtypes = None, [c_void_p]
    return lib


def group(kind: str, size: int) -> str:
    return f"pair {size} B: {kind}"


@pytest.mark.parametrize("size", SIZES)
def test_device_pool_pair(benchmark, pool: DevicePool, size: int) -> None:
    benchmark.group = group("DevicePool", size)

    def pair() -> None:
        pool.deallocate(pool.allocate(size))

    benchmark(pair)
    assert pool.stats()["allocated_bytes.all.current"] == 0


@pytest.mark.parametrize("size", SIZES)
def test_numpy_empty_pair_baseline(benchmark, size: int) -> None:
    benchmark.group = group("DevicePool", size)
    benchmark(np.empty, size, np.uint8)


@pytest.mark.parametrize("size", SIZES)
def test_bytearray_pair_baseline(benchmark, size: int) -> None:
    benchmark.group = group("DevicePool", size)
    benchmark(bytearray, size)


@pytest.mark.parametrize("size", SIZES)
def test_c_abi_pair_through_ctypes(benchmark, abi: ctypes.CDLL, size: int) -> None:
    benchmark.group = group("C ABI through ctypes", size)
    malloc, free = abi.vrampool_malloc, abi.vrampool_free

    def pair() -> None:
        free(malloc(size, 0, None), size, 0, None)

    benchmark(pair)
    assert _native.abi_counters()["failed_mallocs"] == 0 and _native.last_error() is None


@pytest.mark.parametrize("size", SIZES)
def test_ctypes_call_pair_baseline(benchmark, abi: ctypes.CDLL, size: int) -> None:
    # The same two entries, answered at once: vrampool_malloc(0) is null, vrampool_free(null) a no-op.
    benchmark.group = group("C ABI through ctypes", size)
    malloc, free = abi.vrampool_malloc, abi.vrampool_free

    def pair() -> None:
        free(malloc(0, 0, None), 0, 0, None)

    benchmark(pair)


@pytest.mark.parametrize("size", SIZES)
def test_libc_pair_through_ctypes_baseline(benchmark, libc: ctypes.CDLL, size: int) -> None:
    benchmark.group = group("C ABI through ctypes", size)
    malloc, free = libc.malloc, libc.free

    def pair() -> None:
        free(malloc(size))

    benchmark(pair)
