"""Pause and resume of a tag's memory (``DevicePool.pause`` / ``resume``), with and without a
backup, beside what giving the same memory back costs without keeping the addresses: freeing the
buffers, ``trim()`` and allocating them again (a best-fit pool of expandable segments, the tag's
own kind), and the copies a backup makes, alone (``cuMemcpyDtoH`` / ``cuMemcpyHtoD`` of the same
bytes to and from page-locked memory). Seconds per call (median of ``--repeat``), and the driver calls each makes.

Run: ``scripts/emulated-cuda.sh python benches/pause_resume.py [--gib 1 2 4 8] [--repeat 3]``
(the emulated device needs the memory: ``EMULATED_CUDA_MEMORY=20GiB`` for 8 GiB). Under the
emulated driver the figures are the emulator's (host memory), not a GPU's: scripts/gpu-check.sh
runs the same on a GPU. Exits with 3 where there is no CUDA device.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import vrampool
from driver_calls import driver_counts
from vrampool import DevicePool

MIB = 1 << 20
BUFFER = 256 * MIB


def timed(work: Callable[[], object]) -> tuple:
    """Seconds of ``work``, and the driver calls it made (none counted on a real driver)."""
    before = driver_counts() or {}
    start = time.perf_counter()
    work()
    seconds = time.perf_counter() - start
    after = driver_counts() or {}
    return seconds, {k: v - before.get(k, 0) for k, v in after.items() if k.startswith("cu") and v > before.get(k, 0)}


def copies(bufs: list, repeat: int) -> tuple:
    """Seconds of copying every buffer to fresh page-locked host memory (its allocation
    included, as a backup's) and back, by the driver alone."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemAllocHost_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cuMemFreeHost.argtypes = [ctypes.c_void_p]
    lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    out, back = [], []
    for _ in range(repeat):
        host = ctypes.c_void_p()
        start = time.perf_counter()
        assert lib.cuMemAllocHost_v2(ctypes.byref(host), sum(b.size for b in bufs)) == 0
        at = host.value or 0
        for b in bufs:
            assert lib.cuMemcpyDtoH_v2(at, b.ptr, b.size) == 0
            at += b.size
        out.append(time.perf_counter() - start)
        at = host.value or 0
        start = time.perf_counter()
        for b in bufs:
            assert lib.cuMemcpyHtoD_v2(b.ptr, at, b.size) == 0
            at += b.size
        back.append(time.perf_counter() - start)
        lib.cuMemFreeHost(host)
    return out, back


def row(name: str, gib: int, seconds: List[float], calls: Dict[str, int]) -> None:
    shown = ", ".join(f"{k} {v}" for k, v in sorted(calls.items())) or "-"
    print(f"| {name} | {gib} GiB | {statistics.median(seconds):.4f} s | {shown} |", flush=True)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        DevicePool(0).close()
    except vrampool.DeviceError as e:
        print(f"no CUDA device: {e}")
        sys.exit(3)
    print("| call | memory | median | driver calls (one call) |")
    print("| --- | ---: | ---: | --- |")
    for gib in args.gib:
        n = gib * 1024 * MIB // BUFFER
        tagged(gib, n, args.repeat)
        given_back(gib, n, args.repeat)



def tagged(gib: int, n: int, repeat: int) -> None:
    """Pause and resume of `n` buffers in a tag, with and without a backup; the backup's copies alone."""
    pool = DevicePool(0)
    with pool.region("bench"):
        bufs = [pool.allocate(BUFFER) for _ in range(n)]
    for backup in (False, True):
        pauses, resumes = [], []
        for _ in range(repeat):
            pauses.append(timed(functools.partial(pool.pause, "bench", backup=backup)))
            resumes.append(timed(functools.partial(pool.resume, "bench")))
        suffix = ", backup" if backup else ""
        row(f"`pause`{suffix}", gib, [s for s, _ in pauses], pauses[-1][1])
        row(f"`resume`{suffix}", gib, [s for s, _ in resumes], resumes[-1][1])
    copy_out, copy_in = copies(bufs, repeat)
    row("the backup's copies alone: `cuMemAllocHost` + `cuMemcpyDtoH`", gib, copy_out, {"cuMemAllocHost": 1, "cuMemcpyDtoH": n})
    row("the restore's copies alone: `cuMemcpyHtoD`", gib, copy_in, {"cuMemcpyHtoD": n})
    del bufs
    pool.close()


def given_back(gib: int, n: int, repeat: int) -> None:
    """The baseline: the same memory freed, trimmed and allocated again, at new addresses."""
    pool = DevicePool(0, strategy="best_fit", expandable=True, steady=False)
    bufs = [pool.allocate(BUFFER) for _ in range(n)]

    def give_back() -> None:
        for b in bufs:
            pool.deallocate(b)
        pool.trim()

    def take_again() -> None:
        bufs[:] = [pool.allocate(BUFFER) for _ in range(n)]

    trims, regrows = [], []
    for _ in range(repeat):
        trims.append(timed(give_back))
        regrows.append(timed(take_again))
    row("free + `trim()` (addresses lost)", gib, [s for s, _ in trims], trims[-1][1])
    row("allocate again", gib, [s for s, _ in regrows], regrows[-1][1])
    for b in bufs:
        pool.deallocate(b)
    pool.close()

if __name__ == "__main__":
    main()
