"""Sharing pool memory across processes (vrampool.ipc, issue 50) under the emulated CUDA driver
(scripts/emulated-cuda.sh), whose shareable handles are memfds that another process maps: the
children really are other processes writing the parent's memory. Host memory, not a GPU.

Skipped where the loaded libcuda is not the emulated driver (a failure instead with
VRAMPOOL_REQUIRE_EMULATED=1)."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import pickle
import socket
from ctypes import byref, c_int, c_size_t, c_uint, c_uint64, c_void_p
from typing import Any, Iterator

import pytest

from _ipc_child import (
    after_fork,
    bad_inputs,
    cuda_core_buffers,
    export_without_vmm,
    legacy_open,
    pattern,
    read_from_socket,
    write_all,
    write_wait_read,
)
from vrampool import DeviceError, DevicePool, InvalidFreeError, PoolClosedError
from vrampool.ipc import ImportedPool, export_buffer, send_descriptor

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


def run(target: Any, *args: Any, context: Any = SPAWN) -> Any:
    """Runs ``target(*args, results)`` in a new process; what it reported."""
    results = context.Queue()
    child = context.Process(target=target, args=(*args, results))
    child.start()
    report = results.get(timeout=120)
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
    assert run(cuda_core_buffers, buffers, list(range(len(buffers)))) == ("ok", 0, 0)
    for tag, buffer in enumerate(buffers):
        assert read_device(int(buffer.handle), buffer.size) == pattern(tag + 1, buffer.size), f"buffer {tag}"
    closed = buffers.pop()
    closed.close()
    with pytest.raises(RuntimeError, match="closed"):  # cuda.core's own answer: the resource is gone
        pickle.dumps(closed)
    for buffer in buffers:
        buffer.close()
    assert mr.live_blocks == 0 and mr.pool.close() == []
