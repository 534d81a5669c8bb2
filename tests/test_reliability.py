"""Reliability (issue 8) from Python: scrubbing and leak reports."""

import inspect
import time

import pytest

from vrampool import DevicePool

STRATEGIES = ("hybrid", "slab", "best_fit", "buddy")
# Through the fast path, and each tier of the hybrid.
SIZES = (1000, 100 << 10, 3 << 20, 80 << 20)


def _reuse_after_pattern(pool: DevicePool, size: int) -> bytes:
    buf = pool.allocate(size)
    ptr = buf.ptr
    pattern = bytes((i % 251) | 1 for i in range(min(size, 4096)))
    pool.native.sim_write(ptr, pattern)
    pool.native.sim_write(ptr + size - len(pattern), pattern)
    pool.deallocate(buf)
    again = pool.allocate(size)
    assert again.ptr == ptr, "the freed block is reused"
    data = pool.native.sim_read(ptr, len(pattern)) + pool.native.sim_read(ptr + size - len(pattern), len(pattern))
    pool.deallocate(again)
    return data


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("scrub", ("on_free", "on_alloc"))
def test_scrub_zero_fills_what_the_last_user_left(strategy: str, scrub: str) -> None:
    with DevicePool("sim", capacity=1 << 30, strategy=strategy, scrub=scrub) as pool:
        for size in SIZES:
            assert not any(_reuse_after_pattern(pool, size)), f"{size} B: the last user's data leaked"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_scrub_is_off_by_default_and_leaves_the_bytes(strategy: str) -> None:
    assert inspect.signature(DevicePool).parameters["scrub"].default == "off"
    with DevicePool("sim", capacity=1 << 30, strategy=strategy) as pool:
        for size in SIZES:
            assert all(_reuse_after_pattern(pool, size)), f"{size} B: off leaves the bytes"


def test_bad_scrub_and_track_leaks_values_are_refused() -> None:
    with pytest.raises(ValueError, match="scrub"):
        DevicePool("sim", capacity=1 << 30, scrub="sometimes")
    with pytest.raises(TypeError, match="track_leaks"):
        DevicePool("sim", capacity=1 << 30, track_leaks="yes")  # type: ignore[arg-type]


def test_a_tensor_created_in_a_loop_and_never_freed_shows_in_the_leak_report() -> None:
    pool = DevicePool("sim", capacity=1 << 30, track_leaks=True)
    kept = []
    started = time.monotonic()
    for step in range(5):
        scratch = pool.allocate(4096)  # freed each step: no leak
        kept.append(pool.allocate(1 << 20))  # LEAK: appended every step, never freed
        pool.deallocate(scratch)
        time.sleep(0.002)
    leak_line = next(i for i, line in enumerate(inspect.getsourcelines(
        test_a_tensor_created_in_a_loop_and_never_freed_shows_in_the_leak_report)[0]) if "# LEAK" in line)
    leak_line += test_a_tensor_created_in_a_loop_and_never_freed_shows_in_the_leak_report.__code__.co_firstlineno

    report = pool.leak_report()
    lived = time.monotonic() - started
    assert [b["ptr"] for b in report] == sorted(b.ptr for b in kept)
    for block in report:
        assert (block["requested"], block["size"], block["stream"]) == (1 << 20, 1 << 20, 0)
        assert block["age_s"] is not None and 0 < block["age_s"] <= lived, (block["age_s"], lived)
        frame = block["stack"][-1]
        assert (frame.name, frame.lineno) == ("test_a_tensor_created_in_a_loop_and_never_freed_shows_in_the_leak_report", leak_line)
        assert "kept.append" in frame.line
    by_ptr = {b["ptr"]: b["age_s"] for b in report}
    assert by_ptr[kept[0].ptr] > by_ptr[kept[-1].ptr], "the first leak is the oldest"

    # Freeing some (either way) takes them off the report.
    pool.deallocate(kept.pop())
    kept.pop().free()
    assert len(pool.leak_report()) == 3
    leaks = pool.close()
    assert [b["ptr"] for b in leaks] == sorted(b.ptr for b in kept)
    assert all(b["stack"][-1].lineno == leak_line for b in leaks)


def test_leak_report_without_tracking_has_no_ages_or_stacks() -> None:
    with DevicePool("sim", capacity=1 << 30) as pool:
        buf = pool.allocate(100)
        (block,) = pool.leak_report()
        assert (block["ptr"], block["requested"], block["age_s"], block["stack"]) == (buf.ptr, 100, None, None)
        buf.free()
        assert pool.leak_report() == []


def test_stacks_of_blocks_freed_behind_the_pools_back_are_pruned() -> None:
    pool = DevicePool("sim", capacity=1 << 30, track_leaks=True)
    freed = [pool.allocate(512) for _ in range(1500)]
    for buf in freed:
        buf.free()  # behind the pool's back: the stacks stay until a prune
    del freed
    kept = [pool.allocate(4096) for _ in range(1500)]
    assert pool._stacks is not None and len(pool._stacks) == 1500, "freed blocks' stacks were pruned"
    report = pool.leak_report()
    assert [b["ptr"] for b in report] == sorted(b.ptr for b in kept)
    assert all(b["stack"] is not None for b in report)
    pool.close()
