"""Traces: capture on the CPU, converters from PyTorch snapshots and vrampool's event log, and
the readers of every format."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Dict, List

import pytest

from vrampool.whatif.capture import capture
from vrampool.whatif.traces import Event, Trace, from_event_log, from_snapshot, load_snapshot, read

MIB = 1 << 20
SEG = 0x7F00_0000_0000


def entry(action: str, addr: int, size: int, stream: int = 0) -> Dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, "frames": []}


def hand_made_snapshot() -> Dict[str, Any]:
    """One 20 MiB segment. A (2 MiB) and B (1 MiB) are allocated; A's free is requested, then
    completed; C reuses A's address; D, allocated before the record began, is freed; E was live
    all along (only the segments show it). A second, busier-looking stream handle for C."""
    a, b, d, e = SEG, SEG + 2 * MIB, SEG + 3 * MIB, SEG + 4 * MIB
    trace = [
        entry("segment_alloc", SEG, 20 * MIB),
        entry("alloc", a, 2 * MIB),
        entry("alloc", b, MIB),
        entry("free_requested", a, 2 * MIB),
        entry("free_completed", a, 2 * MIB),
        entry("alloc", a, 512, stream=0xBEEF),
        entry("free_completed", d, 4096),
        {"action": "snapshot"},
        entry("segment_alloc", SEG + 20 * MIB, 2 * MIB),
        entry("segment_free", SEG + 20 * MIB, 2 * MIB),
    ]
    blocks = [
        {"address": a, "size": 512, "requested_size": 512, "state": "active_allocated"},
        {"address": b, "size": MIB, "requested_size": MIB, "state": "active_allocated"},
        {"address": e, "size": 8192, "requested_size": 8000, "state": "active_allocated"},
        {"address": SEG + 5 * MIB, "size": 15 * MIB, "state": "inactive"},
    ]
    segment = {"device": 0, "address": SEG, "total_size": 20 * MIB, "stream": 0, "segment_type": "large", "blocks": blocks}
    return {"segments": [segment], "device_traces": [trace], "allocator_settings": {}}


def test_snapshot_converts_allocs_at_alloc_and_frees_at_free_completed() -> None:
    trace = from_snapshot(hand_made_snapshot())
    ops = [(e.op, e.size, e.stream) for e in trace.events]
    # D (freed, allocation unseen) and E (live, allocation unseen) are allocated first.
    assert ops == [
        ("alloc", 4096, 0),
        ("alloc", 8192, 0),
        ("alloc", 2 * MIB, 0),
        ("alloc", MIB, 0),
        ("free", 2 * MIB, 0),
        ("alloc", 512, 1),
        ("free", 4096, 0),
    ]
    ids = [e.id for e in trace.events]
    assert ids[2] == ids[4] and ids[5] != ids[2], "a reused address is a new buffer"
    # B, C and E stay live to the end; the peak is D + E + A + B.
    assert trace.peak_allocated_bytes() == 4096 + 8192 + 3 * MIB
    assert len(trace.rows()) == 5


def test_snapshot_reserved_ends_at_the_segments_total() -> None:
    trace = from_snapshot(hand_made_snapshot())
    # 20 MiB at the end; the first segment_alloc was inside the record, so 0 before it.
    assert trace.reserved == [(0, 0), (2, 20 * MIB), (7, 22 * MIB), (7, 20 * MIB)]
    assert trace.peak_reserved_bytes() == 22 * MIB
    without_segments = {**hand_made_snapshot(), "segments": None}
    assert from_snapshot(without_segments).peak_reserved_bytes() == 22 * MIB
    assert Trace([Event("alloc", 1, 10)]).peak_reserved_bytes() is None


def test_snapshot_blocks_without_addresses_lie_back_to_back() -> None:
    # Snapshots torch builds from a profile give blocks no address: E is 4 MiB into its segment.
    snap = hand_made_snapshot()
    blocks = snap["segments"][0]["blocks"]
    snap["segments"][0]["blocks"] = [
        {"size": 512, "state": "active_allocated"},
        {"size": 2 * MIB - 512, "state": "inactive"},
        {"size": MIB, "state": "active_allocated"},
        {"size": MIB, "state": "inactive"},
        {"size": 8192, "state": "active_pending_free"},
        {"size": 16 * MIB - 8192, "state": "inactive"},
    ]
    assert [(e.op, e.size) for e in from_snapshot(snap).events] == [(e.op, e.size) for e in from_snapshot({**snap, "segments": [{**snap["segments"][0], "blocks": blocks}]}).events]
    snap["segments"][0]["blocks"][3] = {"size": "1 MiB", "state": "inactive"}
    with pytest.raises(ValueError, match=r"segments\[0\]: blocks\[3\]: size"):
        from_snapshot(snap)


def test_snapshot_made_by_pytorch_from_a_cpu_profile() -> None:
    # torch's memory viz builds a snapshot (device_traces, segments) from a profile; on the CPU
    # that is the closest to a real one this machine can make.
    torch = pytest.importorskip("torch")
    to_snapshot = pytest.importorskip("torch.cuda._memory_viz")._profile_to_snapshot
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    with torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
        for batch in (16, 48):
            model(torch.randn(batch, 64)).sum().backward()
    snapshot = to_snapshot(prof)
    trace = from_snapshot(snapshot)
    allocs = [e for e in trace.events if e.op == "alloc"]
    assert len(allocs) >= 10 and len({e.id for e in allocs}) == len(allocs)
    # The largest activation: 48 rows of 256 floats.
    assert max(e.size for e in allocs) >= 48 * 256 * 4
    assert trace.peak_reserved_bytes() is None  # a profile records no segments
    assert Trace.from_jsonl(trace.to_jsonl()).rows() == trace.rows()


def test_snapshot_device_choice() -> None:
    snap = hand_made_snapshot()
    snap["device_traces"] = [[entry("alloc", SEG, 512)], snap["device_traces"][0]]
    snap["segments"][0]["device"] = 1
    busiest = from_snapshot(snap)
    assert len(busiest.events) == 7
    assert [e.size for e in from_snapshot(snap, device=0).events] == [512]
    snap["device_traces"].append([])
    with pytest.raises(ValueError, match="no trace entries for device 2"):
        from_snapshot(snap, device=2)


def test_snapshot_pickles_are_read_by_extension_and_by_content(tmp_path: Path) -> None:
    data = pickle.dumps(hand_made_snapshot())
    for name in ("snap.pickle", "snap.pkl", "snapshot-without-extension"):
        (tmp_path / name).write_bytes(data)
        assert [e.op for e in read(tmp_path / name).events] == [e.op for e in from_snapshot(hand_made_snapshot()).events]
    assert load_snapshot(tmp_path / "snap.pickle")["device_traces"]
    assert from_snapshot(tmp_path / "snap.pickle").peak_reserved_bytes() == 22 * MIB


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s["device_traces"][0].__setitem__(1, entry("alloc", -5, 512)), r"device_traces\[0\]\[1\] \(alloc\): addr"),
        (lambda s: s["device_traces"][0][2].__setitem__("size", "big"), r"device_traces\[0\]\[2\] \(alloc\): size"),
        (lambda s: s["device_traces"][0].__setitem__(3, entry("alloc", SEG, 512)), r"device_traces\[0\]\[3\].*allocated again"),
        (lambda s: s["device_traces"][0].__setitem__(4, "free"), r"device_traces\[0\]\[4\]: expected a dict"),
        (lambda s: s["device_traces"][0].__setitem__(5, {"action": 7}), r"device_traces\[0\]\[5\]: `action`"),
        (lambda s: s["device_traces"][0].__setitem__(1, entry("alloc", SEG, 0)), r"device_traces\[0\]\[1\].*at least 1 byte"),
        (lambda s: s["segments"][0].__setitem__("total_size", None), r"segments\[0\]: total_size"),
        (lambda s: s.__setitem__("device_traces", {}), "device_traces"),
    ],
)
def test_bad_snapshots_name_the_entry(mutate: Any, message: str) -> None:
    snap = hand_made_snapshot()
    mutate(snap)
    with pytest.raises(ValueError, match=message):
        from_snapshot(snap)


def test_bad_pickles_are_value_errors(tmp_path: Path) -> None:
    import collections

    cases = {
        "class.pickle": pickle.dumps(collections.OrderedDict(a=1)),  # a class: refused, never run
        "list.pickle": pickle.dumps([1, 2]),
        "torn.pickle": pickle.dumps(hand_made_snapshot())[:100],
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match="snapshot"):
            read(tmp_path / name)


def test_event_log_converts_dicts_and_tuples() -> None:
    log: List[Any] = [
        {"kind": "segment_alloc", "addr": SEG, "size": 2 * MIB, "stream": 0},
        (10, "alloc", SEG, 4096, 0),
        (20, "alloc", SEG + 4096, 512, 3),
        (30, "free", SEG, 4096, 0),
        (40, "free", SEG + 8192, 1024, 0),  # allocated before the log began
        {"kind": "segment_free", "addr": SEG, "size": 2 * MIB},
    ]
    trace = from_event_log(log)
    assert [(e.op, e.size, e.stream) for e in trace.events] == [
        ("alloc", 1024, 0),
        ("alloc", 4096, 0),
        ("alloc", 512, 1),
        ("free", 4096, 0),
        ("free", 1024, 0),
    ]
    assert trace.peak_reserved_bytes() == 2 * MIB
    assert trace.reserved[-1] == (5, 0)


def test_a_pools_own_event_log_becomes_a_trace() -> None:
    from vrampool import DevicePool

    with DevicePool("sim", capacity=1 << 30, host_backed=False, record_events=True) as pool:
        a = pool.allocate(3 * MIB)
        b = pool.allocate(4096, stream=7)
        pool.deallocate(a)
        c = pool.allocate(MIB)  # live when the events are taken
        events = pool.take_events()
        assert pool.take_events() == [], "taken once"
        pool.deallocate(b)
        pool.deallocate(c)
    kinds = [e[1] for e in events]
    assert kinds.count("alloc") == 3 and kinds.count("free") == 1 and "segment_alloc" in kinds
    trace = from_event_log(events)
    assert [(e.op, e.size) for e in trace.events if e.op != "step"] == [("alloc", 3 * MIB), ("alloc", 4096), ("free", 3 * MIB), ("alloc", MIB)]
    assert trace.peak_allocated_bytes() == 3 * MIB + 4096
    # The 3 MiB block in two 2 MiB chunks and stream 7's 2 MiB slab segment; the chunks go back
    # (emptied of the cached block) before the 1 MiB block's slab segment comes.
    assert trace.peak_reserved_bytes() == 6 * MIB


@pytest.mark.parametrize(
    "bad, message",
    [
        ((1, "alloc", SEG), "event 1: expected a dict or a"),
        ({"kind": "grow", "addr": 0, "size": 1}, "event 1: kind must be one of"),
        ({"kind": "alloc", "addr": 0, "size": -1}, "event 1: size"),
        ({"kind": "alloc", "addr": SEG, "size": 64}, "event 1: address .* allocated again"),
    ],
)
def test_bad_event_logs_name_the_event(bad: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_event_log([(0, "alloc", SEG, 64, 0), bad])


def test_jsonl_and_csv_round_trips(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    trace = capture(lambda: torch.ones(256).split(64)[0] * torch.arange(64.0))
    assert [e.op for e in trace.events].count("alloc") == 3  # ones, arange, the product: the split is a view
    trace.events.append(Event("step"))
    trace.write(tmp_path / "t.jsonl")
    assert read(tmp_path / "t.jsonl").events == trace.events
    trace.write(tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text().startswith("id,lower,upper,size,stream\n")
    from_csv = read(tmp_path / "t.csv")
    assert from_csv.events == [e for e in trace.events if e.op != "step"]
    assert from_csv.rows() == Trace(from_csv.events).rows()


def test_formats_are_told_apart_by_content(tmp_path: Path) -> None:
    (tmp_path / "rows.txt").write_text("id,lower,upper,size\n0,0,2,512\n1,1,3,1024\n")
    assert [e.op for e in read(tmp_path / "rows.txt").events] == ["alloc", "alloc", "free", "free"]
    (tmp_path / "events.log").write_text('{"op": "alloc", "id": 1, "size": 10}\n{"op": "free", "id": 1}\n')
    assert read(tmp_path / "events.log").peak_allocated_bytes() == 10


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("a.jsonl", '{"op": "alloc", "id": 1, "size": 10}\n{"op": "free", "id": 2}\n', "line 2: free of id 2"),
        ("b.jsonl", '{"op": "alloc", "id": 1, "size": 10}\n\n{"op": "alloc", "id": 2, "size": "x"}\n', "line 3: size"),
        ("c.jsonl", '{"op": "alloc", "id": 1, "size": 10}\n{"op": "alloc"\n', "line 2: "),
        ("d.jsonl", '{"op": "grow", "id": 1}\n', "line 1: op must be one of"),
        ("e.csv", "id,lower,upper,size\n0,0,2,512\n1,3,1,512\n", "line 3: upper"),
        ("f.csv", "id,lower,upper\n0,0,2\n", "line 1: .*lacks the `size` column"),
    ],
)
def test_bad_text_traces_name_the_line(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        read(tmp_path / name)


def test_binary_garbage_is_a_value_error(tmp_path: Path) -> None:
    (tmp_path / "junk.bin").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match="not UTF-8"):
        read(tmp_path / "junk.bin")
