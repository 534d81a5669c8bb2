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
    """Unpickled cuda.core buffers of a PoolMemoryResource: one pickled again (refused: it is
    imported), each read (its tag's pattern), then written with the next tag's, then closed;
    reports the refusal's type and what stayed open."""
    import gc

    from cuda.core import Buffer

    try:
        pool = buffers[0].owner._pool
        try:
            pickle.dumps(buffers[0])
            again = "no error"
        except Exception as e:  # noqa: BLE001
            again = type(e).__name__
        for buffer, tag in zip(buffers, tags):
            assert type(buffer) is Buffer and buffer.size == buffer.owner.size, (type(buffer), buffer.size)
            assert buffer.owner.read() == pattern(tag, buffer.size), f"buffer {tag}"
            buffer.owner.write(pattern(tag + 1, buffer.size))
            buffer.close()
        del buffer, buffers
        gc.collect()
        results.put(("ok", again, pool.open_buffers, pool.open_segments))
    except BaseException as e:  # noqa: BLE001
        results.put(("error", repr(e)))


def _emulator() -> Any:
    """The emulated driver, with its fault plan's entry point typed."""
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    lib.emucuda_fail.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint]
    return lib


def close_with_a_fault(buffers: List[Any], fault: str, results: Any) -> None:
    """Two unpickled buffers, each in a segment of its own: closes the first, then the pool (with
    the second still open), each first with the driver's ``fault`` call failing once and then
    again; reports each step's outcome (exception type name or "ok") with what stayed open."""
    lib = _emulator()
    unknown = 999  # CUDA_ERROR_UNKNOWN
    first, second = buffers
    pool = first._pool
    seen: dict = {"opened": (pool.open_buffers, pool.open_segments)}

    def attempt(name: str, call: Any, closed: Any) -> None:
        try:
            call()
            outcome = "ok"
        except Exception as e:  # noqa: BLE001
            outcome = type(e).__name__
        seen[name] = (outcome, closed.closed, pool.open_buffers, pool.open_segments)

    assert lib.emucuda_fail(fault.encode(), 1, unknown) == 0
    attempt("buffer, failing", first.close, first)
    attempt("buffer, again", first.close, first)
    assert lib.emucuda_fail(fault.encode(), 1, unknown) == 0
    attempt("pool, failing", pool.close, pool)
    seen["second closed"] = second.closed
    attempt("pool, again", pool.close, pool)
    seen["second closed at last"] = second.closed
    results.put(seen)


def forged_descriptors(real: Any, results: Any) -> None:
    """Opens copies of the descriptor ``real`` with one field forged, each as the exception it
    raised (type name, message) or "opened" with where its pointer lies against the mapping;
    then ``real`` itself, and what stayed open."""
    pool = imported_pool(real.handle)
    fields = dict(pool_id=real.pool_id, device=real.device, segment=real.segment, offset=real.offset, size=real.size)
    seen = {}

    def attempt(name: str, **forged: Any) -> None:
        handle = real.legacy_handle if real.legacy_handle is not None else os.dup(real.fd)
        args = {**fields, "segment_size": real.segment_size, **forged}
        descriptor = None
        try:
            descriptor = vrampool.ipc.BufferDescriptor(handle=handle, **args)
            buffer = pool.open(descriptor)
            seen[name] = ("opened", type(buffer.ptr).__name__, buffer.ptr - pool._segments[real.segment][0] < real.segment_size)
            buffer.close()
        except Exception as e:  # noqa: BLE001
            seen[name] = (type(e).__name__, str(e))
        if descriptor is not None:
            descriptor.close()
        elif isinstance(handle, int):
            os.close(handle)  # refused when made: the file descriptor stayed ours

    big = 512 * real.segment_size
    attempt("segment size x512", segment_size=big, offset=big - 4096, size=4096)
    attempt("float offset", offset=real.offset + 1.5)
    attempt("device 7", device=7)
    attempt("bool size", size=True)
    seen["after forgeries"] = (pool.open_buffers, pool.open_segments)
    with pool.open(real) as buffer:
        seen["real"] = buffer.read(5)
    seen["at last"] = (pool.open_buffers, pool.open_segments)
    results.put(seen)


def load_twice(pickled: bytes, results: Any) -> None:
    """Unpickles ``pickled`` (a buffer), closes it, and unpickles the same bytes again: the
    first outcome and the second's (exception type name, message)."""
    seen = []
    for _ in range(2):
        try:
            pickle.loads(pickled).close()
            seen.append(("ok", ""))
        except Exception as e:  # noqa: BLE001
            seen.append((type(e).__name__, str(e)))
    results.put(seen)


def pickle_and_exit(results: Any) -> None:
    """An exporter that pickles one buffer of its pool, hands the bytes over and exits."""
    pool = vrampool.DevicePool(0, ipc=True)
    buffer = pool.allocate(4096)
    results.put(pickle.dumps(buffer))
