"""What the processes tests/test_ipc.py starts run: importable by name (a spawned child imports
its target's module), and free of pytest's module-level skips."""

from __future__ import annotations

import os
import pickle
import socket
from typing import Any, List

import vrampool
from vrampool.ipc import ImportedPool, imported_pool, recv_descriptor


def pattern(tag: int, size: int) -> bytes:
    """``size`` bytes that differ from buffer to buffer (by ``tag``) and along each buffer."""
    block = bytes((tag * 7 + i) % 251 for i in range(251))
    return (block * (size // 251 + 1))[:size]


def write_all(buffers: List[Any], tags: List[int], results: Any) -> None:
    """Writes each unpickled buffer's pattern, closes them all, and reports what stayed open."""
    try:
        for buffer, tag in zip(buffers, tags):
            assert isinstance(buffer, vrampool.ipc.ImportedBuffer), type(buffer)
            buffer.write(pattern(tag, buffer.size))
            assert buffer.read(16) == pattern(tag, 16)
        pool = buffers[0]._pool
        segments = pool.open_segments
        for buffer in buffers:
            buffer.close()
        results.put(("ok", os.getpid(), segments, pool.open_buffers, pool.open_segments))
    except BaseException as e:  # noqa: BLE001 - the parent asserts on the report
        results.put(("error", repr(e)))


def read_from_socket(sock: socket.socket, handle: Any, count: int, results: Any) -> None:
    """Receives ``count`` descriptors over ``sock``, writes each buffer's pattern, closes."""
    try:
        pool = ImportedPool(handle)
        for tag in range(count):
            descriptor = recv_descriptor(sock)
            with pool.open(descriptor) as buffer:
                buffer.write(pattern(tag, buffer.size))
            descriptor.close()
        results.put(("ok", pool.open_segments))
    except BaseException as e:  # noqa: BLE001
        results.put(("error", repr(e)))


def bad_inputs(handle: Any, mine: Any, other: Any, stale: Any, results: Any) -> None:
    """Each importer-side mistake, as the exception it raises (type name and message); ``stale``
    names a legacy segment freed before the child opens it (None for file descriptors, whose
    import keeps the memory: the lifetime rule)."""
    seen = {}

    def attempt(name: str, call: Any) -> None:
        try:
            call()
            seen[name] = ("no error", "")
        except Exception as e:  # noqa: BLE001
            seen[name] = (type(e).__name__, str(e))

    pool = ImportedPool(handle)
    attempt("other pool", lambda: pool.open(other))
    buffer = pool.open(mine)
    attempt("open twice", lambda: pool.open(mine))
    attempt("free", lambda: buffer.free())
    attempt("deallocate", lambda: pool.deallocate(buffer))
    attempt("allocate", lambda: pool.allocate(64))
    attempt("pickle imported", lambda: pickle.dumps(buffer))
    attempt("past the end", lambda: buffer.write(b"x" * (buffer.size + 1)))
    buffer.close()
    attempt("read closed", lambda: buffer.read())
    if mine.legacy_handle is None:
        with open(os.devnull, "rb") as null:
            bogus = vrampool.ipc.BufferDescriptor(handle.pool_id, handle.device, os.dup(null.fileno()), 0, 0, 64, mine.segment_size)
        attempt("not an export", lambda: pool.open(bogus))
        bogus.close()
        attempt("closed descriptor", lambda: pool.open(bogus))
    else:
        bogus = vrampool.ipc.BufferDescriptor(handle.pool_id, handle.device, bytes(64), 0, 0, 64, mine.segment_size)
        attempt("not an export", lambda: pool.open(bogus))
        attempt("stale", lambda: pool.open(stale))
    seen["open after all"] = (str(pool.open_buffers), str(pool.open_segments))
    results.put(seen)


def after_fork(handle: Any, results: Any) -> None:
    """A forked child (its parent made a pool) trying to import."""
    try:
        imported_pool(handle)
        results.put("no error")
    except RuntimeError as e:
        results.put(str(e))


def write_wait_read(buffer: Any, ready: Any, go: Any, results: Any) -> None:
    """Writes, lets the parent free and trim the buffer, then reads what it wrote."""
    buffer.write(b"still here")
    ready.set()
    go.wait(120)
    results.put("kept" if buffer.read(10) == b"still here" else "lost")
    buffer.close()


def legacy_open(handles: List[bytes], results: Any) -> None:
    """``cuIpcOpenMemHandle`` of each handle: (code, first 8 bytes or None), then closed."""
    import ctypes

    class Handle(ctypes.Structure):  # a struct, so that ctypes passes it by value
        _fields_ = [("reserved", ctypes.c_ubyte * 64)]

    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), Handle, ctypes.c_uint]
    lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    lib.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
    ctx = ctypes.c_void_p()
    assert lib.cuInit(0) == 0 and lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and lib.cuCtxSetCurrent(ctx) == 0
    seen = []
    for raw in handles:
        ptr = ctypes.c_uint64()
        code = lib.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), Handle.from_buffer_copy(raw), 1)
        if code != 0:
            seen.append((code, None))
            continue
        again = lib.cuIpcOpenMemHandle_v2(ctypes.byref(ctypes.c_uint64()), Handle.from_buffer_copy(raw), 1)
        out = ctypes.create_string_buffer(8)
        assert lib.cuMemcpyDtoH_v2(out, ptr.value, 8) == 0
        assert lib.cuIpcCloseMemHandle(ptr.value) == 0
        seen.append((again, out.raw))
    results.put(seen)



def export_without_vmm(results: Any, done: Any) -> None:
    """An exporter on a device without virtual-memory management (started with
    EMULATED_CUDA_VMM=0): an ``ipc=True`` pool's buffer, written, then sent pickled (plain data:
    a legacy handle); freed once the parent is done with it."""
    import ctypes

    from vrampool.ipc import export_buffer

    try:
        pool = vrampool.DevicePool(0, ipc=True)
        buffer = pool.allocate(3000)
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
        assert lib.cuMemcpyHtoD_v2(buffer.ptr, pattern(9, 3000), 3000) == 0
        results.put((export_buffer(buffer).legacy_handle is not None, pickle.dumps(buffer)))
        done.wait(120)
        pool.deallocate(buffer)
        results.put(pool.close())
    except BaseException as e:  # noqa: BLE001
        results.put(("error", repr(e)))


def cuda_core_buffers(buffers: List[Any], tags: List[int], results: Any) -> None:
    """Unpickled cuda.core buffers of a PoolMemoryResource: each read (its tag's pattern), then
    written with the next tag's, then closed; reports what stayed open."""
    import gc

    from cuda.core import Buffer

    try:
        pool = buffers[0].owner._pool
        for buffer, tag in zip(buffers, tags):
            assert type(buffer) is Buffer and buffer.size == buffer.owner.size, (type(buffer), buffer.size)
            assert buffer.owner.read() == pattern(tag, buffer.size), f"buffer {tag}"
            buffer.owner.write(pattern(tag + 1, buffer.size))
            buffer.close()
        del buffer, buffers
        gc.collect()
        results.put(("ok", pool.open_buffers, pool.open_segments))
    except BaseException as e:  # noqa: BLE001
        results.put(("error", repr(e)))
