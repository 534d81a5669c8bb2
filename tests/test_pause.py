"""Tagged regions, paused and resumed, on the simulated device (host memory: the pointers can be
written): every address kept, bytes back with a backup, other memory untouched, clear errors for
what cannot pause, and the same through `vrampool.torch`'s C ABI pools. The emulated driver's
tests (test_pause_emulated.py) check the memory really leaves the device and every fault."""

from __future__ import annotations

import ctypes
from typing import Callable, Iterator, List, Tuple

import pytest

import vrampool
import vrampool.torch as vt
from vrampool import DeviceBuffer, DevicePool, _native

MIB = 1 << 20
SIZES = (512, 4096, 100_000, 3 * MIB, 9 * MIB + 7)


Buffers = List[Tuple[DeviceBuffer, bytes]]


def host_write(ptr: int, data: bytes) -> None:
    ctypes.memmove(ptr, data, len(data))


def fill(pool: DevicePool, n: int, seed: int, write: Callable[[int, bytes], None] = host_write) -> Buffers:
    """`n` buffers of `SIZES` in turn, each filled by `write` with a byte of its own from `seed` on."""
    out = []
    for i in range(n):
        buf = pool.allocate(SIZES[i % len(SIZES)])
        data = bytes([(seed + i) % 256]) * buf.size
        write(buf.ptr, data)
        out.append((buf, data))
    return out


def intact(buffers: Buffers, read: Callable[[int, int], bytes] = ctypes.string_at) -> bool:
    return all(read(buf.ptr, buf.size) == data for buf, data in buffers)


@pytest.fixture
def sim() -> Iterator[DevicePool]:
    pool = DevicePool("sim", capacity=2 << 30)
    yield pool
    pool.close()


def test_a_pause_gives_the_memory_back_and_a_resume_brings_every_byte_back_at_the_same_address(sim: DevicePool) -> None:
    plain = fill(sim, 5, 1)
    with sim.region("kv"):
        kv = fill(sim, 10, 40)
    with sim.region("weights"):
        weights = fill(sim, 5, 90)
    (kv_info,) = [t for t in sim.tags() if t.name == "kv"]
    free_before = sim.mem_info()[0]
    report = sim.pause("kv", backup=True)
    assert report.released == kv_info.reserved and report.backed_up >= sum(b.size for b, _ in kv)
    assert sim.mem_info()[0] - free_before >= kv_info.reserved * 99 // 100
    assert [t.paused for t in sim.tags()] == [True, False]
    assert sim.stats()["paused_bytes"] == kv_info.reserved
    paused = [s for s in sim.snapshot()["segments"] if s["vrampool_paused"]]
    assert paused and all(s["segment_pool_id"] == paused[0]["segment_pool_id"] for s in paused), "the tag's segments, and no other"
    assert sum(s["total_size"] for s in paused) == kv_info.reserved
    assert intact(plain) and intact(weights)
    with sim.region("kv"), pytest.raises(vrampool.PausedError, match='"kv" is paused'):
        sim.allocate(4096)
    with sim.region("weights"):
        sim.deallocate(sim.allocate(4096))
    ptrs = [b.ptr for b, _ in kv]
    assert sim.resume("kv") == kv_info.reserved
    assert [b.ptr for b, _ in kv] == ptrs and intact(kv) and intact(plain) and intact(weights)
    assert sim.stats()["paused_bytes"] == 0


def test_every_tag_pauses_and_resumes_at_once_and_untagged_memory_never(sim: DevicePool) -> None:
    plain = fill(sim, 3, 7)
    for tag in ("a", "b"):
        with sim.region(tag):
            fill(sim, 3, 9)
    reserved = sim.stats()["reserved_bytes.all.current"]
    tagged = sum(t.reserved for t in sim.tags())
    assert sim.pause(backup=False).released == tagged
    assert all(t.paused for t in sim.tags())
    assert sim.stats()["reserved_bytes.all.current"] == reserved - tagged
    assert intact(plain)
    assert sim.resume() == tagged
    assert not any(t.paused for t in sim.tags())


def test_regions_nest_and_frees_while_paused_are_honoured(sim: DevicePool) -> None:
    with sim.region("outer"):
        outer = sim.allocate(MIB)
        with sim.region("inner"):
            inner = sim.allocate(MIB)
        after = sim.allocate(MIB)
    assert {t.name: t.allocated for t in sim.tags()} == {"outer": 2 * MIB, "inner": MIB}
    sim.pause("inner")
    sim.deallocate(inner)
    with pytest.raises(vrampool.InvalidFreeError):
        sim.deallocate(inner)
    assert {t.name: t.allocated for t in sim.tags()}["inner"] == 0
    sim.resume("inner", cached=False)
    assert {t.name: t.reserved for t in sim.tags()}["inner"] == 0, "nothing live: nothing mapped"
    with sim.region("inner"):
        sim.deallocate(sim.allocate(MIB))
    sim.deallocate(outer)
    sim.deallocate(after)


def test_leak_reports_and_close_list_tagged_buffers(sim: DevicePool) -> None:
    with sim.region("kv"):
        buf = sim.allocate(MIB)
    assert [b["ptr"] for b in sim.leak_report()] == [buf.ptr]
    sim.pause("kv")
    assert [b["ptr"] for b in sim.close()] == [buf.ptr], "a paused tag's buffers are leaks like any"


def test_what_cannot_pause_says_why() -> None:
    with DevicePool("sim", capacity=1 << 30) as pool:
        with pytest.raises(vrampool.PauseError, match='no region was ever opened with tag "kv"'):
            pool.pause("kv")
        with pytest.raises(vrampool.PauseError):
            pool.resume("kv")
        assert pool.pause().released == 0, "no tag: nothing to pause"
    shared = DevicePool("sim", capacity=1 << 30, ipc=True)
    with pytest.raises(vrampool.PauseError, match="shared with other processes"), shared.region("kv"):
        pass
    assert issubclass(vrampool.PausedError, vrampool.PauseError) and issubclass(vrampool.PauseError, RuntimeError)


def test_a_closed_pool_refuses_pause_and_resume(sim: DevicePool) -> None:
    with sim.region("kv"):
        sim.allocate(MIB)
    sim.pause("kv")
    sim.close()
    with pytest.raises(vrampool.PoolClosedError):
        sim.resume("kv")
    with pytest.raises(vrampool.PoolClosedError):
        sim.pause()
    with pytest.raises(vrampool.PoolClosedError), sim.region("new"):
        pass


@pytest.fixture
def abi(monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    monkeypatch.delenv("VRAMPOOL_CONF", raising=False)
    _native._abi_reset()
    vt.configure(device="sim", sim_capacity="512MB")
    lib = ctypes.CDLL(_native.__file__)
    lib.vrampool_malloc.restype, lib.vrampool_malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.vrampool_free.restype, lib.vrampool_free.argtypes = None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    yield lib
    _native._abi_reset()


def test_the_torch_allocators_regions_pause_and_resume(abi: ctypes.CDLL) -> None:
    """What PyTorch's allocations go through under install(): vrampool_malloc inside
    vrampool.torch.region belongs to the tag, and vrampool.torch.pause/resume act on it."""
    plain = abi.vrampool_malloc(MIB, 0, None)
    with vt.region("kv"):
        kv = abi.vrampool_malloc(4 * MIB, 0, None)
    ctypes.memset(kv, 0x5A, 4 * MIB)
    ctypes.memset(plain, 0x11, MIB)
    (tag,) = vt.tags()
    assert tag.name == "kv" and tag.allocated == 4 * MIB
    report = vt.pause("kv", backup=True)
    assert report.released == tag.reserved and vt.memory_stats()["paused_bytes"] == tag.reserved
    with vt.region("kv"):
        assert abi.vrampool_malloc(MIB, 0, None) is None
    assert "paused" in (vt.last_error() or "")
    assert vt.resume("kv") == tag.reserved
    assert ctypes.string_at(kv, 4 * MIB) == b"\x5a" * (4 * MIB)
    assert ctypes.string_at(plain, MIB) == b"\x11" * MIB
    abi.vrampool_free(kv, 4 * MIB, 0, None)
    abi.vrampool_free(plain, MIB, 0, None)
    with pytest.raises(ValueError, match="no region"):
        _native.abi_region(0, "kv", False)


def test_bad_arguments_are_python_errors(sim: DevicePool) -> None:
    with pytest.raises(TypeError), sim.region(None):  # type: ignore[arg-type]
        pass
    with sim.region("kv"):
        sim.allocate(4096)
    with pytest.raises(TypeError):
        sim.pause(7)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sim.resume(b"kv")  # type: ignore[arg-type]
    assert sim.pause("kv").released > 0 and sim.pause("kv").released == 0, "pausing twice gives back nothing more"
    assert sim.resume("kv") > 0 and sim.resume("kv") == 0, "resuming a tag that is not paused maps nothing"
