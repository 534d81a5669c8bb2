"""The planned arena driven by real training loops captured on the CPU: every storage a small CNN
and a small transformer allocate is served by a `PlannedPool` on the host-backed simulated device,
filled with its own pattern, and checked when it dies (so any overlap of live buffers fails).
Changing the batch size mid-run, and changing it back, shows plans kept per signature."""

from __future__ import annotations

import functools
import gc
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

import vrampool
from vrampool import DevicePool, InvalidFreeError, PlannedPool
from vrampool.planned import signature_key
from vrampool.testing import native

torch = pytest.importorskip("torch")
capture = pytest.importorskip("vrampool.whatif.capture")

CAPACITY = 1 << 30
#: The segment size of the small tiers: what a plain pool rounds reserved memory to.
SEGMENT = 2 << 20


def pattern(ident: int, size: int) -> bytes:
    return (ident.to_bytes(8, "little") * (size // 8 + 1))[:size]


class PlannedDriver:
    """Serves a storage tracker's allocations from a planned pool and checks each buffer's pattern
    at its free. Failures are collected, not raised: frees arrive in weakref callbacks, which
    swallow exceptions."""

    def __init__(self, pool: DevicePool) -> None:
        self.pool = pool
        self.planned = pool.planned()
        self.live: Dict[int, Tuple[int, int]] = {}
        self.errors: List[str] = []
        self.trace: List[Tuple[str, int, int]] = []  # ("alloc", id, size) / ("free", id, 0)

    def on_alloc(self, ident: int, size: int) -> None:
        ptr = self.planned.allocate(size)
        native(self.pool).sim_write(ptr, pattern(ident, size))
        self.live[ident] = (ptr, size)
        self.trace.append(("alloc", ident, size))

    def on_free(self, ident: int, size: int) -> None:
        try:
            ptr, size = self.live.pop(ident)
            if native(self.pool).sim_read(ptr, size) != pattern(ident, size):
                self.errors.append(f"storage {ident} ({size} B at {ptr:#x}) was overwritten while live")
            self.planned.deallocate(ptr)
            self.trace.append(("free", ident, 0))
        except Exception as e:  # noqa: BLE001 - reported by the test, not lost in a weakref callback
            self.errors.append(f"free of storage {ident}: {e!r}")


def cnn() -> Any:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 10),
    )


class TinyTransformer(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=256, batch_first=True)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: Any) -> Any:
        return self.head(self.layer(x).mean(dim=1))


MODELS: Dict[str, Tuple[Callable[[], Any], Callable[[int], Any]]] = {
    "cnn": (cnn, lambda batch: torch.randn(batch, 3, 32, 32)),
    "transformer": (TinyTransformer, lambda batch: torch.randn(batch, 32, 64)),
}


def train(
    name: str, schedule: List[int], keyed: bool
) -> Tuple[PlannedDriver, List[Dict[str, Any]]]:
    """Trains model `name` over batches of the sizes in `schedule`, every allocation from a planned
    pool; `step(key=batch shape)` between iterations when `keyed`, else the default key. Returns
    the driver and the planned pool's stats after each iteration."""
    torch.manual_seed(0)
    make_model, make_input = MODELS[name]
    model = make_model()
    batches = [(make_input(b), torch.randint(0, 10, (b,))) for b in schedule]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    driver = PlannedDriver(DevicePool("sim", capacity=CAPACITY))
    key = (lambda i: tuple(batches[i][0].shape)) if keyed else (lambda i: None)
    after: List[Dict[str, Any]] = []
    with capture.storage_tracker(driver.on_alloc, driver.on_free):
        driver.planned.step(key(0))
        steps = capture.training_steps(model, batches, torch.nn.functional.cross_entropy, optimizer)
        for i, _ in enumerate(steps):
            driver.planned.step(key(min(i + 1, len(batches) - 1)))
            after.append(driver.planned.stats())
    del optimizer, model, steps
    gc.collect()
    assert driver.errors == []
    return driver, after


def deltas(after: List[Dict[str, Any]], key: str) -> List[int]:
    values = [0] + [s[key] for s in after]
    return [b - a for a, b in zip(values, values[1:])]


def dynamic_peak_reserved(trace: List[Tuple[str, int, int]]) -> int:
    """The same allocation sequence on a plain pool: its peak reserved bytes."""
    pool = DevicePool("sim", capacity=CAPACITY)
    live: Dict[int, Any] = {}
    for op, ident, size in trace:
        if op == "alloc":
            live[ident] = pool.allocate(size)
        else:
            pool.deallocate(live.pop(ident))
    return int(pool.stats()["reserved_bytes.all.peak"])


SCHEDULE = [8] * 3 + [16] * 2 + [8] * 2


@pytest.mark.parametrize("name", sorted(MODELS))
def test_keyed_training_loop_plans_per_batch_shape(name: str) -> None:
    driver, after = train(name, SCHEDULE, keyed=True)
    fallbacks, recorded = deltas(after, "fallbacks"), deltas(after, "recorded_iterations")
    planned, dynamic = deltas(after, "planned_allocations"), deltas(after, "dynamic_allocations")
    # Iteration 1 (batch 8) is recorded; iteration 2 leaves that plan once (Adam's state was
    # allocated in the first step only) and is planned anew; batch 16 is recorded once; going
    # back to batch 8 reuses its plan with no fallback.
    assert recorded == [1, 0, 0, 1, 0, 0, 0]
    assert fallbacks == [0, 1, 0, 0, 0, 0, 0]
    assert deltas(after, "replayed_iterations") == [0, 0, 1, 0, 1, 1, 1]
    for i in (2, 4, 5, 6):
        assert planned[i] >= 0.9 * (planned[i] + dynamic[i]), (i, planned[i], dynamic[i])
    final = after[-1]
    assert len(final["plans"]) == 2
    assert final["arena_bytes"] == -(-max(p["arena_bytes"] for p in final["plans"]) // SEGMENT) * SEGMENT, "the largest plan's, in whole segments"
    assert all(p["arena_bytes"] >= p["lower_bound_bytes"] for p in final["plans"])
    # The arena is one more block beside what the first, recorded iterations left cached: it
    # costs at most the largest arena, in whole 2 MiB segments, over the plain pool (on these
    # loops the plain pool peaks at 6 MiB and the planned one at 10 MiB, arenas of 2-4.3 MiB).
    arena_segments = -(-max(p["arena_bytes"] for p in final["plans"]) // SEGMENT) * SEGMENT
    assert driver.pool.stats()["reserved_bytes.all.peak"] <= dynamic_peak_reserved(driver.trace) + arena_segments


@pytest.mark.parametrize("name", sorted(MODELS))
def test_unkeyed_batch_change_falls_back_once_then_runs_planned(name: str) -> None:
    _, after = train(name, SCHEDULE, keyed=False)
    # One plan for every shape: each change of batch size leaves it once, and the next
    # iteration of the new size runs planned.
    assert deltas(after, "fallbacks") == [0, 1, 0, 1, 0, 1, 0]
    assert deltas(after, "replayed_iterations") == [0, 0, 1, 0, 1, 0, 1]
    assert len(after[-1]["plans"]) == 1


def test_direct_use_and_errors() -> None:
    pool = DevicePool("sim", capacity=CAPACITY)
    with pool.planned() as planned:
        assert isinstance(planned, PlannedPool) and vrampool.PlannedPool is PlannedPool
        planned.step("shape-a")  # names the next iteration
        for _ in range(3):
            ptrs = [planned.allocate(n, stream=0) for n in (1000, 5000, 300)]
            for p in ptrs:
                planned.deallocate(p)
            planned.step("shape-a")
        stats = planned.stats()
        assert (stats["planned_allocations"], stats["dynamic_allocations"], stats["fallbacks"]) == (6, 3, 0)
        assert stats["plans"][0]["key"] == signature_key("shape-a")
        with pytest.raises(InvalidFreeError):
            planned.deallocate(ptrs[0])
        with pytest.raises(InvalidFreeError):
            planned.deallocate(12345)
        with pytest.raises(vrampool.InvalidSizeError):
            planned.allocate(0)
        with pytest.raises(vrampool.OutOfMemoryError):
            planned.allocate(CAPACITY * 4)  # more than the device holds
        with pytest.raises(vrampool.OutOfMemoryError):
            planned.allocate(CAPACITY)  # the arena holds part of the device
        assert planned.stats()["arena_bytes"] > 0
    assert planned.stats()["arena_bytes"] == 0, "leaving the context gives the idle arena back"
    assert pool.stats()["allocated_bytes.all.current"] == 0


def test_a_dropped_planned_pool_leaves_live_buffers_allocated_in_the_pool() -> None:
    # As the planned arena's drop says: an arena with live buffers, and pool buffers, stay the
    # pool's (their owners may still use them); an idle arena goes back.
    pool = DevicePool("sim", capacity=CAPACITY)
    planned = pool.planned()
    for _ in range(2):
        a, b = planned.allocate(4096), planned.allocate(8192)
        planned.deallocate(a)
        planned.deallocate(b)
        planned.step()
    arena_ptr = planned.allocate(4096)  # served from the arena
    pool_ptr = planned.allocate(1 << 20)  # off the plan: from the pool
    assert planned.stats()["planned_allocations"] >= 1 and planned.stats()["arena_live"] == 1
    held = pool.stats()["allocated_bytes.all.current"]
    del planned
    gc.collect()
    assert pool.stats()["allocated_bytes.all.current"] == held, (arena_ptr, pool_ptr)
    idle = pool.planned()
    idle.deallocate(idle.allocate(4096))
    idle.step()
    del idle
    gc.collect()
    assert pool.stats()["allocated_bytes.all.current"] == held, "an idle arena and freed buffers go back"


def test_signature_keys_are_stable_and_distinct() -> None:
    shapes: List[Optional[Any]] = [None, (8, 3), (16, 3), ((8, 3), (8,)), "x"]
    keys = [signature_key(s) for s in shapes]
    assert keys[0] == 0 and len(set(keys)) == len(keys)
    assert signature_key(torch.Size([8, 3])) == signature_key([8, 3]) == keys[1]
    assert signature_key((torch.Size([8, 3]), torch.Size([8]))) == keys[3]


def run_workers(worker: Callable[[int], None], threads: int, barrier: Any) -> List[str]:
    """Runs ``worker(t)`` on ``threads`` threads at once and returns what went wrong: an exception
    is recorded and breaks ``barrier`` (so that no thread waits for the one that failed); a thread
    still running after two minutes fails the test (a deadlock)."""
    import threading

    errors: List[str] = []

    def guarded(t: int) -> None:
        try:
            worker(t)
        except Exception as e:  # noqa: BLE001 - returned to the test
            barrier.abort()
            errors.append(f"thread {t}: {e!r}")

    running = [threading.Thread(target=guarded, args=(t,)) for t in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in running), "deadlock"
    return errors


def test_threads_share_a_planned_pool_without_deadlock_or_overlap() -> None:
    # The planned pool's lock is taken with the GIL released and its pool calls take the GIL:
    # threads that allocate, free and step at once must neither deadlock nor overlap. Each thread
    # holds its buffers across a barrier where every thread has written all of its own, and checks
    # them only after: a buffer handed to two threads at once shows as the other's pattern.
    import collections
    import threading

    pool = DevicePool("sim", capacity=CAPACITY)
    planned = pool.planned()
    threads, rounds, per_round = 4, 15, 10
    barrier = threading.Barrier(threads, timeout=60)
    overwritten: List[str] = []

    def worker(t: int) -> None:
        live: "collections.deque[Tuple[int, bytes]]" = collections.deque()
        for r in range(rounds):
            for k in range(per_round):
                size = 512 * (1 + (r + k + t) % 7)
                ptr = planned.allocate(size)
                data = pattern(t << 32 | r * per_round + k, size)
                native(pool).sim_write(ptr, data)
                live.append((ptr, data))
            barrier.wait()  # every thread's buffers of this round are written
            # Free all but the last three, which stay live into the next round.
            while len(live) > 3:
                ptr, data = live.popleft()
                if native(pool).sim_read(ptr, len(data)) != data:
                    overwritten.append(f"thread {t}, round {r}: {len(data)} B at {ptr:#x}")
                planned.deallocate(ptr)
            if t == 0:
                planned.step()
            barrier.wait()  # checked before the next round writes
        for ptr, data in live:
            if native(pool).sim_read(ptr, len(data)) != data:
                overwritten.append(f"thread {t}: {len(data)} B at {ptr:#x}")
            planned.deallocate(ptr)

    assert run_workers(worker, threads, barrier) == []
    assert overwritten == []
    stats = planned.stats()
    assert stats["planned_allocations"] + stats["dynamic_allocations"] == threads * rounds * per_round
    # Nothing live but the arena itself, a block of the pool, when an iteration was planned.
    assert stats["arena_live"] == 0 and pool.stats()["allocation.all.current"] == (1 if stats["arena_bytes"] else 0)


def test_threads_taking_turns_are_served_from_the_arena_without_overlap() -> None:
    # The same sequence every iteration, made by four threads in turn: from the second iteration
    # on it is served from the arena, each thread's buffers at planned offsets. Every thread
    # writes all of its buffers before any is checked and freed, so an offset planned for two
    # live buffers of different threads shows as the other thread's pattern.
    import threading

    pool = DevicePool("sim", capacity=CAPACITY)
    planned = pool.planned()
    threads, iterations, per_thread = 4, 6, 5
    turn = threading.Condition()
    state = {"turn": 0}
    barrier = threading.Barrier(threads, timeout=60)
    overwritten: List[str] = []

    def in_turn(t: int, call: Callable[[], None]) -> None:
        with turn:
            if not turn.wait_for(lambda: state["turn"] % threads == t, timeout=60):
                raise TimeoutError("no turn")
            call()
            state["turn"] += 1
            turn.notify_all()

    def allocate(t: int, it: int, k: int, live: List[Tuple[int, bytes]]) -> None:
        size = 512 * (1 + (t + k) % 5)
        ptr = planned.allocate(size)
        data = pattern(t << 32 | it << 16 | k, size)
        native(pool).sim_write(ptr, data)
        live.append((ptr, data))

    def free(t: int, it: int, live: List[Tuple[int, bytes]]) -> None:
        ptr, data = live.pop(0)
        if native(pool).sim_read(ptr, len(data)) != data:
            overwritten.append(f"thread {t}, iteration {it}: {len(data)} B at {ptr:#x}")
        planned.deallocate(ptr)

    def worker(t: int) -> None:
        for it in range(iterations):
            live: List[Tuple[int, bytes]] = []
            for k in range(per_thread):
                in_turn(t, functools.partial(allocate, t, it, k, live))
            for _ in range(per_thread):
                in_turn(t, functools.partial(free, t, it, live))
            barrier.wait()
            if t == 0:
                planned.step()
            barrier.wait()

    assert run_workers(worker, threads, barrier) == []
    assert overwritten == []
    stats = planned.stats()
    per_iteration = threads * per_thread
    # The first iteration is recorded; every later one repeats it and is planned.
    assert (stats["dynamic_allocations"], stats["planned_allocations"]) == (per_iteration, (iterations - 1) * per_iteration)
    assert stats["fallbacks"] == 0 and stats["arena_live"] == 0
