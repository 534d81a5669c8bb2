"""Sharing pool memory across processes (vrampool.ipc, issue 50) under the emulated CUDA driver
(scripts/emulated-cuda.sh), whose shareable handles are memfds that another process maps: the
children really are other processes writing the parent's memory. Host memory, not a GPU.

Skipped where the loaded libcuda is not the emulated driver (a failure instead with
VRAMPOOL_REQUIRE_EMULATED=1)."""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import pickle
import queue
import socket
import struct
import sys
import tracemalloc
from ctypes import byref, c_int, c_size_t, c_uint, c_uint64, c_void_p
from typing import Any, Iterator

import pytest

from _ipc_child import (
    after_fork,
    bad_inputs,
    close_with_a_fault,
    cuda_core_buffers,
    export_without_vmm,
    forged_descriptors,
    legacy_open,
    load_twice,
    pattern,
    pickle_and_exit,
    read_from_socket,
    write_all,
    write_wait_read,
)
from vrampool import DeviceError, DevicePool, InvalidFreeError, PoolClosedError
from vrampool.ipc import BufferDescriptor, ImportedPool, PoolHandle, export_buffer, recv_descriptor, send_descriptor

MIB = 1 << 20


def _driver() -> ctypes.CDLL:
    why = None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        if not hasattr(lib, "emucuda_is_emulated"):
            why = "the loaded libcuda is not the emulated driver"
    except OSError as e:
        why = f"no libcuda: {e}"
    if why is None:
        return lib
    if os.environ.get("VRAMPOOL_REQUIRE_EMULATED") == "1":
        raise RuntimeError(f"VRAMPOOL_REQUIRE_EMULATED=1 but {why}; run under scripts/emulated-cuda.sh")
    pytest.skip(f"{why}; run under scripts/emulated-cuda.sh", allow_module_level=True)
    raise AssertionError("unreachable")


LIB = _driver()
LIB.cuMemcpyDtoH_v2.argtypes = [c_void_p, c_uint64, c_size_t]
LIB.cuMemcpyDtoH_v2.restype = c_uint
for _name, _args in [
    ("cuMemAlloc_v2", [ctypes.POINTER(c_uint64), c_size_t]),
    ("cuMemFree_v2", [c_uint64]),
    ("cuMemcpyHtoD_v2", [c_uint64, c_void_p, c_size_t]),
    ("cuIpcGetMemHandle", [ctypes.c_ubyte * 64, c_uint64]),
]:
    getattr(LIB, _name).argtypes = _args
SPAWN = multiprocessing.get_context("spawn")


def read_device(ptr: int, size: int) -> bytes:
    """The device bytes at ``ptr``, through the driver (device 0's primary context)."""
    ctx = c_void_p()
    assert LIB.cuInit(0) == 0 and LIB.cuDevicePrimaryCtxRetain(byref(ctx), c_int(0)) == 0
    assert LIB.cuCtxSetCurrent(ctx) == 0
    out = ctypes.create_string_buffer(size)
    assert LIB.cuMemcpyDtoH_v2(out, ptr, size) == 0
    assert LIB.cuDevicePrimaryCtxRelease_v2(c_int(0)) == 0
    return out.raw


def current_context() -> None:
    ctx = c_void_p()
    assert LIB.cuInit(0) == 0 and LIB.cuDevicePrimaryCtxRetain(byref(ctx), c_int(0)) == 0
    assert LIB.cuCtxSetCurrent(ctx) == 0


@pytest.fixture
def pool() -> Iterator[DevicePool]:
    with DevicePool(0, ipc=True) as p:
        yield p


def run(target: Any, *args: Any, context: Any = SPAWN, timeout: float = 120) -> Any:
    """Runs ``target(*args, results)`` in a new process; what it reported. A child that reports
    nothing within ``timeout`` seconds is killed, and the test fails: no case may hang."""
    results = context.Queue()
    child = context.Process(target=target, args=(*args, results))
    child.start()
    try:
        report = results.get(timeout=timeout)
    except queue.Empty:
        child.kill()
        child.join(10)
        pytest.fail(f"{target.__name__} reported nothing within {timeout} s: it hangs")
    child.join(60)
    assert child.exitcode == 0, f"the child ended with {child.exitcode} (a race or an illegal address ends it in strict mode)"
    return report


@pytest.mark.parametrize("children, handles", [(2, "auto"), (4, "auto"), (2, "legacy")])
def test_children_write_100_buffers_of_one_pool_and_nothing_leaks(children: int, handles: str) -> None:
    pool = DevicePool(0, ipc=True, ipc_handles=handles)
    free_before = pool.mem_info()[0]
    # Small, middle and large tiers: sizes from 512 B to 2.5 MiB, one pool.
    sizes = [512 + 997 * i if i % 10 else 5 * MIB // 2 for i in range(100)]
    buffers = [pool.allocate(size) for size in sizes]
    tags = list(range(len(buffers)))
    results = SPAWN.Queue()
    procs = []
    for c in range(children):
        mine = slice(c, None, children)
        procs.append(SPAWN.Process(target=write_all, args=(buffers[mine], tags[mine], results)))
    for p in procs:
        p.start()
    reports = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert all(r[0] == "ok" for r in reports), reports
    assert len({r[1] for r in reports}) == children, "each child its own process"
    assert all(r[2] >= 1 and r[3:] == (0, 0) for r in reports), f"each child closed what it mapped: {reports}"
    for buffer, tag in zip(buffers, tags):
        assert read_device(buffer.ptr, buffer.size) == pattern(tag, buffer.size), f"buffer {tag}"
    for buffer in buffers:
        pool.deallocate(buffer)
    pool.trim()
    assert pool.mem_info()[0] == free_before, "every segment went back"
    assert pool.close() == []


@pytest.mark.parametrize("handles", ["auto", "legacy"])
def test_descriptors_pass_over_a_unix_socket(handles: str) -> None:
    pool = DevicePool(0, ipc=True, ipc_handles=handles)
    buffers = [pool.allocate(4096 * (i + 1)) for i in range(3)]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    results = SPAWN.Queue()
    child = SPAWN.Process(target=read_from_socket, args=(theirs, pool.ipc_handle(), len(buffers), results))
    child.start()
    for buffer in buffers:
        descriptor = pool.export(buffer)
        send_descriptor(ours, descriptor)
        descriptor.close()
    assert results.get(timeout=120) == ("ok", 0)
    child.join(60)
    assert child.exitcode == 0
    for tag, buffer in enumerate(buffers):
        assert read_device(buffer.ptr, buffer.size) == pattern(tag, buffer.size)
    pool.close()


def test_a_device_without_virtual_memory_shares_by_legacy_handle() -> None:
    """Where the driver has no VMM, an ``ipc=True`` pool's plain segments are shared through
    cuIpcGetMemHandle: the exporter here is a child started with EMULATED_CUDA_VMM=0."""
    results, done = SPAWN.Queue(), SPAWN.Event()
    os.environ["EMULATED_CUDA_VMM"] = "0"
    try:
        child = SPAWN.Process(target=export_without_vmm, args=(results, done))
        child.start()
    finally:
        del os.environ["EMULATED_CUDA_VMM"]
    legacy, pickled = results.get(timeout=120)
    assert legacy, "a legacy IPC handle, not a file descriptor"
    buffer = pickle.loads(pickled)
    assert buffer.read() == pattern(9, 3000)
    buffer.close()
    done.set()
    assert results.get(timeout=120) == [], "the exporter's pool closed with nothing live"
    child.join(60)
    assert child.exitcode == 0


def test_the_exporter_refuses_what_it_cannot_share(pool: DevicePool) -> None:
    with DevicePool(0) as plain:
        buffer = plain.allocate(100)
        for call in (lambda: plain.export(buffer), lambda: pickle.dumps(buffer), plain.ipc_handle):
            with pytest.raises(ValueError, match="without ipc=True"):
                call()
    freed = pool.allocate(100)
    freed.free()
    with pytest.raises(InvalidFreeError, match="was freed"):
        pool.export(freed)
    with pytest.raises(InvalidFreeError, match="freed buffer cannot be shared"):
        pickle.dumps(freed)
    with pytest.raises(ValueError, match="this process's own"):
        ImportedPool(pool.ipc_handle())
    live = pool.allocate(100)
    pool.close()
    with pytest.raises(PoolClosedError):
        pool.export(live)
    with pytest.raises(PoolClosedError):
        export_buffer(live)
    with pytest.raises(PoolClosedError):
        pool.ipc_handle()


@pytest.mark.parametrize("handles", ["auto", "legacy"])
def test_importer_mistakes_are_clear_errors_and_leave_nothing_open(handles: str) -> None:
    pool = DevicePool(0, ipc=True, ipc_handles=handles)
    with DevicePool(0, ipc=True, ipc_handles=handles) as other_pool:
        buffer, foreign, freed = pool.allocate(4096), other_pool.allocate(4096), pool.allocate(64 * MIB)
        stale = pool.export(freed)
        freed.free()
        pool.trim()
        seen = run(bad_inputs, pool.ipc_handle(), pool.export(buffer), other_pool.export(foreign), stale)
    assert seen["other pool"][0] == "ValueError" and "not from this one" in seen["other pool"][1], seen
    assert seen["open twice"][0] == "ValueError" and "already open" in seen["open twice"][1], seen
    assert seen["free"][0] == "InvalidFreeError" and "its exporter frees it" in seen["free"][1], seen
    assert seen["deallocate"][0] == "InvalidFreeError", seen
    assert seen["allocate"][0] == "TypeError" and "allocate in the exporting process" in seen["allocate"][1], seen
    assert seen["pickle imported"][0] == "TypeError", seen
    assert seen["past the end"][0] == "ValueError", seen
    assert seen["read closed"][0] == "ValueError" and "closed" in seen["read closed"][1], seen
    assert seen["not an export"][0] == DeviceError.__name__ and "CUDA_ERROR_INVALID_VALUE" in seen["not an export"][1], seen
    if handles == "legacy":
        assert seen["stale"][0] == DeviceError.__name__ and "CUDA_ERROR_INVALID_VALUE" in seen["stale"][1], seen
    else:
        assert seen["closed descriptor"][0] == "ValueError", seen
    assert seen["open after all"] == ("0", "0"), seen
    pool.close()


def test_a_forked_child_is_refused(pool: DevicePool) -> None:
    message = run(after_fork, pool.ipc_handle(), context=multiprocessing.get_context("fork"))
    assert "forked" in message and "'spawn'" in message, message


def test_an_imported_buffer_keeps_its_memory_after_the_exporter_frees_it(pool: DevicePool) -> None:
    """The lifetime rule's other half: the driver keeps the memory for the importer (no fault),
    so what the rule protects is the pool's reuse of the bytes, which the exporter controls."""
    buffer = pool.allocate(3 * MIB)
    ready, go, results = SPAWN.Event(), SPAWN.Event(), SPAWN.Queue()
    child = SPAWN.Process(target=write_wait_read, args=(buffer, ready, go, results))
    child.start()
    assert ready.wait(120)
    buffer.free()
    pool.trim()
    go.set()
    assert results.get(timeout=120) == "kept"
    child.join(60)
    assert child.exitcode == 0



def test_legacy_ipc_handles_open_in_another_process_and_a_freed_one_is_refused() -> None:
    """The emulated driver's cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle of
    plain cuMemAlloc memory (what the benchmark compares vrampool.ipc with)."""
    current_context()
    live, freed = c_uint64(), c_uint64()
    for ptr in (live, freed):
        assert LIB.cuMemAlloc_v2(byref(ptr), 3000) == 0
    assert LIB.cuMemcpyHtoD_v2(live.value, b"legacy!!", 8) == 0
    handles = []
    for ptr in (live, freed):
        raw = (ctypes.c_ubyte * 64)()
        assert LIB.cuIpcGetMemHandle(raw, ptr.value) == 0
        handles.append(bytes(raw))
    assert LIB.cuMemFree_v2(freed.value) == 0
    garbage = bytes(64)
    seen = run(legacy_open, [handles[0], handles[1], garbage])
    already_mapped, invalid_value = 208, 1
    assert seen == [(already_mapped, b"legacy!!"), (invalid_value, None), (invalid_value, None)]
    assert LIB.cuMemFree_v2(live.value) == 0


@pytest.mark.parametrize("handles", ["auto", "legacy"])
def test_cuda_core_buffers_of_a_pool_resource_pickle_to_a_child(handles: str) -> None:
    pytest.importorskip("cuda.core")
    from vrampool.cuda_core import PoolMemoryResource

    current_context()
    mr = PoolMemoryResource(DevicePool(0, ipc=True, ipc_handles=handles))
    buffers = [mr.allocate(n) for n in (700, 64 * 1024, 3 * MIB)]
    for tag, buffer in enumerate(buffers):
        data = pattern(tag, buffer.size)
        assert LIB.cuMemcpyHtoD_v2(int(buffer.handle), data, len(data)) == 0
    assert run(cuda_core_buffers, buffers, list(range(len(buffers)))) == ("ok", "TypeError", 0, 0)
    for tag, buffer in enumerate(buffers):
        assert read_device(int(buffer.handle), buffer.size) == pattern(tag + 1, buffer.size), f"buffer {tag}"
    closed = buffers.pop()
    closed.close()
    with pytest.raises(RuntimeError, match="closed"):  # cuda.core's own answer: the resource is gone
        pickle.dumps(closed)
    for buffer in buffers:
        buffer.close()
    assert mr.live_blocks == 0 and mr.pool.close() == []


@pytest.mark.parametrize(
    "handles, fault",
    [
        ("legacy", "cuIpcCloseMemHandle"),
        ("legacy", "cuCtxSynchronize"),
        ("auto", "cuCtxSynchronize"),
        ("auto", "cuMemUnmap"),
        ("auto", "cuMemAddressFree"),
    ],
)
def test_a_failed_close_of_an_import_leaves_it_open_and_a_retry_finishes(handles: str, fault: str) -> None:
    """Issue 57, classes 1 and 2: a close whose driver call fails raises DeviceError (a legacy
    one used to hang for good on its own lock) and changes nothing, so that closing again, the
    buffer or the whole imported pool, finishes the job."""
    with DevicePool(0, ipc=True, ipc_handles=handles) as pool:
        buffers = [pool.allocate(20 * MIB) for _ in range(2)]  # large enough for a segment each
        seen = run(close_with_a_fault, buffers, fault, timeout=60)
    assert seen["opened"] == (2, 2), seen
    # (outcome, closed, open buffers, open segments)
    assert seen["buffer, failing"] == ("DeviceError", False, 2, 2), seen
    assert seen["buffer, again"] == ("ok", True, 1, 1), seen
    assert seen["pool, failing"] == ("DeviceError", False, 1, 1) and not seen["second closed"], seen
    assert seen["pool, again"] == ("ok", True, 0, 0) and seen["second closed at last"], seen


@pytest.mark.parametrize("handles", ["auto", "legacy"])
def test_forged_descriptors_are_refused_against_what_the_driver_maps(handles: str) -> None:
    """Issue 57, class 3: a descriptor comes from another process; a segment larger than the
    allocation, a float offset, another device or a bool size is a clear error, never a pointer
    outside the mapping."""
    with DevicePool(0, ipc=True, ipc_handles=handles) as pool:
        buffer = pool.allocate(4096)
        descriptor = pool.export(buffer)
        current_context()
        assert LIB.cuMemcpyHtoD_v2(buffer.ptr, b"real!", 5) == 0
        seen = run(forged_descriptors, descriptor, timeout=60)
        descriptor.close()
    too_big = seen["segment size x512"]
    if handles == "legacy":
        assert too_big[0] == "ValueError" and "the driver mapped" in too_big[1], seen
    else:  # the driver refuses to map more than the exported allocation
        assert too_big[0] == DeviceError.__name__ and "CUDA_ERROR_INVALID_VALUE" in too_big[1], seen
    assert seen["float offset"][0] == "TypeError" and "offset must be an integer" in seen["float offset"][1], seen
    assert seen["device 7"][0] == "ValueError" and "device 7" in seen["device 7"][1], seen
    assert seen["bool size"][0] == "TypeError", seen
    assert seen["after forgeries"] == (0, 0), seen
    assert seen["real"] == b"real!" and seen["at last"] == (0, 0), seen


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _framed(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


@pytest.mark.parametrize(
    "message, error",
    [
        (struct.pack("<I", 0xFFFFFFFF) + b"[", "announces 4294967295 bytes"),
        (_framed(b"not json"), "not a vrampool buffer descriptor"),
        (_framed(b"{}"), "not a vrampool buffer descriptor"),
        (_framed(b'["1:1", 0, 4096, 1.5, 64, 2097152, null]'), "offset must be an integer"),
        (_framed(b'["1:1", 0, 4096, 0, 64, 2097152, "00"]'), "exactly one handle"),
    ],
    ids=["4 GiB header", "not JSON", "not a list", "float offset", "two handles"],
)
def test_recv_descriptor_bounds_the_body_and_closes_what_it_received(message: bytes, error: str) -> None:
    """Issue 57, class 4: whatever arrives, the file descriptor that came with it is closed, and a
    header announcing 4 GiB allocates nothing of the sort (nor waits for them)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.settimeout(5)
    with ours, theirs, open(os.devnull, "rb") as null:
        before = _open_fds()
        socket.send_fds(ours, [message], [null.fileno()])
        tracemalloc.start()
        try:
            with pytest.raises((ValueError, TypeError), match=error):
                recv_descriptor(theirs)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, f"{peak} bytes allocated"
        assert _open_fds() == before, "the received file descriptor was closed"


def test_pickled_buffers_that_cannot_open_say_why(pool: DevicePool) -> None:
    """Issue 57, class 5: the bytes of a pickled buffer opened a second time, and those of an
    exporter that has exited, are errors that say so (they were a bare EOFError and a bare
    FileNotFoundError)."""
    buffer = pool.allocate(4096)
    first, second = run(load_twice, pickle.dumps(buffer), timeout=60)
    assert first == ("ok", ""), first
    assert second[0] == "RuntimeError" and "opened already" in second[1] and "once" in second[1], second
    pickled = run(pickle_and_exit, timeout=60)
    with pytest.raises(RuntimeError, match=r"the exporting process \(pid \d+\) is gone"):
        pickle.loads(pickled)


def test_plain_mistakes_are_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 57, class 5: a pool handle or descriptor of the wrong types is refused when made
    (not later with an AttributeError, nor with "Exception ignored" when collected), and a
    simulated device's pool refuses ipc_handle() as it refuses export()."""
    with pytest.raises(TypeError, match="pool_id must be a str"):
        PoolHandle(12, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="PID:NUMBER"):
        PoolHandle("pool", 0)
    with pytest.raises(TypeError, match="device must be an integer"):
        PoolHandle("1:1", "0")  # type: ignore[arg-type]
    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(ValueError, match="file descriptor must be >= 0"):
        BufferDescriptor("1:1", 0, -1, 0, 0, 10, 100)
    with pytest.raises(ValueError, match="64 bytes"):
        BufferDescriptor("1:1", 0, b"short", 0, 0, 10, 100)
    gc.collect()
    assert unraisable == [], "nothing printed at collection"
    sim = DevicePool("sim", ipc=True)
    buffer = sim.allocate(100)
    for call in (sim.ipc_handle, lambda: sim.export(buffer), lambda: pickle.dumps(buffer)):
        with pytest.raises(DeviceError, match="a simulated device"):
            call()
    sim.close()
