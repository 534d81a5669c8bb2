"""Sharing N buffers with a spawned process: vrampool's export + open + close (``DevicePool(0,
ipc=True)``, one shareable segment under many buffers; and ``ipc_handles="legacy"``, the segments'
legacy IPC handles) beside the legacy ``cuIpcGetMemHandle`` + ``cuIpcOpenMemHandle`` +
``cuIpcCloseMemHandle`` of one ``cuMemAlloc`` allocation per buffer.
Microseconds per buffer, each side timed in its own process.

Run: ``scripts/emulated-cuda.sh python benches/ipc_open.py [--buffers N] [--size BYTES]``. Under
the emulated driver the figures are the emulator's (memfds and mmap), not a GPU's.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import time
from ctypes import byref, c_int, c_uint, c_uint64, c_void_p
from typing import Any, List

from vrampool import DevicePool
from vrampool.ipc import imported_pool


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def driver() -> ctypes.CDLL:
    """libcuda with device 0's primary context current on this thread."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(IpcHandle), c_uint64]
    lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(c_uint64), IpcHandle, c_uint]
    lib.cuIpcCloseMemHandle.argtypes = [c_uint64]
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(c_uint64), ctypes.c_size_t]
    lib.cuMemFree_v2.argtypes = [c_uint64]
    ctx = c_void_p()
    assert lib.cuInit(0) == 0 and lib.cuDevicePrimaryCtxRetain(byref(ctx), c_int(0)) == 0
    assert lib.cuCtxSetCurrent(ctx) == 0
    return lib


def open_descriptors(handle: Any, descriptors: List[Any], results: Any) -> None:
    pool = imported_pool(handle)
    start = time.perf_counter()
    opened = [pool.open(d) for d in descriptors]
    middle = time.perf_counter()
    for b in opened:
        b.close()
    results.put((middle - start, time.perf_counter() - middle))


def open_legacy(handles: List[bytes], results: Any) -> None:
    lib = driver()
    ptrs = []
    start = time.perf_counter()
    for raw in handles:
        ptr = c_uint64()
        assert lib.cuIpcOpenMemHandle_v2(byref(ptr), IpcHandle.from_buffer_copy(raw), 1) == 0
        ptrs.append(ptr.value)
    middle = time.perf_counter()
    for ptr in ptrs:
        assert lib.cuIpcCloseMemHandle(ptr) == 0
    results.put((middle - start, time.perf_counter() - middle))


def run(target: Any, *args: Any) -> Any:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=target, args=(*args, results))
    child.start()
    out = results.get(timeout=300)
    child.join(60)
    assert child.exitcode == 0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--buffers", type=int, default=200)
    parser.add_argument("--size", type=int, default=64 << 10)
    args = parser.parse_args()
    n, us = args.buffers, 1e6 / args.buffers

    for handles in ("auto", "legacy"):
        with DevicePool(0, ipc=True, ipc_handles=handles) as pool:
            buffers = [pool.allocate(args.size) for _ in range(n)]
            start = time.perf_counter()
            descriptors = [pool.export(b) for b in buffers]
            export = time.perf_counter() - start
            opened, closed = run(open_descriptors, pool.ipc_handle(), descriptors)
            for d in descriptors:
                d.close()
            name = "vrampool" if handles == "auto" else "legacy"
            print(f"{name:9} export {export * us:.1f} us, open {opened * us:.1f} us, close {closed * us:.1f} us per buffer")

    lib = driver()
    ptrs, handles = [], []
    for _ in range(n):
        ptr = c_uint64()
        assert lib.cuMemAlloc_v2(byref(ptr), args.size) == 0
        ptrs.append(ptr.value)
    start = time.perf_counter()
    for ptr in ptrs:
        handle = IpcHandle()
        assert lib.cuIpcGetMemHandle(byref(handle), ptr) == 0
        handles.append(bytes(handle))
    get = time.perf_counter() - start
    opened, closed = run(open_legacy, handles)
    for ptr in ptrs:
        assert lib.cuMemFree_v2(ptr) == 0
    print(f"cuIpc:    get {get * us:.1f} us, open {opened * us:.1f} us, close {closed * us:.1f} us per buffer")
    print(f"({n} buffers of {args.size} B; one process each side; emulated driver figures if run under it)")


if __name__ == "__main__":
    main()
