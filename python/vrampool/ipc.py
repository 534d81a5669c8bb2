"""Sharing pool memory with other processes, in cuda.core's convention: the exporting process
hands out its pool's :class:`PoolHandle` and a :class:`BufferDescriptor` per buffer; the importing
process opens the handle as an :class:`ImportedPool` and each descriptor through it as an
:class:`ImportedBuffer`, which it reads and writes but neither allocates from nor frees into.

Only a pool made with ``ipc=True`` (``VRAMPOOL_CONF=ipc:true``) shares: each of its segments is one
physical allocation with a POSIX file-descriptor handle, and a descriptor holds a file descriptor
for the segment under its buffer, with the buffer's offset in it. File descriptors cross processes
over a Unix socket (SCM_RIGHTS): :func:`send_descriptor` / :func:`recv_descriptor` on a socket of
your own, or pickling through :mod:`multiprocessing` (its resource sharer sends them the same way).
Where the device has no virtual-memory management, or with ``ipc_handles="legacy"``, segments are
``cuMemAlloc`` allocations and a descriptor holds their legacy IPC handle (64 bytes,
``cuIpcGetMemHandle``) instead: plain data, which is also what Numba's arrays share
(:mod:`vrampool.numba`).
A :class:`~vrampool.DeviceBuffer` of such a pool pickles into its pool's handle and its descriptor,
and unpickles, in a process started with the ``spawn`` or ``forkserver`` method, as an
ImportedBuffer of that process's :func:`imported_pool` for the handle. A forked child cannot use
CUDA state it inherited, and is refused.

Lifetime rule: **the exporter keeps each shared buffer allocated until every importer has closed
it.** An importer's mapping keeps the physical memory alive whatever the exporter does, but a
freed buffer's bytes go to the pool's next allocation, and the importer would then write into
someone else's block. The exporter refuses to share a freed buffer or one of a closed pool; a
descriptor made before the free cannot be told from a live one on the importer's side.
"""

from __future__ import annotations

import copyreg
import json
import operator
import os
import socket
import struct
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

from vrampool._native import DeviceError, InvalidFreeError, NativeBuffer, NativeImporter, PoolClosedError, forked

__all__ = [
    "BufferDescriptor",
    "ImportedBuffer",
    "ImportedPool",
    "PoolHandle",
    "export_buffer",
    "imported_pool",
    "recv_descriptor",
    "send_descriptor",
]


@dataclass(frozen=True)
class PoolHandle:
    """What names an exporting pool to importers: ``pool_id`` (``"PID:NUMBER"``) and its
    device. Plain data: it pickles anywhere. Fields of the wrong type or form raise
    ``TypeError`` / ``ValueError`` here, not later in the importer."""

    pool_id: str
    device: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "pool_id", _check_pool_id(self.pool_id))
        object.__setattr__(self, "device", _integer("device", self.device))


def _integer(name: str, value: Any) -> int:
    """``value`` as a non-negative int: any integer type (``__index__``) but a bool."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, not a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__} ({value!r})") from None
    if number < 0:
        raise ValueError(f"{name} must be >= 0, got {number}")
    return number


def _check_pool_id(pool_id: Any) -> str:
    if not isinstance(pool_id, str):
        raise TypeError(f"pool_id must be a str like '4242:1' (the exporter's pid and pool number), not {type(pool_id).__name__}")
    pid, _, number = pool_id.partition(":")
    if not (pid.isdecimal() and number.isdecimal()):
        raise ValueError(f"pool_id must be 'PID:NUMBER' (the exporter's pid and pool number), got {pool_id!r}")
    return pool_id


class BufferDescriptor:
    """One buffer of an exporting pool: its pool, the exporter's address of the segment under it
    (``segment``), its ``offset`` in that segment, its ``size`` and the segment's
    (``segment_size``), and the segment's handle: ``fd``, a file descriptor that the descriptor
    owns (``close()``, or collection, closes it), or ``legacy_handle``, the 64 bytes of a legacy
    IPC handle. It pickles through :mod:`multiprocessing`, which passes the file descriptor.

    A descriptor comes from another process: fields of the wrong type (``TypeError``) or out of
    range (``ValueError``) are refused here, and the file descriptor stays the caller's then;
    :meth:`ImportedPool.open` checks the rest against what the driver maps."""

    __slots__ = ("pool_id", "device", "segment", "offset", "size", "segment_size", "legacy_handle", "_fd")

    def __init__(self, pool_id: str, device: int, handle: Union[int, bytes], segment: int, offset: int, size: int, segment_size: int) -> None:
        self._fd: Optional[int] = None  # first: collection of a descriptor refused below closes nothing
        self.legacy_handle: Optional[bytes] = None
        self.pool_id = _check_pool_id(pool_id)
        self.device, self.segment = _integer("device", device), _integer("segment", segment)
        self.offset, self.size, self.segment_size = _integer("offset", offset), _integer("size", size), _integer("segment_size", segment_size)
        if isinstance(handle, bytes):
            if len(handle) != 64:
                raise ValueError(f"a legacy IPC handle is 64 bytes, not {len(handle)}")
            self.legacy_handle = handle
        else:
            self._fd = _integer("the file descriptor", handle)

    @property
    def fd(self) -> int:
        if self.legacy_handle is not None:
            raise ValueError(f"{self!r} holds a legacy IPC handle, not a file descriptor")
        if self._fd is None:
            raise ValueError(f"{self!r} was closed: its file descriptor is gone")
        return self._fd

    @property
    def handle(self) -> PoolHandle:
        return PoolHandle(self.pool_id, self.device)

    def close(self) -> None:
        """Closes the file descriptor (a legacy handle has none); later calls do nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:  # closed behind the descriptor's back: collection has nobody to tell
            pass

    def __reduce__(self) -> Tuple[Any, ...]:
        if self.legacy_handle is not None:
            return (BufferDescriptor, (self.pool_id, self.device, self.legacy_handle) + self._fields()[2:])
        # The resource sharer dups the descriptor now and hands the dup to the one process that
        # asks (over SCM_RIGHTS); a spawning Popen's own passing would need it open until launch.
        from multiprocessing import resource_sharer

        shared = resource_sharer.DupFd(self.fd)
        return (_descriptor_from, (self.pool_id, self.device, shared, self.segment, self.offset, self.size, self.segment_size))

    def _fields(self) -> Tuple[Any, ...]:
        return (self.pool_id, self.device, self.segment, self.offset, self.size, self.segment_size)

    def __repr__(self) -> str:
        state = "legacy IPC handle" if self.legacy_handle is not None else "closed" if self._fd is None else f"fd={self._fd}"
        return f"BufferDescriptor(pool={self.pool_id}, segment={self.segment:#x}, offset={self.offset}, size={self.size}, {state})"


def _descriptor_from(pool_id: str, device: int, shared: Any, segment: int, offset: int, size: int, segment_size: int) -> BufferDescriptor:
    _check_not_forked()
    from multiprocessing import AuthenticationError

    exporter = f"the exporting process (pid {str(pool_id).partition(':')[0]})"
    # The exporter's resource sharer hands the file descriptor out once, to a process it started.
    try:
        fd = shared.detach()
    except EOFError:
        raise RuntimeError(
            f"this pickled buffer was opened already: {exporter} hands its file descriptor out once; pickle the buffer again for each process that opens it"
        ) from None
    except AuthenticationError:
        raise RuntimeError(f"{exporter} refused the file descriptor: only processes it started (spawn, forkserver) may unpickle its buffers") from None
    except OSError as e:
        raise RuntimeError(f"{exporter} is gone ({e}): a pickled buffer opens only while its exporter runs") from None
    try:
        return BufferDescriptor(pool_id, device, fd, segment, offset, size, segment_size)
    except BaseException:
        os.close(fd)
        raise


def _pool_id(number: int) -> str:
    return f"{os.getpid()}:{number}"


#: What a simulated device's pool says when asked to share (its ``export`` says the same).
_SIMULATED = "the device does not support sharing memory with other processes (a simulated device)"


def pool_handle(native_pool: Any) -> PoolHandle:
    """The handle of a native pool (``DevicePool.ipc_handle`` checks the pool first); a
    ``DeviceError`` on the simulated device, which cannot export either."""
    if native_pool.memory_kind != "device":
        raise DeviceError(_SIMULATED)
    return PoolHandle(_pool_id(native_pool.pool_id), native_pool.device)


def export_buffer(buffer: NativeBuffer) -> BufferDescriptor:
    """A descriptor for ``buffer``: refused (with the reason) for a freed buffer, a closed pool,
    a pool made without ``ipc=True``, or a forked process's inherited pool."""
    if not isinstance(buffer, NativeBuffer):
        raise TypeError(f"export_buffer takes a DeviceBuffer, not {type(buffer).__name__}")
    handle, offset, segment_size = buffer.ipc_export()
    return BufferDescriptor(_pool_id(buffer.pool_id), buffer.device, handle, buffer.ptr - offset, offset, buffer.size, segment_size)


def _check_not_forked() -> None:
    if forked():
        raise RuntimeError(
            "this process was forked from one that used vrampool: it cannot use the CUDA state it "
            "inherited, so it cannot open shared buffers; start it with the 'spawn' or 'forkserver' "
            "method (multiprocessing.get_context('spawn'))"
        )


class ImportedBuffer:
    """Another process's buffer, mapped here: ``ptr``, ``size``, ``device``,
    ``__cuda_array_interface__``; ``read`` / ``write`` copy to and from the host. ``close()``
    (or collection, or the context manager) unmaps it; it is never freed (``free()`` raises)."""

    def __init__(self, pool: "ImportedPool", key: Tuple[int, int], ptr: int, size: int) -> None:
        self._pool, self._key, self.ptr, self.size = pool, key, ptr, size
        self.device = pool.handle.device
        self.closed = False

    def _check_open(self, what: str) -> None:
        if self.closed:
            raise ValueError(f"{what} of {self!r}: it was closed")

    def write(self, data: bytes, offset: int = 0) -> None:
        """Copies ``data`` into the buffer at ``offset`` (synchronous)."""
        self._check_open("write")
        if not 0 <= offset <= offset + len(data) <= self.size:
            raise ValueError(f"{len(data)} bytes at offset {offset} do not fit in {self!r}")
        self._pool._native.write(self.ptr + offset, bytes(data))

    def read(self, nbytes: Optional[int] = None, offset: int = 0) -> bytes:
        """``nbytes`` (default: to the end) of the buffer from ``offset`` (synchronous)."""
        self._check_open("read")
        n = self.size - offset if nbytes is None else nbytes
        if not 0 <= offset <= offset + n <= self.size:
            raise ValueError(f"{n} bytes at offset {offset} do not fit in {self!r}")
        return self._pool._native.read(self.ptr + offset, n)

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        self._check_open("__cuda_array_interface__")
        # No stream: the exporter's work on it is ordered by whatever told this process to use it.
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr, False), "strides": None, "version": 3, "stream": None}

    def free(self, stream: Any = None) -> None:
        raise InvalidFreeError(f"{self!r} is another process's buffer: close() it here; its exporter frees it")

    def close(self) -> None:
        """Waits for this device's work and unmaps the buffer (its segment, once no other open
        buffer lies in it); later calls do nothing."""
        if not self.closed:
            self._pool._close_buffer(self._key)
            self.closed = True

    def __enter__(self) -> "ImportedBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - collection has nobody to report to
            pass

    def __reduce__(self) -> Tuple[Any, ...]:
        raise TypeError(f"{self!r} is imported: pass the exporter's buffer (or its descriptor) on instead")

    def __repr__(self) -> str:
        return f"ImportedBuffer(ptr={self.ptr:#x}, size={self.size}, pool={self._pool.handle.pool_id}{', closed' if self.closed else ''})"


class ImportedPool:
    """Another process's pool, as this process maps it (one per :class:`PoolHandle`:
    :func:`imported_pool` keeps them). :meth:`open` maps a descriptor of that pool, each segment
    once however many of its buffers are open; it cannot allocate nor free."""

    def __init__(self, handle: PoolHandle) -> None:
        if not isinstance(handle, PoolHandle):
            raise TypeError(f"ImportedPool takes a PoolHandle, not {type(handle).__name__}")
        _check_not_forked()
        if handle.pool_id.split(":")[0] == str(os.getpid()):
            raise ValueError(f"pool {handle.pool_id} is this process's own: use its buffers, not an import")
        self.handle = handle
        self._native = NativeImporter(handle.device)
        # Reentrant: collection may close a dropped buffer inside `open` on this thread, which
        # counts a segment's buffers before it makes anything collection could run in.
        self._lock = threading.RLock()
        # segment (exporter's address) -> [base here, open buffers in it, bytes mapped]
        self._segments: Dict[int, list] = {}
        # (segment, offset) -> the open buffer; weak, so that dropping a buffer closes it
        self._buffers: "weakref.WeakValueDictionary[Tuple[int, int], ImportedBuffer]" = weakref.WeakValueDictionary()
        self.closed = False

    def open(self, descriptor: BufferDescriptor) -> ImportedBuffer:
        """The buffer ``descriptor`` names, mapped here. A descriptor of another pool or device,
        one already open here, or one whose numbers do not fit its segment or the mapping the
        driver makes of it is a ``ValueError``; the descriptor stays the caller's (close it once
        opened)."""
        if not isinstance(descriptor, BufferDescriptor):
            raise TypeError(f"open takes a BufferDescriptor, not {type(descriptor).__name__}")
        if descriptor.pool_id != self.handle.pool_id:
            raise ValueError(f"{descriptor!r} is from pool {descriptor.pool_id}, not from this one ({self.handle.pool_id})")
        if descriptor.device != self.handle.device:
            raise ValueError(f"{descriptor!r} names device {descriptor.device}, but pool {self.handle.pool_id} is on device {self.handle.device}")
        if not 0 <= descriptor.offset < descriptor.offset + descriptor.size <= descriptor.segment_size:
            raise ValueError(f"{descriptor!r} does not lie inside its {descriptor.segment_size}-byte segment")
        key = (descriptor.segment, descriptor.offset)
        with self._lock:
            if self.closed:
                raise PoolClosedError(f"the imported pool {self.handle.pool_id} is closed")
            existing = self._buffers.get(key)
            if existing is not None:
                raise ValueError(f"{descriptor!r} is already open in this process as {existing!r}; use that one, or close it first")
            segment = self._segments.get(descriptor.segment)
            if segment is None:
                # The mapping's size is the driver's word: the allocation behind a legacy handle,
                # or what the driver agreed to map of an fd's (it refuses more than the allocation).
                if descriptor.legacy_handle is not None:
                    base, mapped = self._native.open_legacy(descriptor.legacy_handle)
                else:
                    base, mapped = self._native.open(descriptor.fd, descriptor.segment_size), descriptor.segment_size
                segment = [base, 0, mapped]
                if descriptor.segment_size > mapped:
                    self._native.close(base)
                    raise ValueError(f"{descriptor!r} claims a {descriptor.segment_size}-byte segment; the driver mapped {mapped} bytes")
                self._segments[descriptor.segment] = segment
            elif descriptor.offset + descriptor.size > segment[2]:
                raise ValueError(f"{descriptor!r} does not lie inside the {segment[2]} bytes mapped of its segment")
            segment[1] += 1
            buffer = self._buffers[key] = ImportedBuffer(self, key, segment[0] + descriptor.offset, descriptor.size)
            return buffer

    def _close_buffer(self, key: Tuple[int, int]) -> None:
        with self._lock:
            segment = self._segments[key[0]]
            if segment[1] == 1:
                # First: a failed unmap raises with everything as it was, so a retry can finish.
                self._native.close(segment[0])
                del self._segments[key[0]]
            else:
                segment[1] -= 1
            # Gone already when collection closes the buffer (its weak entry is cleared first).
            self._buffers.pop(key, None)

    def allocate(self, nbytes: int, stream: Any = None) -> NativeBuffer:
        raise TypeError(f"the imported pool {self.handle.pool_id} maps another process's buffers; allocate in the exporting process")

    def deallocate(self, buffer: Any, stream: Any = None) -> None:
        raise InvalidFreeError(f"{buffer!r}: an imported pool frees nothing; close() imported buffers, and their exporter frees them")

    @property
    def open_buffers(self) -> int:
        return len(self._buffers)

    @property
    def open_segments(self) -> int:
        """Segments mapped here (the device's count of open imports)."""
        return self._native.open_count

    def close(self) -> None:
        """Closes every buffer still open; later opens raise ``PoolClosedError``. Where the
        device fails to unmap one, its error is raised and the pool stays open with what is
        left: call ``close()`` again."""
        with self._lock:
            for buffer in list(self._buffers.values()):
                buffer.close()
            # Left: segments whose last buffer was collected while its unmap failed.
            for address, segment in list(self._segments.items()):
                self._native.close(segment[0])
                del self._segments[address]
            self.closed = True

    def __repr__(self) -> str:
        return f"ImportedPool({self.handle.pool_id}, device={self.handle.device}, open_buffers={self.open_buffers})"


_imported: Dict[str, ImportedPool] = {}
_imported_lock = threading.Lock()


def imported_pool(handle: PoolHandle) -> ImportedPool:
    """This process's import of the pool ``handle`` names, made on first use (what unpickled
    buffers open in)."""
    with _imported_lock:
        pool = _imported.get(handle.pool_id)
        if pool is None or pool.closed:
            pool = _imported[handle.pool_id] = ImportedPool(handle)
        return pool


def open_pickled(handle: PoolHandle, descriptor: BufferDescriptor) -> ImportedBuffer:
    """What an unpickled buffer becomes: ``descriptor`` opened in :func:`imported_pool`, then closed."""
    try:
        return imported_pool(handle).open(descriptor)
    finally:
        descriptor.close()


def _reduce_buffer(buffer: NativeBuffer) -> Tuple[Any, ...]:
    # The descriptor is pickled (its fd dup'd) after this returns, and collected after that.
    descriptor = export_buffer(buffer)
    return (open_pickled, (descriptor.handle, descriptor))


copyreg.pickle(NativeBuffer, _reduce_buffer)

_HEADER = struct.Struct("<I")
#: The most a descriptor's body may announce: its JSON is a few hundred bytes.
_MAX_BODY = 4096


def send_descriptor(sock: socket.socket, descriptor: BufferDescriptor) -> None:
    """Sends ``descriptor`` (its numbers, and its file descriptor by SCM_RIGHTS or its legacy
    handle) over the Unix socket ``sock``; the caller keeps and closes its own copy."""
    legacy = descriptor.legacy_handle
    body = json.dumps(descriptor._fields() + (None if legacy is None else legacy.hex(),)).encode()
    socket.send_fds(sock, [_HEADER.pack(len(body)) + body], [] if legacy is not None else [descriptor.fd])


def recv_descriptor(sock: socket.socket) -> BufferDescriptor:
    """The next descriptor :func:`send_descriptor` sent over ``sock``; the caller owns it.
    Anything else is a ``ValueError`` (or the ``TypeError`` of a field of the wrong type), and
    every file descriptor that came with it is closed."""
    head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, 1)
    try:
        return _read_descriptor(sock, head, fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _read_descriptor(sock: socket.socket, head: bytes, fds: List[int]) -> BufferDescriptor:
    if len(head) != _HEADER.size or len(fds) > 1:
        raise ValueError("the socket did not carry a vrampool buffer descriptor (closed, or another message)")
    (length,) = _HEADER.unpack(head)
    if length > _MAX_BODY:
        raise ValueError(f"the socket's message announces {length} bytes; a vrampool buffer descriptor has at most {_MAX_BODY}")
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            raise ValueError("the socket closed in the middle of a buffer descriptor")
        body += chunk
    # JSON, not pickle: the bytes come from another process.
    try:
        pool_id, device, segment, offset, size, segment_size, legacy = json.loads(body)
    except (ValueError, TypeError) as e:
        raise ValueError(f"the socket's message is not a vrampool buffer descriptor ({e})") from None
    if (legacy is None) != (len(fds) == 1):
        raise ValueError("the socket's buffer descriptor did not come with exactly one handle (a file descriptor or a legacy handle)")
    if legacy is not None and not isinstance(legacy, str):
        raise TypeError(f"the socket's legacy handle must be hex text, not {type(legacy).__name__}")
    handle = fds[0] if legacy is None else bytes.fromhex(legacy)
    return BufferDescriptor(pool_id, device, handle, segment, offset, size, segment_size)
