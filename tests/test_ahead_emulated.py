"""Plans made ahead at the largest shape (issue 56) on DevicePool(0), under the emulated CUDA driver
(scripts/emulated-cuda.sh, which scripts/test.sh runs this file under): the plan's arena is the
only thing the pool asks the driver for, in the first pass; later passes make no driver call that
allocates, maps, frees or waits. Buffers on two streams, filled by slow kernels, copied out by
asynchronous copies and freed before either ran: every copy delivers its byte and the emulator's
stream-order race check sees nothing, also where a larger step falls back to the pool. Host memory,
not a GPU.

Skipped where the loaded libcuda is not the emulated driver (a failure instead with
VRAMPOOL_REQUIRE_EMULATED=1, which scripts/test.sh sets, so CI cannot skip it by accident)."""

from __future__ import annotations

import gc
from typing import Any, Callable, Dict, List, Sequence, Tuple

import pytest

from _emulated import DRIVER, MIB, STEP_COSTS, Copies, assert_no_races, freed_under_kernels, no_races, streams_fixture  # noqa: F401 (fixtures)
from vrampool import DeviceBuffer, DevicePool
from vrampool.ahead import Plan, plan_step
from vrampool.whatif.ahead import capture

#: A kernel's delay: long enough that it has not run when its buffer is freed a moment later.
SLOW_US = 5_000


def rows_on(on: Sequence[int], size: int) -> List[Tuple[int, int, int, int]]:
    """The step `step` runs, as rows: buffer 0 lives throughout, buffer i only at time i."""
    return [(on[0], size, 0, len(on) + 1)] + [(s, size, i, i + 1) for i, s in enumerate(on[1:], 1)]


def step(pool: DevicePool, copies: Copies, on: Sequence[int], size: int, first_value: int) -> None:
    """One step of len(on) buffers of `size` bytes, buffer i on stream on[i] with the byte
    first_value + i: filled by a slow kernel, copied out on its stream and freed at once (buffer
    0 last, after a second copy, so that the step ends there and an overlap with it shows)."""
    bufs = freed_under_kernels(pool, copies, on, size, first_value, SLOW_US)
    copies.queue(bufs[0].ptr, first_value, on[0])
    pool.deallocate(bufs[0])


def costs(before: Dict[str, int]) -> Dict[str, int]:
    after = DRIVER.all_calls()
    return {n: after.get(n, 0) - before.get(n, 0) for n in STEP_COSTS if after.get(n, 0) != before.get(n, 0)}


def test_emulated_a_plan_on_two_streams_makes_no_driver_call_after_its_arena(streams: Tuple[int, int]) -> None:
    """A step of ten buffers on a and b in turn, planned at 2 MiB each: four passes of steps at
    1 and 2 MiB. The first pass's only driver calls are the arena's (taken with the pool), the
    later ones make none, and no context sync; every copy right, no race, every step from the plan."""
    a, b = streams
    on = [a, b] * 5
    plan = plan_step(rows_on(on, 2 * MIB))
    sizes = [MIB, 2 * MIB, MIB]
    copies = Copies(4 * len(sizes) * 11)
    per_pass = []
    try:
        before = DRIVER.all_calls()
        pool = DevicePool(0, plan=plan)
        for number in range(4):
            for k, size in enumerate(sizes):
                step(pool, copies, on, size, 1 + 11 * (k + len(sizes) * number))
            per_pass.append(costs(before))
            before = DRIVER.all_calls()
        assert_no_races()
        assert copies.wrong() == []
    finally:
        copies.close()
    # Two regions, each an address range reserved and a chunk or two created, mapped and opened.
    assert 0 < sum(per_pass[0].values()) <= 16 and "cuCtxSynchronize" not in per_pass[0], per_pass
    assert per_pass[1:] == [{}, {}, {}], per_pass
    s = pool.steady_stats()
    assert (s["planned_allocations"], s["dynamic_allocations"], s["fallbacks"]) == (12 * len(on), 0, 0), s
    gc.collect()
    assert pool.close() == []


def test_emulated_a_larger_step_falls_back_to_the_pool_without_a_race(streams: Tuple[int, int]) -> None:
    """Planned at 1 MiB: a step at 3 MiB leaves the plan at its first buffer and runs on the pool
    (its memory is the pool's growth), then steps at 1 MiB come from the plan again: every copy
    right, no race."""
    a, b = streams
    on = [a, b, b, a, a, b]
    pool = DevicePool(0, plan=plan_step(rows_on(on, MIB)))
    copies = Copies(5 * 7)
    try:
        for k, size in enumerate([MIB, 3 * MIB, MIB, 3 * MIB, MIB]):
            step(pool, copies, on, size, 1 + 7 * k)
        assert_no_races()
        assert copies.wrong() == []
    finally:
        copies.close()
    s = pool.steady_stats()
    assert (s["planned_allocations"], s["dynamic_allocations"], s["fallbacks"]) == (3 * len(on), 2 * len(on), 2), s
    gc.collect()
    assert pool.close() == []


@pytest.mark.filterwarnings("ignore:CUDA initialization:UserWarning")  # torch probing the emulator under fake tensors
def test_emulated_a_plan_from_a_fake_capture_serves_smaller_steps_with_no_driver_call() -> None:
    """A small GPT's training step captured under fake tensors at 4 sequences of 64 tokens and
    planned; DevicePool(0) serves steps of 32, 48 and 64 tokens by it: the first pass makes only
    the arena's driver calls, the next ones none."""
    torch = pytest.importorskip("torch")
    from vrampool.whatif.models import gpt
    from vrampool.whatif.training import capture_model

    def model(seq: int, batch: int = 4) -> Callable[[], Any]:
        def make() -> Any:
            tokens = torch.randint(0, 128, (batch, seq))
            return gpt(layers=1, d_model=32, heads=2, seq_len=64, vocab=128), (tokens, tokens)

        return make

    plan: Plan = capture(model(64))
    passes = [capture_model(model(seq), steps=2).steps()[1].events for seq in (32, 48, 64)]
    before = DRIVER.all_calls()
    pool = DevicePool(0, plan=plan)
    per_pass = []
    for _ in range(3):
        for events in passes:
            live: Dict[int, DeviceBuffer] = {}
            for e in events:
                if e.op == "alloc":
                    live[e.id] = pool.allocate(e.size)
                elif e.op == "free":
                    pool.deallocate(live.pop(e.id))
        per_pass.append(costs(before))
        before = DRIVER.all_calls()
    assert 0 < sum(per_pass[0].values()) <= 8 and "cuCtxSynchronize" not in per_pass[0], per_pass
    assert per_pass[1:] == [{}, {}], per_pass
    s = pool.steady_stats()
    assert s["fallbacks"] == 0 and s["dynamic_allocations"] == 0 and s["replayed_iterations"] == 9, s
    assert pool.close() == []


@pytest.mark.filterwarnings("ignore:CUDA initialization:UserWarning")  # torch probing the emulator under fake tensors
def test_emulated_a_plan_with_its_first_step_serves_a_whole_run_from_one_arena() -> None:
    """A small GPT's run captured under fake tensors at 64 tokens (the weights made in its first
    step) and planned with that first step: DevicePool(0) serves a run at 48 tokens from its very
    first allocation, weights and optimizer state included, by the plan: the arena's driver calls
    and none after, every allocation the plan's."""
    torch = pytest.importorskip("torch")
    from vrampool.whatif.ahead import from_trace
    from vrampool.whatif.models import gpt
    from vrampool.whatif.training import capture_model

    def model(seq: int) -> Callable[[], Any]:
        def make() -> Any:
            tokens = torch.randint(0, 128, (4, seq))
            return gpt(layers=1, d_model=32, heads=2, seq_len=64, vocab=128), (tokens, tokens)

        return make

    plan = from_trace(capture_model(model(64), steps=3))
    assert plan.first > 0
    run = capture_model(model(48), steps=3).events
    before = DRIVER.all_calls()
    pool = DevicePool(0, plan=plan)
    live: Dict[int, DeviceBuffer] = {}
    per_step: List[Dict[str, int]] = []
    for e in run:
        if e.op == "alloc":
            live[e.id] = pool.allocate(e.size)
        elif e.op == "free":
            pool.deallocate(live.pop(e.id))
        else:
            per_step.append(costs(before))
            before = DRIVER.all_calls()
    assert 0 < sum(per_step[0].values()) <= 8 and "cuCtxSynchronize" not in per_step[0], per_step
    assert per_step[1:] == [{}] * (len(per_step) - 1), per_step
    s = pool.steady_stats()
    allocations = sum(1 for e in run if e.op == "alloc")
    assert (s["planned_allocations"], s["dynamic_allocations"], s["fallbacks"]) == (allocations, 0, 0), s
    for buffer in live.values():
        pool.deallocate(buffer)
    gc.collect()
    assert pool.close() == []
