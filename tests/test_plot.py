"""The SVG plots: parsed back with xml.etree, checked for the series and blocks they must show."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import List

from vrampool import DevicePool
from vrampool.summary import block_state
from vrampool.whatif.plot import memory_timeline_svg, segment_map_svg
from vrampool.whatif.replay import replay

SVG = "{http://www.w3.org/2000/svg}"
MIB = 1 << 20
ROWS = [(0, 0, 2, 4 * MIB), (1, 1, 3, 2 * MIB), (2, 2, 4, 4 * MIB), (3, 3, 6, 3 * MIB)]


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def series(root: ET.Element) -> List[ET.Element]:
    return [e for e in root.iter() if e.get("class") == "series"]


def test_timeline_has_reserved_and_allocated_per_strategy_and_the_bound() -> None:
    reports = replay(ROWS, strategy=["buddy", "hybrid+vm", "plan"])
    root = parse(memory_timeline_svg(reports, "trace & <friends>"))
    found = {(e.get("data-strategy"), e.get("data-kind")) for e in series(root)}
    assert found == {(s, k) for s in ("buddy", "hybrid+vm", "plan") for k in ("reserved", "allocated")} | {("lower bound", "lower-bound")}
    for line in series(root):
        if line.tag == f"{SVG}polyline":
            strategy = line.get("data-strategy")
            report = next(r for r in reports if r["strategy"] == strategy)
            assert len(line.get("points").split()) == len(report["timeline"]["event"]) == 8
    bound = next(e for e in series(root) if e.get("data-kind") == "lower-bound")
    assert bound.get("stroke-dasharray") and bound.get("y1") == bound.get("y2")
    # The y axis speaks MiB, up to above the highest line; the title survives escaping.
    ticks = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "y-tick"]
    assert ticks[0] == "0 MiB" and all(t.endswith(" MiB") for t in ticks)
    top = max(r["peak_reserved_bytes"] for r in reports) / MIB
    assert float(ticks[-1].split()[0].replace(",", "")) >= top * 0.8
    assert root.find(f"{SVG}title").text == "trace & <friends>"
    legend = {t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend"}
    assert {"buddy", "hybrid+vm", "plan", "lower bound"} <= legend


def test_timeline_points_rise_with_memory() -> None:
    # SVG y grows downwards: more bytes, smaller y.
    report = replay(ROWS, strategy="best_fit")
    line = next(e for e in series(parse(memory_timeline_svg([report]))) if e.get("data-kind") == "allocated")
    ys = [float(p.split(",")[1]) for p in line.get("points").split()]
    allocated = report["timeline"]["allocated_bytes"]
    for (y1, a1), (y2, a2) in zip(zip(ys, allocated), zip(ys[1:], allocated[1:])):
        assert (y2 < y1) == (a2 > a1) and (y2 == y1) == (a2 == a1)


def test_timeline_draws_the_recorded_allocator_as_stairs() -> None:
    report = replay(ROWS, strategy="hybrid")
    root = parse(memory_timeline_svg([report], recorded=([0, 3, 5], [0, 20 * MIB, 22 * MIB])))
    stairs = next(e for e in series(root) if e.get("data-strategy") == "pytorch")
    assert len(stairs.get("points").split()) == 5  # each change holds the level before it


def test_segment_map_shows_every_block_in_its_state() -> None:
    with DevicePool("sim", capacity=1 << 30, strategy="hybrid", host_backed=False) as pool:
        live = [pool.allocate(size) for size in (4096, 4096, 3 * MIB, 5 * MIB, 2 * MIB)]
        pool.deallocate(live[3])
        segments = pool.snapshot()["segments"]
        root = parse(segment_map_svg(segments, "peak"))
        ordered = sorted(segments, key=lambda s: (s["strategy"], s["stream"], s["address"]))
        groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "segment"]
        assert [(g.get("data-strategy"), int(g.get("data-size"))) for g in groups] == [(s["strategy"], s["total_size"]) for s in ordered]
        blocks = [r.get("data-state") for r in root.iter(f"{SVG}rect") if r.get("class") == "block"]
        assert blocks == [block_state(b) for s in ordered for b in s["blocks"]]
        # The freed 5 MiB block (a size class) waits in the cache; the rest of the segments is free.
        assert (blocks.count("active"), blocks.count("cached")) == (4, 1) and set(blocks) == {"active", "cached", "free"}
        for block in (r for r in root.iter(f"{SVG}rect") if r.get("class") == "block"):
            assert float(block.get("width")) > 0


def test_segment_map_caps_its_rows() -> None:
    segments = [
        {"strategy": "best_fit", "stream": 0, "address": i * MIB, "total_size": MIB, "blocks": [{"address": i * MIB, "size": MIB, "vrampool_state": "active"}]}
        for i in range(10)
    ]
    root = parse(segment_map_svg(segments, max_rows=4))
    assert len([g for g in root.iter(f"{SVG}g") if g.get("class") == "segment"]) == 4
    assert any("6 more segments" in (t.text or "") for t in root.iter(f"{SVG}text"))
