"""Pause and resume under the emulated CUDA driver (scripts/emulated-cuda.sh, which
scripts/test.sh runs this file under): the driver's free memory rises by the tag's pages and
falls back, every pointer stays, bytes come back with a backup, slow kernels are waited for,
other tags and untagged memory are never touched, a hundred cycles leave nothing behind, and a
fault at every driver call of both paths leaves the tag consistent and a retry succeeding. Host
memory, not a GPU.

Skipped where the loaded libcuda is not the emulated driver (a failure instead with
VRAMPOOL_REQUIRE_EMULATED=1, which scripts/test.sh sets)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, Tuple

import pytest

import test_pause as pause_tests
import vrampool
from _emulated import DRIVER, MIB, no_races, streams_fixture  # noqa: F401 (fixtures)
from test_pause import Buffers
from vrampool import DevicePool

#: The driver calls whose counts show pages, handles and address ranges made and given back.
LIFE = ("cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemAddressReserve", "cuMemAddressFree")

def fill(pool: DevicePool, n: int, seed: int) -> Buffers:
    return pause_tests.fill(pool, n, seed, DRIVER.write)


def intact(buffers: Buffers) -> bool:
    return pause_tests.intact(buffers, DRIVER.read)


def calls() -> Dict[str, int]:
    return {k: v for k, v in DRIVER.all_calls().items() if k.startswith("cu")}


def made_since(before: Dict[str, int]) -> Dict[str, int]:
    return {n: c - before.get(n, 0) for n, c in calls().items() if c > before.get(n, 0)}


@pytest.fixture
def pool(device_pool: DevicePool) -> DevicePool:
    return device_pool


def test_emulated_pause_frees_the_tags_pages_and_resume_restores_every_byte(pool: DevicePool) -> None:
    plain = fill(pool, 5, 1)
    with pool.region("kv"):
        kv = fill(pool, 10, 40)
    with pool.region("weights"):
        weights = fill(pool, 5, 90)
    reserved = {t.name: t.reserved for t in pool.tags()}
    free = DRIVER.mem_info()[0]
    report = pool.pause("kv", backup=True)
    assert report.released == reserved["kv"]
    assert DRIVER.mem_info()[0] - free >= reserved["kv"] * 99 // 100, "the driver's free memory rose by the tag's pages"
    assert intact(plain) and intact(weights)
    assert DRIVER.lib.cuMemcpyDtoH_v2(b"\0" * 8, kv[0][0].ptr, 8) != 0, "a paused buffer's address holds no memory"
    ptrs = [b.ptr for b, _ in kv]
    assert pool.resume("kv") == reserved["kv"]
    assert DRIVER.mem_info()[0] == free
    assert [b.ptr for b, _ in kv] == ptrs and intact(kv) and intact(plain) and intact(weights)


def test_emulated_without_a_backup_the_buffers_come_back_usable(pool: DevicePool) -> None:
    with pool.region("kv"):
        kv = fill(pool, 6, 3)
    assert pool.pause("kv").backed_up == 0
    pool.resume("kv")
    fresh = [(buf, b"\xee" * buf.size) for buf, _ in kv]
    for buf, data in fresh:
        DRIVER.write(buf.ptr, data)
    assert intact(fresh)


def test_emulated_pause_waits_for_the_kernels_still_writing_the_tag(pool: DevicePool, streams: Tuple[int, int]) -> None:
    """A slow kernel on another stream still writes a tagged buffer when pause is called: the
    pause waits for that stream (no unmap under it: the race check would see one) and backs up
    what the kernel wrote."""
    a, _ = streams
    with pool.region("kv"):
        buf = pool.allocate(4 * MIB, stream=a)
    DRIVER.fill(buf.ptr, 4 * MIB, 0x77, 200_000, a)
    syncs = DRIVER.calls("cuCtxSynchronize")
    pool.pause("kv", backup=True)
    assert DRIVER.calls("cuCtxSynchronize") == syncs, "streams alone, never a context-wide sync"
    pool.resume("kv")
    assert DRIVER.read(buf.ptr, 4 * MIB) == b"\x77" * (4 * MIB)


def test_emulated_a_hundred_cycles_leave_no_page_handle_or_range_and_touch_no_other_tag(pool: DevicePool) -> None:
    plain = fill(pool, 4, 1)
    with pool.region("kv"):
        kv = fill(pool, 8, 20)
    with pool.region("weights"):
        weights = fill(pool, 6, 60)
    free = DRIVER.mem_info()[0]
    before = calls()
    for cycle in range(100):
        backup = cycle % 2 == 0
        pool.pause("kv", backup=backup)
        assert intact(weights) and intact(plain), f"cycle {cycle}"
        pool.resume("kv")
        if backup:
            assert intact(kv), f"cycle {cycle}"
        else:
            for buf, data in kv:  # without a backup the bytes went with the pages
                DRIVER.write(buf.ptr, data)
        assert DRIVER.mem_info()[0] == free, f"cycle {cycle}"
    made = made_since(before)
    assert made.get("cuMemCreate", 0) == made.get("cuMemRelease", 0) > 0, made
    assert made.get("cuMemMap", 0) == made.get("cuMemUnmap", 0), made
    assert made.get("cuMemAddressReserve", 0) == made.get("cuMemAddressFree", 0) == 0, "the ranges stay reserved: " + repr(made)


def _tag_life(pool: DevicePool, kv: Buffers, step: str) -> None:
    """One step of a pause-resume cycle with a backup."""
    if step == "pause":
        pool.pause("kv", backup=True)
    else:
        pool.resume("kv")


def test_emulated_a_fault_at_every_driver_call_of_pause_and_resume_leaves_the_tag_consistent(pool: DevicePool) -> None:
    """Each driver call a pause or a resume makes, failed at each of its first two calls: the
    call raises one of vrampool's errors (or finishes), the tag is paused or not as the error
    says, nothing is half-mapped, and retrying without the fault brings every byte back."""
    plain = fill(pool, 3, 1)
    with pool.region("kv"):
        kv = fill(pool, 10, 30)
    free = DRIVER.mem_info()[0]
    made: Dict[str, Dict[str, int]] = {}
    for step in ("pause", "resume"):
        before = calls()
        _tag_life(pool, kv, step)
        made[step] = made_since(before)
    assert {"cuEventRecord", "cuEventSynchronize", "cuMemcpyDtoH", "cuMemUnmap", "cuMemRelease"} <= set(made["pause"]), made
    assert {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemcpyHtoD"} <= set(made["resume"]), made
    raised = 0
    for step in ("pause", "resume"):
        for name, count in sorted(made[step].items()):
            for nth in range(1, min(count, 2) + 1):
                if step == "resume":
                    pool.pause("kv", backup=True)
                DRIVER.fail(name, nth)
                try:
                    _tag_life(pool, kv, step)
                except (vrampool.PauseError, vrampool.DeviceError, vrampool.OutOfMemoryError) as e:
                    raised += 1
                    assert str(e), f"{step}: {name} #{nth}: an error without a message"
                finally:
                    DRIVER.fail(name, 0)
                (tag,) = pool.tags()
                if step == "resume" and tag.paused:
                    assert DRIVER.mem_info()[0] == free + tag.paused_bytes, f"{name} #{nth}: half-mapped after a failed resume"
                # The retry finishes the job.
                pool.pause("kv", backup=True) if step == "pause" else None
                pool.resume("kv")
                assert intact(kv) and intact(plain), f"{step}: {name} #{nth}"
                assert DRIVER.mem_info()[0] == free, f"{step}: {name} #{nth}"
    assert raised > 0


def test_emulated_a_full_device_on_resume_is_a_clear_error_and_the_retry_succeeds(pool: DevicePool) -> None:
    with pool.region("kv"):
        kv = fill(pool, 5, 11)
    pool.pause("kv", backup=True)
    other = DevicePool(0, steady=False)
    hog = other.allocate(DRIVER.mem_info()[0] - MIB)
    with pytest.raises(vrampool.PausedError, match="still paused.*later"):
        pool.resume("kv")
    assert pool.tags()[0].paused
    other.deallocate(hog)
    other.close()
    pool.resume("kv")
    assert intact(kv)


def test_emulated_a_device_without_vmm_refuses_tags_saying_why() -> None:
    code = "import vrampool\np = vrampool.DevicePool(0)\ntry:\n    p.region('kv').__enter__()\nexcept vrampool.PauseError as e:\n    print(e)\n"
    env = dict(os.environ, EMULATED_CUDA_VMM="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "cannot pause" in out.stdout and "virtual memory" in out.stdout, out.stdout + out.stderr
