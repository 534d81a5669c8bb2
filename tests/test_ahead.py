"""Plans made ahead at the largest shape (issue 56, `vrampool.ahead`), on the simulated device
(host memory: every buffer is written through its pointer at its allocation and read back at its
free). A small GPT's training step planned once at sequence length 256 serves steps of shorter
sequences and smaller batches from the very first, with no two live buffers sharing a byte (the
planner's validator run over each step's observed addresses and lifetimes); a larger step and a
step of another model fall back to the pool with their bytes intact. Plan files that are corrupt,
cut short, foreign, of another version or tampered with are refused; bad arguments raise."""

from __future__ import annotations

import ctypes
import doctest
import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np
import pytest

import vrampool.ahead
from vrampool import DevicePool, _native
from vrampool.ahead import Plan, as_plan, plan_step
from vrampool.whatif.ahead import capture, from_trace
from vrampool.whatif.traces import Event, Trace

MIB = 1 << 20


def test_the_docstrings_examples_run() -> None:
    result = doctest.testmod(vrampool.ahead)
    assert result.failed == 0 and result.attempted > 0


# ---- serving: a transformer's step at the largest shape, steps of smaller shapes ----


def gpt_step(seq: int, batch: int, layers: int = 2) -> Callable[[], Any]:
    """A model function (as `vrampool capture --model` takes): a GPT of `layers` blocks for
    sequences up to 256 tokens, trained on `batch` sequences of `seq` tokens."""

    def make() -> Any:
        import torch

        from vrampool.whatif.models import gpt

        tokens = torch.randint(0, 512, (batch, seq))
        return gpt(layers=layers, d_model=64, heads=4, seq_len=256, vocab=512), (tokens, tokens)

    return make


@pytest.fixture(scope="module")
def steps() -> Callable[..., List[Event]]:
    """The events of one steady training step (the second; the first also makes the weights and
    the optimizer's state) of `gpt_step(...)`, captured under fake tensors; cached per shape."""
    pytest.importorskip("torch")
    from vrampool.whatif.training import capture_model

    cache: Dict[Tuple[int, ...], List[Event]] = {}

    def step(seq: int, batch: int, layers: int = 2) -> List[Event]:
        if (seq, batch, layers) not in cache:
            cache[seq, batch, layers] = capture_model(gpt_step(seq, batch, layers), steps=2).steps()[1].events
        return cache[seq, batch, layers]

    return step


def bytes_at(ptr: int, size: int) -> np.ndarray:
    """The bytes at `ptr` as a numpy view (no DLPack export, which would hold the buffer)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(ptr))


def run_step(pool: DevicePool, events: Sequence[Event]) -> None:
    """Replays one step's allocations and frees through `pool` (times: event indices). Each
    buffer is filled with its own byte when allocated and must still hold it when freed; then the
    planner's validator checks that no two buffers live at once shared a byte."""
    live: Dict[int, Tuple[Any, int, int]] = {}
    seen: List[Tuple[int, int, int, int]] = []  # (addr, size, allocated at, freed at)
    for time, e in enumerate(events):
        if e.op == "alloc":
            buf = pool.allocate(e.size)
            value = 1 + len(live) % 255
            bytes_at(buf.ptr, buf.size)[:] = value
            live[e.id] = (buf, value, time)
        elif e.op == "free":
            buf, value, born = live.pop(e.id)
            wrong = np.flatnonzero(bytes_at(buf.ptr, buf.size) != value)
            assert wrong.size == 0, f"buffer {e.id} at {buf.ptr:#x}: byte {wrong[0]} was overwritten while it lived"
            seen.append((buf.ptr, buf.size, born, time))
            pool.deallocate(buf)
    assert not live, "a step frees everything it allocates"
    assert_no_overlap(seen)


def assert_no_overlap(seen: Sequence[Tuple[int, int, int, int]]) -> None:
    """No two of the buffers (addr, size, lower, upper) live at once share a byte: the planner's
    own validator, over offsets from the lowest address."""
    base = min(addr for addr, *_ in seen)
    rows = [(0, size, lower, upper) for _, size, lower, upper in seen]
    _native.check_ahead(rows, [addr - base for addr, *_ in seen], 512)


def allocations(events: Sequence[Event]) -> int:
    return sum(e.op == "alloc" for e in events)


@pytest.fixture(scope="module")
def largest_plan() -> Plan:
    pytest.importorskip("torch")
    return capture(gpt_step(256, 8))


def test_a_plan_at_the_largest_shape_serves_smaller_steps_from_the_first(steps: Callable[..., List[Event]], largest_plan: Plan) -> None:
    """Planned once at 8 sequences of 256 tokens: steps of 128, 64, 200, 32 and 256 tokens, of
    8, 4 and 2 sequences, each come wholly from the plan, the first one included."""
    plan = largest_plan
    assert plan.source.startswith("capture of") and plan.step == 1
    assert len(plan.rows) == allocations(steps(256, 8))
    assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.lower_bound_bytes * 1.01
    pool = DevicePool("sim", capacity=1 << 30, plan=plan)
    shapes = [(128, 8), (64, 2), (256, 4), (200, 8), (32, 2), (256, 8), (128, 8)]
    served = 0
    for number, shape in enumerate(shapes, 1):
        events = steps(*shape)
        assert len(events) > 100 and allocations(events) == len(plan.rows), shape
        run_step(pool, events)
        served += allocations(events)
        s = pool.steady_stats()
        assert (s["planned_allocations"], s["dynamic_allocations"], s["fallbacks"]) == (served, 0, 0), (shape, s)
        assert s["replayed_iterations"] == number
    assert pool.steady_stats()["arena_live"] == 0
    assert pool.stats()["allocation.all.current"] == 0
    assert pool.close() == []


def test_a_larger_step_and_another_models_step_fall_back_with_their_bytes_intact(steps: Callable[..., List[Event]], largest_plan: Plan) -> None:
    """A step of 16 sequences (larger than planned) leaves the plan at its first allocation; a
    step of a three-block model at 64 tokens follows the plan through its first two blocks, then
    leaves it; the pool serves the rest, every byte intact and no two buffers overlapping; the
    step after each is served whole again."""
    pool = DevicePool("sim", capacity=1 << 30, plan=largest_plan)
    run_step(pool, steps(256, 16))
    s = pool.steady_stats()
    assert s["fallbacks"] == 1 and s["dynamic_allocations"] == allocations(steps(256, 16)) and s["planned_allocations"] == 0, s
    run_step(pool, steps(128, 4))
    s = pool.steady_stats()
    assert s["fallbacks"] == 1 and s["planned_allocations"] == allocations(steps(128, 4)), s
    deeper = steps(64, 4, layers=3)
    run_step(pool, deeper)
    after = pool.steady_stats()
    assert after["fallbacks"] == 2, after
    from_plan = after["planned_allocations"] - s["planned_allocations"]
    assert 0 < from_plan < allocations(deeper) and after["dynamic_allocations"] - s["dynamic_allocations"] == allocations(deeper) - from_plan
    run_step(pool, steps(32, 2))
    assert pool.steady_stats()["fallbacks"] == 2
    # A batch of one makes fewer allocations (some copies become views): wherever it leaves the
    # plan, every byte stays intact and every allocation is served.
    before = pool.steady_stats()
    run_step(pool, steps(32, 1))
    after = pool.steady_stats()
    served = sum(after[k] - before[k] for k in ("planned_allocations", "dynamic_allocations"))
    assert served == allocations(steps(32, 1)) < len(largest_plan.rows)
    assert pool.stats()["allocation.all.current"] == 0


def test_a_step_on_two_streams() -> None:
    """Rows on two streams plan a region each (buffers of one stream never share the other's
    bytes): steps at half and at full size come wholly from them, every byte intact."""
    a, b = 7, 9
    rows = [(a, 2 * MIB, 0, 6), (b, MIB, 1, 3), (a, MIB, 2, 4), (b, MIB, 3, 5), (a, 2 * MIB, 4, 6)]
    plan = plan_step(rows)
    assert plan.arena_bytes == plan.lower_bound_bytes == 5 * MIB  # a: 2 + 2 MiB at once, b: 1 MiB
    pool = DevicePool("sim", capacity=1 << 30, plan=plan)
    for scale in (1, 2, 1, 2):
        sizes = [r[1] // scale for r in rows]
        bufs = [pool.allocate(sizes[0], stream=a)]
        bytes_at(bufs[0].ptr, sizes[0])[:] = 0xA0
        for i, (stream, *_), size in zip(range(1, 5), rows[1:], sizes[1:]):
            bufs.append(pool.allocate(size, stream=stream))
            bytes_at(bufs[-1].ptr, size)[:] = i
            if i >= 2:
                assert (bytes_at(bufs[i - 1].ptr, sizes[i - 1]) == i - 1).all()
                bufs[i - 1].free()
        assert (bytes_at(bufs[0].ptr, sizes[0]) == 0xA0).all() and (bytes_at(bufs[4].ptr, sizes[4]) == 4).all()
        bufs[4].free()
        bufs[0].free()
    s = pool.steady_stats()
    assert (s["planned_allocations"], s["fallbacks"], s["replayed_iterations"]) == (20, 0, 4), s


# ---- from_trace: which step ----


def trace_of(steps: Sequence[Sequence[Tuple[str, int, int]]]) -> Trace:
    """A trace of steps, each a list of ("alloc", id, size) / ("free", id, 0), with step events."""
    events: List[Event] = []
    sizes: Dict[int, int] = {}
    for step in steps:
        for op, ident, size in step:
            sizes.setdefault(ident, size)
            events.append(Event(op, ident, sizes[ident]))
        events.append(Event("step"))
    return Trace(events)


def test_from_trace_picks_the_largest_step_that_frees_what_it_allocates(tmp_path: Path) -> None:
    """Step 0 makes weights that live on (the largest by far), steps 1 and 2 free everything,
    step 2 at the larger shape: step 2 is planned. A step asked for by number is planned as it
    is, its weights live for the whole step."""
    trace = trace_of(
        [
            [("alloc", 1, 64 * MIB), ("alloc", 2, MIB), ("alloc", 3, MIB), ("free", 3, 0), ("free", 2, 0)],
            [("alloc", 4, MIB), ("alloc", 5, 2 * MIB), ("free", 4, 0), ("free", 5, 0)],
            [("alloc", 6, 2 * MIB), ("alloc", 7, 4 * MIB), ("free", 6, 0), ("free", 7, 0)],
        ]
    )
    plan = from_trace(trace, first_step=False)
    assert (plan.step, plan.source, plan.rows, plan.first) == (2, "trace", ((0, 2 * MIB, 0, 2), (0, 4 * MIB, 1, 3)), 0)
    # With the first step (the default): its rows lead, what it leaves live to the end, and step 2's
    # follow on one timeline, so the weights sit beside step 2's buffers.
    joint = from_trace(trace)
    weights, step_2 = ((0, 64 * MIB, 0, 8), (0, MIB, 1, 4), (0, MIB, 2, 3)), ((0, 2 * MIB, 5, 7), (0, 4 * MIB, 6, 8))
    assert (joint.step, joint.first, joint.rows) == (2, 3, weights + step_2)
    assert joint.arena_bytes == 64 * MIB + 6 * MIB and joint.without_first_step().rows == step_2
    first = from_trace(trace, step=0)
    assert (first.rows, first.first) == (((0, 64 * MIB, 0, 5), (0, MIB, 1, 4), (0, MIB, 2, 3)), 0)
    path = tmp_path / "t.jsonl"
    trace.write(path)
    assert from_trace(path).source == str(path) and from_trace(str(path), 1, first_step=False).rows == ((0, MIB, 0, 2), (0, 2 * MIB, 1, 3))
    # Rows (id, lower, upper, size, stream) make one step.
    assert from_trace([(0, 0, 2, 4096, 3), (1, 1, 3, 512, 3)]).rows == ((3, 4096, 0, 2), (3, 512, 1, 3))


def test_a_device_pool_serves_a_whole_run_from_a_plan_with_its_first_step() -> None:
    """Weights, then steps of varying size that each keep their batch until the next exists:
    `DevicePool(plan=from_trace(...))`, with no step markers, serves every allocation from the
    plan (each step ends by itself once only its batch is live), and makes no device call after
    the arena. The peak allocated is the most the buffers held, not the arena's region."""
    steps = [[("alloc", 1, 8 * MIB), ("alloc", 10, MIB), ("alloc", 11, 4 * MIB), ("free", 11, 0)]]
    for i, scale in enumerate([2, 1, 4, 3, 4, 1], start=2):
        batch, previous, work = 10 * i, 10 * (i - 1), 10 * i + 1
        steps.append([("alloc", batch, scale * MIB // 2), ("free", previous, 0), ("alloc", work, scale * 2 * MIB), ("free", work, 0)])
    trace = trace_of(steps)
    plan = from_trace(trace)
    assert plan.first == 3
    pool = DevicePool("sim", capacity=1 << 30, plan=plan)
    live: Dict[int, Any] = {}
    calls = None
    most = 0
    for event in trace.events:
        if event.op == "alloc":
            live[event.id] = pool.allocate(event.size)
            most = max(most, sum(b.size for b in live.values()))
        elif event.op == "free":
            live.pop(event.id).free()
        elif calls is None:  # the end of the first step
            calls = pool.stats()["num_device_alloc"]
    assert pool.stats()["allocated_bytes.all.peak"] == most < pool.steady_stats()["arena_bytes"]
    stats = pool.steady_stats()
    allocations = sum(1 for e in trace.events if e.op == "alloc")
    assert (stats["planned_allocations"], stats["dynamic_allocations"], stats["fallbacks"]) == (allocations, 0, 0)
    assert stats["replayed_iterations"] == len(steps) and pool.stats()["num_device_alloc"] == calls
    for buffer in live.values():
        buffer.free()


@pytest.mark.parametrize("step", [3, -1, True, "1"])
def test_from_trace_refuses_a_step_it_does_not_have(step: Any) -> None:
    trace = trace_of([[("alloc", 1, 512), ("free", 1, 0)]] * 3)
    with pytest.raises(ValueError, match="is not a step of the trace: it has 3 steps"):
        from_trace(trace, step=step)
    with pytest.raises(ValueError, match="holds no allocations"):
        from_trace(Trace([Event("step")]))


# ---- the file ----


def small_plan() -> Plan:
    return plan_step([(0, 8192, 0, 3), (0, 4096, 1, 2), (0, 8192, 2, 4)], source="rows", step=None)


def rewrite(path: Path, change: Callable[[Dict[str, Any]], None], checksum: bool = True) -> None:
    """Changes the saved document, recomputing its checksum unless told not to."""
    document = json.loads(path.read_text())
    change(document)
    if checksum and isinstance(document.get("plan"), dict):
        canonical = json.dumps(document["plan"], sort_keys=True, separators=(",", ":"))
        document["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    path.write_text(json.dumps(document))


def test_a_plan_file_round_trips_and_serves_through_device_pool(tmp_path: Path) -> None:
    plan = small_plan()
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded == plan and as_plan(str(path)) == plan and as_plan(plan) is plan
    document = json.loads(path.read_text())
    assert (document["format"], document["version"]) == ("vrampool-plan-ahead", 2)
    assert document["plan"]["buffers"] == [[*r, o] for r, o in zip(plan.rows, plan.offsets)]
    for given in (path, str(path), loaded):
        pool = DevicePool("sim", capacity=1 << 30, plan=given)
        a, b = pool.allocate(8000), pool.allocate(4000)
        b.free()
        c = pool.allocate(8192)
        assert c.ptr - a.ptr == plan.offsets[2] - plan.offsets[0]
        a.free()
        c.free()
        assert pool.steady_stats()["planned_allocations"] == 3
    pool.set_plan(None)  # back to the steady arena
    pool.deallocate(pool.allocate(4096))


def test_a_large_plan_round_trips_a_buffer_a_line(tmp_path: Path) -> None:
    """20,000 buffers on two streams (numpy ints will do): saved a buffer a line, loaded equal."""
    rows = [(np.int64(i % 2), np.int32(512 * (1 + i % 7)), i, i + 5) for i in range(20_000)]
    plan = plan_step(rows)
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan and len(path.read_text().splitlines()) == 20_000 + 15
    assert all(type(v) is int for row in plan.rows for v in row)


def overlapping(document: Dict[str, Any]) -> None:
    """Buffer 1 moved onto buffer 0, which lives at the same time (aligned, so only the overlap is wrong)."""
    document["plan"]["buffers"][1][4] = document["plan"]["buffers"][0][4]


TAMPERED: Dict[str, Tuple[Callable[[Dict[str, Any]], None], bool, str]] = {
    "two buffers share bytes": (overlapping, True, "not a valid plan: buffers 0 and 1 are both live"),
    "an offset changed, checksum kept": (overlapping, False, "checksum does not match"),
    "a misaligned offset": (lambda d: d["plan"]["buffers"][0].__setitem__(4, 100), True, "not a multiple of the alignment"),
    "a size grown into its neighbour": (lambda d: d["plan"]["buffers"][0].__setitem__(1, 1 << 20), True, "share bytes"),
    "the figures changed": (lambda d: d["plan"].__setitem__("arena_bytes", 1), True, "arena_bytes is 1, the plan needs"),
    "version 3": (lambda d: d.__setitem__("version", 3), True, "version 3; this vrampool reads versions 1 to 2"),
    "no first step count": (lambda d: d["plan"].pop("first"), True, "first must be an int"),
    "a first step of every buffer": (lambda d: d["plan"].__setitem__("first", 3), True, "leaves none of the plan's 3"),
    "no version": (lambda d: d.pop("version"), True, "version None"),
    "another format": (lambda d: d.__setitem__("format", "onnx"), True, "format is 'onnx'"),
    "a buffer of four values": (lambda d: d["plan"]["buffers"][0].pop(), True, r"\[stream, size, lower, upper, offset\]"),
    "a negative offset": (lambda d: d["plan"]["buffers"][0].__setitem__(4, -512), True, "offset 0 must be an int in"),
    "a string for a size": (lambda d: d["plan"]["buffers"][0].__setitem__(1, "8192"), True, "size must be an int"),
    "an alignment of 100": (lambda d: d["plan"].__setitem__("alignment", 100), True, "alignment must be a power of two"),
    "no buffers": (lambda d: d["plan"].__setitem__("buffers", []), True, "at least one buffer"),
    "no plan": (lambda d: d.pop("plan"), True, "no plan object"),
}


def test_a_version_1_file_without_a_first_step_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    small_plan().save(path)

    def as_version_1(document: Dict[str, Any]) -> None:
        document["version"] = 1
        del document["plan"]["first"]

    rewrite(path, as_version_1)
    assert Plan.load(path) == small_plan() and Plan.load(path).first == 0


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_plan_file_is_refused(tmp_path: Path, case: str) -> None:
    change, checksum, message = TAMPERED[case]
    path = tmp_path / "plan.json"
    small_plan().save(path)
    rewrite(path, change, checksum)
    with pytest.raises(ValueError, match=message) as info:
        Plan.load(path)
    assert str(info.value).startswith(f"{path}: not a usable vrampool plan")
    with pytest.raises(ValueError):
        DevicePool("sim", capacity=1 << 30, plan=path)


@pytest.mark.parametrize(
    "content, message",
    [
        (lambda text: text[: len(text) // 2], "not JSON, or cut short"),
        (lambda text: "", "not JSON, or cut short"),
        (lambda text: text.replace('"plan":', '"plan";', 1), "not JSON, or cut short"),
        (lambda text: '{"op": "alloc", "id": 1, "size": 512}\n', "format is None"),
        (lambda text: "[1, 2, 3]", "format is None"),
        (lambda text: "[" * 100_000, "nested too deeply"),
    ],
    ids=["truncated", "empty", "corrupt", "a trace", "a list", "deeply nested"],
)
def test_a_corrupt_truncated_or_foreign_file_is_refused(tmp_path: Path, content: Callable[[str], str], message: str) -> None:
    path = tmp_path / "plan.json"
    small_plan().save(path)
    path.write_text(content(path.read_text()))
    with pytest.raises(ValueError, match=message):
        Plan.load(path)


def test_a_binary_or_missing_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(b"\x80\x04\x95\xff\xfe binary")
    with pytest.raises(ValueError, match="is not UTF-8"):
        Plan.load(path)
    with pytest.raises(OSError):
        Plan.load(tmp_path / "missing.json")


# ---- bad arguments ----


@pytest.mark.parametrize(
    "rows, error, message",
    [
        ([(0, 512, 0)], ValueError, r"row 0: a step's buffer is \(stream, size, lower, upper\)"),
        ([(0, 0, 0, 1)], ValueError, "size must be at least 1 byte"),
        ([(0, 512, 2, 2)], ValueError, r"upper \(2\) must exceed lower \(2\)"),
        ([(-1, 512, 0, 1)], ValueError, r"stream must be an int in \[0, 2\*\*64\)"),
        ([(0, 1 << 64, 0, 1)], ValueError, "size must be an int in"),
        ([(0, 512.0, 0, 1)], TypeError, "size must be an int, not float"),
        ([(0, True, 0, 1)], TypeError, "size must be an int, not bool"),
        ([], ValueError, "no buffers to plan"),
        ("plan.json", TypeError, "not a file name"),
        ([None], ValueError, "row 0"),
    ],
)
def test_plan_step_refuses_bad_rows(rows: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        plan_step(rows)


def test_bad_arguments_are_refused_with_clear_errors(tmp_path: Path) -> None:
    rows = [(0, 512, 0, 1)]
    for alignment in (100, 256, 2 << 30):
        with pytest.raises(ValueError, match="alignment must be a power of two from 512 B to 1 GiB"):
            plan_step(rows, alignment=alignment)
    with pytest.raises(ValueError, match=r"alignment must be an int in \[1, 2\*\*64\), got 0"):
        plan_step(rows, alignment=0)
    with pytest.raises(TypeError, match="alignment must be an int"):
        plan_step(rows, alignment=True)
    with pytest.raises(ValueError, match="budget_ms must be an int in"):
        plan_step(rows, budget_ms=-1)
    with pytest.raises(ValueError, match="not a valid plan: buffers 0 and 1"):
        Plan(((0, 512, 0, 2), (0, 512, 1, 3)), (0, 0))
    with pytest.raises(ValueError, match="not a valid plan: 1 offsets given for 2 buffers"):
        Plan(((0, 512, 0, 2), (0, 512, 1, 3)), (0,))
    with pytest.raises(TypeError, match="plan must be a vrampool.ahead.Plan or the path of a saved one, not int"):
        DevicePool("sim", capacity=1 << 30, plan=123)  # type: ignore[arg-type]
    with pytest.raises(OSError):
        DevicePool("sim", capacity=1 << 30, plan=tmp_path / "missing.json")
    plan = plan_step(rows)
    with pytest.raises(ValueError, match="aligned to 512 B, the pool's blocks to 4096 B"):
        DevicePool("sim", capacity=1 << 30, alignment=4096, plan=plan)
    DevicePool("sim", capacity=1 << 30, alignment="4KB", plan=plan_step(rows, alignment=4096)).close()
    with pytest.raises(vrampool.OutOfMemoryError):
        DevicePool("sim", capacity=1 << 20, plan=plan_step([(0, 64 * MIB, 0, 1)]))
    with pytest.raises(ValueError, match="steps must be a positive int"):
        capture(lambda: None, steps=0)
    with pytest.raises(TypeError, match="fn must be callable"):
        capture(42)  # type: ignore[arg-type]


def test_a_plan_is_refused_while_the_steady_arenas_buffers_live() -> None:
    """The steady arena serves a repeated step; with its buffers live a plan cannot be set (their
    bytes would be taken twice); once they are freed it can."""
    pool = DevicePool("sim", capacity=1 << 30)
    for _ in range(3):
        bufs = [pool.allocate(4096 * (i + 1)) for i in range(8)]
        if _ < 2:
            for buf in bufs:
                buf.free()
    assert pool.steady_stats()["arena_live"] == 8
    with pytest.raises(ValueError, match="buffers of the arena are still live"):
        pool.set_plan(small_plan())
    for buf in bufs:
        buf.free()
    pool.set_plan(small_plan())


def test_capture_with_example_inputs_and_its_errors() -> None:
    """`capture(fn, *inputs)`: each step copies the example (meta) inputs in, as a loop copies its
    batch to the device; the real model is left as it was. An op fake tensors cannot run is one line."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    before = [p.detach().clone() for p in model.parameters()]

    def train_step(x: Any) -> None:
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # leaves (fake) zeros as gradients

    plan = capture(train_step, torch.empty(32, 64, device="meta"), steps=2)
    assert plan.rows[0][1] == 32 * 64 * 4 and plan.source == "capture of test_capture_with_example_inputs_and_its_errors.<locals>.train_step"
    assert plan.step == 1  # the first step also made the optimizer's state, which lives on
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())) and all(p.grad is None for p in model.parameters())
    assert len(optimizer.state) == 0, "the optimizer's state is as it was"
    train_step(torch.randn(32, 64))  # and it trains for real
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="cannot run on fake tensors"):
        capture(lambda x: torch.nonzero(x).sum().item(), torch.empty(4, device="meta"))


# ---- vrampool.torch and the command ----


def steps_under_install(run_python: Callable[..., str], plan: Path, figure: str, after: Sequence[str] = ()) -> str:
    """Runs, in a fresh interpreter under `install(plan=plan)` on the simulated device, a 3 MiB
    buffer made first that lives on (the weights), then five training steps of four buffers
    each, scaled down 1, 1, 2, 4 and 1 times, through the C ABI's `vrampool_malloc` and
    `vrampool_free` (no GPU), each ended by an optimizer step. Prints `figure` (an expression
    of `s`, the planned stats, and `calls`, the device allocations before the weights) after
    each step, as one JSON list, then runs the lines `after`, then frees the weights."""
    epilogue = "\n        ".join(after)
    return run_python(
        f"""
        import ctypes, json, torch
        import vrampool.torch as vt
        from vrampool._native import abi_stats
        from vrampool.ahead import plan_step
        vt.install(device="sim", sim_capacity="1GB", plan={str(plan)!r})
        lib = ctypes.CDLL(vt.library_path())
        lib.vrampool_malloc.restype = ctypes.c_void_p
        lib.vrampool_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.vrampool_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        calls = abi_stats(0)["num_device_alloc"]
        weights = lib.vrampool_malloc(3 << 20, 0, None)   # lives on: made in the first step
        figures = []
        for scale in (1, 1, 2, 4, 1):
            mb = lambda n: (n << 20) // scale
            batch = lib.vrampool_malloc(mb(4), 0, None)
            a = lib.vrampool_malloc(mb(8), 0, None)
            b = lib.vrampool_malloc(mb(8), 0, None)
            lib.vrampool_free(a, mb(8), 0, None)
            c = lib.vrampool_malloc(mb(2), 0, None)
            lib.vrampool_free(b, mb(8), 0, None)
            lib.vrampool_free(c, mb(2), 0, None)
            lib.vrampool_free(batch, mb(4), 0, None)
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
            s = vt.planned_stats(0)
            figures.append({figure})
        print(json.dumps(figures))
        {epilogue}
        lib.vrampool_free(weights, 3 << 20, 0, None)
        """
    )


def test_torch_install_sets_the_plan_at_the_end_of_the_first_optimizer_step(run_python: Callable[..., str], tmp_path: Path) -> None:
    """`install(plan=path)`: the first step (with the weights and the optimizer's state, which
    live on) runs on the pool; at its optimizer step the plan is set, and every later step of a
    smaller shape comes from it whole (steps end at each optimizer step). The steps' buffers come
    from the C ABI here: no GPU."""
    pytest.importorskip("torch")
    path = tmp_path / "plan.json"
    plan_step([(0, 4 * MIB, 0, 5), (0, 8 * MIB, 1, 3), (0, 8 * MIB, 2, 4), (0, 2 * MIB, 3, 5)]).save(path)
    refusal = [
        "vt.set_plan(None)",
        "try:",
        "    vt.set_plan(plan_step([(0, 512, 0, 1)], alignment=1024), device=200)",
        "except ValueError as e:",
        '    print("refused:", e)',
    ]
    out = steps_under_install(run_python, path, '[s["planned_allocations"], s["fallbacks"]]', refusal)
    lines = out.splitlines()
    assert json.loads(lines[-2]) == [[0, 0], [4, 0], [8, 0], [12, 0], [16, 0]], out
    assert lines[-1].startswith("refused: invalid device 200"), out


def test_torch_install_sets_a_plan_with_a_first_step_at_once_and_serves_the_weights_from_it(run_python: Callable[..., str], tmp_path: Path) -> None:
    """`install(plan=)` with a plan that has a first step of its own (the weights, then a step):
    set at install, so the weights and the first step are the plan's too, and no device call
    follows the arena's."""
    pytest.importorskip("torch")
    path = tmp_path / "plan.json"
    first = [(0, 3 * MIB, 0, 20), (0, 4 * MIB, 1, 8), (0, 8 * MIB, 2, 4), (0, 8 * MIB, 3, 6), (0, 2 * MIB, 5, 7)]
    steps = [(0, 4 * MIB, 10, 17), (0, 8 * MIB, 11, 13), (0, 8 * MIB, 12, 15), (0, 2 * MIB, 14, 16)]
    plan = plan_step(first + steps, first=len(first))
    plan.save(path)
    assert Plan.load(path).first == 5
    out = steps_under_install(run_python, path, '[s["planned_allocations"], s["fallbacks"], abi_stats(0)["num_device_alloc"] - calls]')
    assert json.loads(out.splitlines()[-1]) == [[5, 0, 0], [9, 0, 0], [13, 0, 0], [17, 0, 0], [21, 0, 0]], out


def test_torch_install_waits_for_the_steady_arenas_buffers_before_setting_the_plan(run_python: Callable[..., str]) -> None:
    """A loop served by the steady arena keeps its last step's buffers past the first optimizer
    step: the plan waits (their bytes are the arena's) and is set at the next optimizer step."""
    pytest.importorskip("torch")
    out = run_python(
        """
        import ctypes, json, torch
        import vrampool.torch as vt
        from vrampool.ahead import plan_step
        vt.install(device="sim", sim_capacity="1GB", plan=plan_step([(0, 1 << 20, 0, 2), (0, 1 << 20, 1, 2)]))
        lib = ctypes.CDLL(vt.library_path())
        lib.vrampool_malloc.restype = ctypes.c_void_p
        lib.vrampool_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.vrampool_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        sizes = [4096 * (i + 1) for i in range(8)]
        for it in range(3):   # steps the steady arena records, then serves; the last one's buffers live on
            live = [lib.vrampool_malloc(n, 0, None) for n in sizes]
            if it < 2:
                for p, n in zip(live, sizes):
                    lib.vrampool_free(p, n, 0, None)
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer.step()
        waited = vt.planned_stats(0)["arena_live"]
        for p, n in zip(live, sizes):
            lib.vrampool_free(p, n, 0, None)
        optimizer.step()
        before = vt.planned_stats(0)
        a, b = lib.vrampool_malloc(1 << 20, 0, None), lib.vrampool_malloc(1 << 19, 0, None)
        s = vt.planned_stats(0)
        print(json.dumps([waited, s["planned_allocations"] - before["planned_allocations"], s["fallbacks"] - before["fallbacks"], b - a]))
        """
    )
    waited, planned, fallbacks, apart = json.loads(out.splitlines()[-1])
    assert (waited, planned, fallbacks, apart) == (8, 2, 0, 1 << 20), out


def test_a_captured_plan_set_on_the_c_abis_pool_on_the_simulated_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan captured at the C ABI's alignment; `set_plan` sets it on the C ABI's pool at once,
    refuses one aligned below the pools' blocks and a bad file."""
    torch = pytest.importorskip("torch")
    import vrampool.torch as vt

    monkeypatch.delenv("VRAMPOOL_CONF", raising=False)
    _native._abi_reset()
    try:
        vt.configure(device="sim", sim_capacity="256MB", alignment=1024)
        layer = torch.nn.Linear(16, 16)
        alignment = int(vt.configuration()["alignment"])
        plan = capture(lambda x: layer(x).sum().backward(), torch.empty(8, 16, device="meta"), steps=1, alignment=alignment)
        assert plan.alignment == 1024 and all(o % 1024 == 0 for o in plan.offsets)
        vt.set_plan(plan)
        assert vt.planned_stats(0)["arena_bytes"] >= plan.arena_bytes
        with pytest.raises(ValueError, match="aligned to 512 B, the pool's blocks to 1024 B"):
            vt.set_plan(plan_step([(0, 512, 0, 1)]))
        with pytest.raises(TypeError):
            vt.set_plan(3.5)  # type: ignore[arg-type]
        vt.set_plan(None)
    finally:
        _native._abi_reset()


def test_the_plan_command_saves_a_traces_largest_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vrampool.whatif.cli import main

    trace = trace_of(
        [
            [("alloc", 1, 64 * MIB), ("alloc", 2, MIB), ("free", 2, 0)],
            [("alloc", 4, MIB), ("alloc", 5, 2 * MIB), ("free", 4, 0), ("free", 5, 0)],
        ]
    )
    path, saved = tmp_path / "g.jsonl", tmp_path / "plan.json"
    trace.write(path)
    assert main(["plan", "--trace", str(path), "--save", str(saved)]) == 0
    out = capsys.readouterr().out
    assert f"step         1 of {path}, 2 buffers on 1 stream(s)" in out and f"saved        {saved}" in out
    assert Plan.load(saved) == from_trace(path, step=1)
    assert main(["plan", "--trace", str(path), "--step", "0", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["step"] == 0 and figures["buffers"] == 2 and figures["saved"] is None and figures["alignment"] == 512


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trace", "{trace}", "--step", "5"], "step 5 is not a step of the trace: it has 2 steps"),
        (["--trace", "{missing}"], "No such file or directory"),
        (["--trace", "{trace}", "--alignment", "100"], "alignment must be a power of two"),
        (["--trace", "{trace}", "--capacity", "4096"], "--capacity is for --input"),
        (["--trace", "{trace}", "--save", "{missing}/p.json"], "cannot write {missing}/p.json: no folder {missing}"),
        (["--input", "{trace}", "--save", "p.json"], "--save plans a trace's step ahead: give --trace"),
        (["--input", "{trace}", "--step", "1"], "--step plans a trace's step ahead: give --trace"),
        (["--trace", "{plan}"], "line 1"),
    ],
)
def test_the_plan_command_says_what_is_wrong_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: List[str], message: str) -> None:
    from vrampool.whatif.cli import main

    trace = tmp_path / "g.jsonl"
    trace_of([[("alloc", 1, MIB), ("free", 1, 0)]] * 2).write(trace)
    plan = tmp_path / "plan.json"
    small_plan().save(plan)
    names = {"trace": trace, "missing": tmp_path / "missing", "plan": plan}
    assert main(["plan", *(a.format(**names) for a in args)]) == 1
    err = capsys.readouterr().err
    assert message.format(**names) in err and err.count("\n") == 1 and "Traceback" not in err, err
