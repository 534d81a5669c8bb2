"""Reliability from Python: scrubbing and leak reports (issue 8); other threads' caches and
test-only controls (issue 16)."""

import inspect
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence, Tuple

import pytest

from vrampool import DevicePool
from vrampool.testing import native

STRATEGIES = ("hybrid", "slab", "best_fit", "buddy")
# Through the fast path, and each tier of the hybrid.
SIZES = (1000, 100 << 10, 3 << 20, 80 << 20)


def _reuse_after_pattern(pool: DevicePool, size: int) -> bytes:
    buf = pool.allocate(size)
    ptr = buf.ptr
    pattern = bytes((i % 251) | 1 for i in range(min(size, 4096)))
    native(pool).sim_write(ptr, pattern)
    native(pool).sim_write(ptr + size - len(pattern), pattern)
    pool.deallocate(buf)
    again = pool.allocate(size)
    assert again.ptr == ptr, "the freed block is reused"
    data = native(pool).sim_read(ptr, len(pattern)) + native(pool).sim_read(ptr + size - len(pattern), len(pattern))
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
    for _ in range(5):
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


# ---- other threads' caches (issue 16) ----

MIB = 1 << 20
#: Sizes the thread caches keep (size classes up to small_max), several of each.
THREAD_CACHED = (512, 2048, 8192, 64 << 10, 512 << 10, 1 << 20)


def _idle_worker(pool: DevicePool, sizes: Sequence[int]) -> Tuple[threading.Thread, threading.Event]:
    """A thread that allocates and frees `sizes`, then stays alive and idle until released."""
    ready, release = threading.Event(), threading.Event()

    def work() -> None:
        bufs = [pool.allocate(n) for n in sizes]
        for buf in bufs:
            buf.free()
        ready.set()
        release.wait()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    assert ready.wait(30)
    return worker, release


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_trim_reaches_the_cache_of_a_thread_that_stays_idle(strategy: str) -> None:
    pool = DevicePool("sim", capacity=1 << 30, strategy=strategy)
    worker, release = _idle_worker(pool, THREAD_CACHED * 3)
    assert pool.stats()["allocated_bytes.all.current"] == 0
    pool.trim()
    assert pool.stats()["reserved_bytes.all.current"] == 0, "the idle worker's cached blocks stayed reserved"
    release.set()
    worker.join()


@pytest.mark.parametrize("reclaim", [True, False])
def test_an_allocation_gets_the_memory_an_idle_thread_cached(reclaim: bool) -> None:
    # The case: best_fit on a 48 MiB device, a worker's cache pinning segments.
    pool = DevicePool("sim", capacity=48 * MIB, strategy="best_fit", host_backed=False, reclaim=reclaim)
    worker, release = _idle_worker(pool, [THREAD_CACHED[i % len(THREAD_CACHED)] for i in range(40)])
    assert pool.stats()["reserved_bytes.all.current"] + 44 * MIB > 48 * MIB
    pool.allocate(44 * MIB).free()
    release.set()
    worker.join()


def test_a_reset_right_after_join_leaves_nothing_reserved() -> None:
    # Thread.join() returns before the thread's thread-local destructors run.
    pool = DevicePool("sim", capacity=1 << 30, host_backed=False)
    for _ in range(12):
        worker = threading.Thread(target=lambda: [pool.allocate(n).free() for n in THREAD_CACHED * 4])
        worker.start()
        worker.join()
        pool.trim()
        assert pool.stats()["reserved_bytes.all.current"] == 0


def test_blocks_freed_in_backward_on_the_autograd_thread_come_back() -> None:
    """A training loop whose backward allocates and frees pool memory on a thread of its own
    that then stays idle, as PyTorch's autograd engine runs a CUDA device's backward on a
    long-lived thread (on the CPU it runs backward on the caller's thread, so the test gives
    backward such a thread)."""
    torch = pytest.importorskip("torch")
    pool = DevicePool("sim", capacity=64 * MIB, strategy="best_fit")

    def pool_tensor(like: Any) -> Tuple[Any, Any]:
        buf = pool.allocate(like.numel() * like.element_size())
        return buf, torch.from_dlpack(buf).view(like.dtype).view(like.shape)

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            scratch = [pool_tensor(grad) for _ in range(4)]  # the backward's temporaries
            out = grad * 2
            for buf, view in scratch:
                view.copy_(grad)
                del view
                buf.free()
            return out

    weights = torch.randn(64, 1024, requires_grad=True)
    with ThreadPoolExecutor(max_workers=1) as autograd_thread:
        for _ in range(5):
            loss = Scale.apply(weights).sum()
            autograd_thread.submit(loss.backward).result()
        assert weights.grad is not None and float(weights.grad[0, 0]) == 2 * 5
        # The autograd thread is idle now, its cache full of the backward's blocks.
        assert pool.stats()["allocated_bytes.all.current"] == 0
        pool.trim()
        assert pool.stats()["reserved_bytes.all.current"] == 0, "blocks freed in backward stayed cached"
        pool.allocate(60 * MIB).free()


def test_the_c_abi_reset_hook_reaches_an_idle_threads_cache() -> None:
    # torch.cuda.empty_cache() under install() calls the reset hook.
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(
            """
            import ctypes, threading
            from vrampool import _native
            _native.configure("device:sim,sim_capacity:1GB")
            lib = ctypes.CDLL(_native.__file__)
            lib.vrampool_malloc.restype = ctypes.c_void_p
            lib.vrampool_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            lib.vrampool_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            sizes = (512, 4096, 65536) * 4
            ready, release = threading.Event(), threading.Event()
            def work():
                ptrs = [lib.vrampool_malloc(n, 0, None) for n in sizes]
                for p, n in zip(ptrs, sizes):
                    lib.vrampool_free(p, n, 0, None)
                ready.set()
                release.wait()
            worker = threading.Thread(target=work)
            worker.start()
            ready.wait()
            before = _native.abi_stats(0)["reserved_bytes.all.current"]
            lib.vrampool_reset()
            print(before, _native.abi_stats(0)["reserved_bytes.all.current"])
            release.set()
            worker.join()
            """
        )],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = map(int, done.stdout.split())
    assert before > 0 and after == 0, f"reserved {before} B before the reset, {after} B after"


# ---- test-only controls (issue 16) ----


def test_no_public_attribute_frees_a_live_buffer_behind_its_owner() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    buf = pool.allocate(4096)
    planned = pool.planned()
    for obj in (pool, buf, planned):
        for name in (n for n in dir(obj) if not n.startswith("_")):
            value = getattr(obj, name, None)
            assert not hasattr(value, "free_ptr"), f"{type(obj).__name__}.{name} reaches a raw free"
            assert not hasattr(value, "sim_write"), f"{type(obj).__name__}.{name} reaches the test controls"
    assert not hasattr(pool, "native")
    assert not hasattr(pool._native, "free_ptr"), "a raw free would free the buffer behind its DeviceBuffer"
    c, d = pool.allocate(4096), pool.allocate(4096)
    assert len({buf.ptr, c.ptr, d.ptr}) == 3


# ---- Python numbers and streams (issue 16) ----


def test_numpy_integers_serve_as_sizes_and_stream_handles() -> None:
    np = pytest.importorskip("numpy")
    pool = DevicePool("sim", capacity=1 << 30)
    buf = pool.allocate(np.int64(4096), stream=np.uint64(7))
    assert (buf.size, buf.stream) == (4096, 7)
    buf.free(np.int32(7))
    planned = pool.planned()
    planned.deallocate(planned.allocate(np.int64(512)))
    for bad in (True, np.bool_(True), 4096.0, np.float64(4096), "4096"):
        with pytest.raises(TypeError):
            pool.allocate(bad)
    for bad in (True, np.bool_(False), 7.0):
        with pytest.raises(TypeError):
            pool.allocate(64, stream=bad)


@pytest.mark.parametrize("value", [(0, 7.9), (0, "7"), (0, True), (0, None), (True, 7), (0.0, 7), (0, 7, 0), [0, 7]])
def test_a_cuda_stream_protocol_with_a_bad_tuple_is_refused(value: Any) -> None:
    class Stream:
        def __cuda_stream__(self) -> Any:
            return value

    pool = DevicePool("sim", capacity=1 << 30)
    with pytest.raises((TypeError, ValueError)):
        pool.allocate(64, stream=Stream())
    assert pool.stats()["allocation.all.current"] == 0


def test_a_bad_stream_in_buffer_free_is_a_value_error_and_keeps_the_buffer() -> None:
    pool = DevicePool("sim", capacity=1 << 30)
    buf = pool.allocate(64)
    for bad in (-1, 1 << 64):
        with pytest.raises(ValueError, match="out of range"):
            buf.free(bad)
    with pytest.raises(TypeError):
        buf.free("default")
    assert not buf.freed
    buf.free()
    assert pool.stats()["allocation.all.current"] == 0


@pytest.mark.parametrize("device", [-1, 1000, "cuda:999", "cuda:-1"])
def test_torch_statistics_of_a_device_that_does_not_exist_are_an_error(device: Any) -> None:
    import vrampool.torch as vt

    for read in (vt.memory_stats, vt.memory_allocated, vt.memory_reserved, vt.memory_summary, vt.reset_peak_memory_stats):
        with pytest.raises(ValueError):
            read(device)


# ---- processes (issue 16) ----


def _run(code: str, timeout: int = 120, prelude: str = "") -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)


#: For the fork tests' scripts: `fork_under_churn(churn, child, forks, pause)` runs `churn(t, stop)`
#: on 4 threads and forks `forks` times, `pause` s apart; each child exits with `child()`'s code (6
#: if it raised). A child is waited for up to 10 s, then killed. Returns (children that hung,
#: children that exited non-zero).
_FORK_UNDER_CHURN = """
import os, threading, time
def reap(pid):
    deadline = time.time() + 10
    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            return 0, int(os.waitstatus_to_exitcode(status) != 0)
        if time.time() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return 1, 0
        time.sleep(0.01)
def fork_under_churn(churn, child, forks, pause):
    stop = threading.Event()
    threads = [threading.Thread(target=churn, args=(t, stop)) for t in range(4)]
    for t in threads:
        t.start()
    hung = failed = 0
    for _ in range(forks):
        time.sleep(pause)
        pid = os.fork()
        if pid == 0:
            code = 6
            try:
                code = child()
            finally:
                os._exit(code)
        child_hung, child_failed = reap(pid)
        hung, failed = hung + child_hung, failed + child_failed
    stop.set()
    for t in threads:
        t.join()
    return hung, failed
"""


def test_a_fork_while_threads_allocate_gives_a_child_that_fails_clearly_and_never_hangs() -> None:
    done = _run(
        """
        from vrampool import DevicePool, PoolClosedError
        pool = DevicePool("sim", capacity=1 << 30, strategy="hybrid")
        def churn(t, stop):
            sizes = (512, 4096, 100 << 10, 3 << 20)
            while not stop.is_set():
                bufs = [pool.allocate(s) for s in sizes]
                for b in bufs:
                    b.free()
                pool.trim()
        def child():
            code = 3
            try:
                pool.allocate(4096)
            except PoolClosedError as e:
                code = 0 if "forked" in str(e) else 4
            fresh = DevicePool("sim", capacity=64 << 20)  # a pool made in the child works
            fresh.allocate(4096).free()
            for call in (pool.stats, pool.trim, pool.snapshot):
                try:
                    call()
                    code = 5
                except PoolClosedError:
                    pass
            return code
        print(*fork_under_churn(churn, child, forks=20, pause=0.01))
        """,
        timeout=400,
        prelude=_FORK_UNDER_CHURN,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "0"], f"children hung, failed: {done.stdout}"


def test_a_fork_while_the_steady_arena_serves_gives_a_child_that_fails_clearly_and_never_hangs() -> None:
    """One thread's loop is served from the steady arena (its lock-free path) when the process
    forks, the others allocate beside it: in the child every call on the pool refuses, an arena
    buffer's free and a close included (a close would list the parent's buffers), and a pool made
    there works."""
    done = _run(
        """
        from vrampool import DevicePool, PoolClosedError
        pool = DevicePool("sim", capacity=1 << 30)
        held = []
        def churn(t, stop):
            while not stop.is_set():
                bufs = [pool.allocate(4096 * (1 + i)) for i in range(10)] if t == 0 else [pool.allocate(512)]
                if t == 0 and not held:
                    held.append(pool.allocate(8192))
                for b in bufs:
                    b.free()
        def child():
            code = 0
            calls = (lambda: pool.allocate(4096), lambda: pool.deallocate(held[0]), lambda: pool.record_stream(held[0], 7),
                     pool.stats, pool.steady_stats, pool.close)
            for call in calls:
                try:
                    call()
                    code = 3
                except PoolClosedError as e:
                    code = code or (0 if "forked" in str(e) else 4)
            fresh = DevicePool("sim", capacity=64 << 20)
            for _ in range(3):
                bufs = [fresh.allocate(4096 * (1 + i)) for i in range(10)]
                for b in bufs:
                    b.free()
            return code if fresh.steady_stats()["replayed_iterations"] == 2 else 5
        print(*fork_under_churn(churn, child, forks=20, pause=0.01))
        """,
        timeout=400,
        prelude=_FORK_UNDER_CHURN,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "0"], f"children hung, failed: {done.stdout}"


def test_daemon_threads_inside_pool_calls_at_interpreter_exit_do_not_abort_the_process() -> None:
    code = """
        import threading
        from vrampool import DevicePool
        pool = DevicePool("sim", capacity=1 << 30)
        planned = pool.planned()
        def churn():
            while True:
                pool.allocate(4096).free()
                pool.trim()
                planned.deallocate(planned.allocate(512))
        for _ in range(4):
            threading.Thread(target=churn, daemon=True).start()
        import time; time.sleep(0.05)
        """
    for _ in range(10):
        done = _run(code)
        assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
        assert "FATAL" not in done.stderr


def test_a_fork_while_threads_hammer_a_planned_pool_gives_children_that_raise_and_never_hang() -> None:
    done = _run(
        """
        from vrampool import DevicePool, PoolClosedError
        planned = DevicePool("sim", capacity=1 << 30).planned()
        def churn(t, stop):
            i = 0
            while not stop.is_set():
                ptrs = [planned.allocate(512 * (1 + (i + k + t) % 9)) for k in range(16)]
                for p in ptrs:
                    planned.deallocate(p)
                planned.step(i % 3)
                planned.stats()
                i += 1
        def child():
            code = 0
            for call in (lambda: planned.allocate(4096), lambda: planned.step(), planned.stats, planned.release_arena,
                         lambda: planned.deallocate(1 << 20), lambda: planned.record_stream(1 << 20, 7)):
                try:
                    call()
                    code = 3
                except PoolClosedError as e:
                    code = code or (0 if "forked" in str(e) else 4)
            return code
        print(*fork_under_churn(churn, child, forks=30, pause=0.005))
        """,
        timeout=400,
        prelude=_FORK_UNDER_CHURN,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "0"], f"children hung, failed: {done.stdout}"


def test_a_daemon_thread_inside_long_native_calls_at_interpreter_exit_leaves_exit_code_0() -> None:
    # Each step plans 300 buffers for up to 200 ms and each plan searches for up to 200 ms: the
    # interpreter finalizes while the thread is inside one, the GIL released.
    code = """
        import threading, time
        from vrampool import DevicePool, planner
        planned = DevicePool("sim", capacity=1 << 30).planned(budget_ms=200)
        rows = [(i, i % 50, i % 50 + 1 + i % 7, 512 * (1 + i * 7 % 97)) for i in range(400)]
        def steps():
            i = 0
            while True:
                ptrs = [planned.allocate(512 * (1 + (i * 7 + k) % 97)) for k in range(300)]
                for p in ptrs[::2] + ptrs[1::2]:
                    planned.deallocate(p)
                planned.step(i % 5)
                i += 1
        def plans():
            while True:
                planner.plan(rows, budget_ms=200)
        threading.Thread(target=steps, daemon=True).start()
        threading.Thread(target=plans, daemon=True).start()
        time.sleep(0.3)
        """
    for _ in range(6):
        done = _run(code)
        assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"


def test_a_plain_malloc_never_throws_even_after_install() -> None:
    pytest.importorskip("torch")
    done = _run(
        """
        import ctypes
        import vrampool.torch as vt
        from vrampool import _native
        try:
            vt.install(device="sim", sim_capacity=64 << 20)
        except Exception as e:
            print("no-install", type(e).__name__)
            raise SystemExit(0)
        lib = ctypes.CDLL(_native.__file__)
        lib.vrampool_malloc.restype = ctypes.c_void_p
        print("null", lib.vrampool_malloc(ctypes.c_size_t(1 << 40), 0, None))
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[0] == "null" and done.stdout.split()[1] == "None", done.stdout
