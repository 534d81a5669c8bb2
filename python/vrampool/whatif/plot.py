"""Hand-made SVG plots (no plotting library): memory over a replay, a pool's segment map, and
what each allocator reserves as a training step grows (``vrampool fit``).

>>> from vrampool.whatif.plot import memory_timeline_svg
>>> report = {"strategy": "hybrid", "lower_bound_bytes": 3 << 20, "timeline": {
...     "event": [1, 2], "allocated_bytes": [2 << 20, 3 << 20], "reserved_bytes": [4 << 20, 4 << 20]}}
>>> memory_timeline_svg([report]).startswith("<svg")
True
"""

from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Sequence, Tuple
from xml.sax.saxutils import escape, quoteattr

from vrampool.summary import block_state

MIB = 1 << 20
#: One colour per strategy (Tableau's ten, which stay apart for most colour-blind readers).
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
RECORDED_COLOUR = "#222222"
BLOCK_COLOURS = {"active": "#e15759", "pending_free": "#f28e2b", "cached": "#a0cbe8", "free": "#d4e8d4"}
FONT = 'font-family="sans-serif" font-size="12"'


def _nice_step(span: float, ticks: int = 6) -> float:
    """A 1, 2 or 5 times a power of ten that cuts ``span`` into at most ``ticks`` pieces."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:g}"


def _svg(width: int, height: int, body: List[str], title: str) -> str:
    head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
    background = f'<rect width="{width}" height="{height}" fill="white"/>'
    heading = f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" font-family="sans-serif" font-size="14">{escape(title)}</text>' if title else ""
    return "\n".join([head, f"<title>{escape(title)}</title>", background, heading, *body, "</svg>"]) + "\n"


def _legend(entries: Sequence[Tuple[str, str, str]], x: float, top: float) -> List[str]:
    """A legend right of a plot: (label, colour, dash attribute) a row."""
    out = []
    for row, (label, colour, dash) in enumerate(entries):
        ly = top + 10 + 18 * row
        out.append(f'<line x1="{x}" x2="{x + 24}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"{dash}/>')
        out.append(f'<text class="legend" x="{x + 30}" y="{ly + 4}" {FONT}>{escape(label)}</text>')
    return out


def memory_timeline_svg(
    reports: Sequence[Mapping[str, Any]],
    title: str = "Memory over the replay",
    recorded: Optional[Tuple[Sequence[int], Sequence[int]]] = None,
    width: int = 1000,
    height: int = 440,
) -> str:
    """Reserved (solid) and allocated (dotted) bytes per replay report over its timeline, one
    colour per strategy, with the lower bound as a dashed line; ``recorded`` is an optional
    ``(events, bytes)`` staircase of what the recording allocator (PyTorch) reserved. The lines
    join the timeline's samples, so a spike between two samples can stay below the bound.

    Each line is an element with ``class="series"`` and ``data-strategy`` / ``data-kind``
    (``reserved``, ``allocated``, ``lower-bound``) attributes, for tests and scripts."""
    left, right, top, bottom = 80, 240, 36, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    series: List[Tuple[str, str, str, List[Tuple[float, float]]]] = []  # strategy, kind, colour, points
    for index, report in enumerate(reports):
        colour = PALETTE[index % len(PALETTE)]
        line = report["timeline"]
        for kind in ("reserved", "allocated"):
            series.append((report["strategy"], kind, colour, list(zip(line["event"], line[f"{kind}_bytes"]))))
    if recorded and recorded[0]:
        stairs: List[Tuple[float, float]] = []
        for event, level in zip(*recorded):
            if stairs:  # hold the last level until this change
                stairs.append((event, stairs[-1][1]))
            stairs.append((event, level))
        series.append(("pytorch", "reserved", RECORDED_COLOUR, stairs))
    bound = max((r["lower_bound_bytes"] for r in reports), default=0)
    x_max = max([1] + [p[0] for *_, points in series for p in points])
    y_max = max([bound, MIB] + [p[1] for *_, points in series for p in points]) * 1.05

    def x(event: float) -> float:
        return left + plot_w * event / x_max

    def y(value: float) -> float:
        return top + plot_h * (1 - value / y_max)

    body = [f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']
    step = _nice_step(y_max / MIB)
    for k in range(int(y_max / MIB / step) + 1):
        mib = k * step
        body.append(f'<line x1="{left - 4}" x2="{left + plot_w}" y1="{y(mib * MIB):.1f}" y2="{y(mib * MIB):.1f}" stroke="#eee"/>')
        body.append(f'<text class="y-tick" x="{left - 8}" y="{y(mib * MIB) + 4:.1f}" text-anchor="end" {FONT}>{_number(mib)} MiB</text>')
    x_step = _nice_step(x_max)
    for k in range(int(x_max / x_step) + 1):
        body.append(f'<text class="x-tick" x="{x(k * x_step):.1f}" y="{top + plot_h + 16}" text-anchor="middle" {FONT}>{_number(k * x_step)}</text>')
    body.append(f'<text x="{left + plot_w / 2:.0f}" y="{height - 12}" text-anchor="middle" {FONT}>event</text>')
    for strategy, kind, colour, points in series:
        dash = ' stroke-dasharray="2 3"' if kind == "allocated" else ""
        coords = " ".join(f"{x(e):.1f},{y(b):.1f}" for e, b in points)
        body.append(
            f'<polyline class="series" data-strategy={quoteattr(strategy)} data-kind="{kind}" points="{coords}" '
            f'fill="none" stroke="{colour}" stroke-width="{1.5 if kind == "reserved" else 1}"{dash}/>'
        )
    if bound:
        body.append(
            f'<line class="series" data-strategy="lower bound" data-kind="lower-bound" x1="{left}" x2="{left + plot_w}" '
            f'y1="{y(bound):.1f}" y2="{y(bound):.1f}" stroke="#000" stroke-dasharray="6 4"/>'
        )
    legend = [(s, c, "") for s, k, c, _ in series if k == "reserved"]
    legend += [("allocated (dotted, sampled)", "#777", ' stroke-dasharray="2 3"'), ("lower bound", "#000", ' stroke-dasharray="6 4"')]
    body.extend(_legend(legend, left + plot_w + 16, top))
    return _svg(width, height, body, title)


def segment_map_svg(segments: Sequence[Mapping[str, Any]], title: str = "Segments", width: int = 960, max_rows: int = 64) -> str:
    """A pool's segments (``DevicePool.snapshot()["segments"]``), one bar each on a common byte
    scale, with their blocks coloured by state (``active``, ``pending_free``, ``cached``, ``free``:
    :func:`vrampool.summary.block_state`).

    Each block is a ``<rect class="block" data-state=...>`` inside its segment's
    ``<g class="segment" data-strategy=... data-size=...>``."""
    left, right, top, row_h = 150, 20, 36, 18
    shown = sorted(segments, key=lambda s: (s["strategy"], s["stream"], s["address"]))[:max_rows]
    scale = (width - left - right) / max([1] + [s["total_size"] for s in shown])
    body = []
    for row, seg in enumerate(shown):
        sy = top + row * row_h
        label = f"{seg['strategy']} {seg['total_size'] / MIB:,.1f} MiB"
        body.append(f'<g class="segment" data-strategy={quoteattr(str(seg["strategy"]))} data-size="{seg["total_size"]}">')
        body.append(f'<text x="{left - 8}" y="{sy + 12}" text-anchor="end" {FONT}>{escape(label)}</text>')
        body.append(f'<rect x="{left}" y="{sy}" width="{seg["total_size"] * scale:.2f}" height="{row_h - 4}" fill="none" stroke="#999"/>')
        for block in seg["blocks"]:
            state = block_state(block)
            bx = left + (block["address"] - seg["address"]) * scale
            body.append(
                f'<rect class="block" data-state="{state}" x="{bx:.2f}" y="{sy}" width="{max(block["size"] * scale, 0.5):.2f}" '
                f'height="{row_h - 4}" fill="{BLOCK_COLOURS[state]}" stroke="white" stroke-width="0.3"/>'
            )
        body.append("</g>")
    bottom = top + len(shown) * row_h + 8
    if len(segments) > len(shown):
        body.append(f'<text x="{left}" y="{bottom + 8}" {FONT}>... and {len(segments) - len(shown)} more segments</text>')
        bottom += 18
    for k, (state, colour) in enumerate(BLOCK_COLOURS.items()):
        lx = left + 140 * k
        body.append(f'<rect x="{lx}" y="{bottom}" width="14" height="12" fill="{colour}"/>')
        body.append(f'<text class="legend" x="{lx + 20}" y="{bottom + 11}" {FONT}>{state.replace("_", " ")}</text>')
    return _svg(width, bottom + 24, body, title)


def fit_svg(
    result: Any,
    what: str = "batch size",
    title: str = "What fits",
    answers: Optional[Mapping[str, str]] = None,
    width: int = 1000,
    height: int = 440,
) -> str:
    """Peak reserved against the size probed (``vrampool.whatif.fit.FitResult``, or the world size of
    ``vrampool.whatif.cluster.RanksResult``), one line per allocator through the sizes that fit and a
    cross where it ran out, with the live bytes (the lower bound) dashed and the device's memory
    as a line. Sizes are on a log scale. The legend gives each allocator's answer: ``answers``,
    or its largest size.

    Each line is an element with ``class="series"`` and ``data-strategy``; each cross a
    ``<path class="oom" data-strategy=...>``."""
    left, right, top, bottom = 80, 250, 36, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    probes = sorted(result.probes, key=lambda p: p.size)
    sizes = [p.size for p in probes] or [1]
    lo, hi = math.log2(min(sizes)), math.log2(max(sizes))
    span = hi - lo or 1.0
    gib = float(1 << 30)
    y_max = max([result.memory] + [b for p in probes for b in p.peak_reserved_bytes.values()] + [p.lower_bound_bytes for p in probes]) * 1.05

    def x(size: float) -> float:
        return left + plot_w * (math.log2(size) - lo) / span

    def y(value: float) -> float:
        return top + plot_h * (1 - value / y_max)

    body = [f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']
    step = _nice_step(y_max / gib)
    for k in range(int(y_max / gib / step) + 1):
        value = k * step * gib
        body.append(f'<line x1="{left - 4}" x2="{left + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#eee"/>')
        body.append(f'<text class="y-tick" x="{left - 8}" y="{y(value) + 4:.1f}" text-anchor="end" {FONT}>{_number(k * step)} GiB</text>')
    labelled = -math.inf
    for size in sizes:
        if x(size) - labelled >= 48:  # bisection's sizes crowd together: label those with room
            labelled = x(size)
            body.append(f'<text class="x-tick" x="{x(size):.1f}" y="{top + plot_h + 16}" text-anchor="middle" {FONT}>{size:,}</text>')
    body.append(f'<text x="{left + plot_w / 2:.0f}" y="{height - 12}" text-anchor="middle" {FONT}>{escape(what)} (log scale)</text>')
    body.append(
        f'<line class="series" data-strategy="memory" x1="{left}" x2="{left + plot_w}" y1="{y(result.memory):.1f}" y2="{y(result.memory):.1f}" stroke="#000" stroke-width="1.5"/>'
    )
    live = " ".join(f"{x(p.size):.1f},{y(p.lower_bound_bytes):.1f}" for p in probes)
    body.append(f'<polyline class="series" data-strategy="lower bound" points="{live}" fill="none" stroke="#000" stroke-dasharray="6 4"/>')
    legend = []
    for index, name in enumerate(result.allocators):
        colour = PALETTE[index % len(PALETTE)]
        fitting = [p for p in probes if p.fits.get(name)]
        coords = " ".join(f"{x(p.size):.1f},{y(p.peak_reserved_bytes[name]):.1f}" for p in fitting)
        body.append(f'<polyline class="series" data-strategy={quoteattr(name)} points="{coords}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for p in probes:
            if p.fits.get(name) is False:
                cx, cy = x(p.size), y(result.memory)
                body.append(
                    f'<path class="oom" data-strategy={quoteattr(name)} d="M{cx - 4:.1f},{cy - 4:.1f} L{cx + 4:.1f},{cy + 4:.1f} M{cx - 4:.1f},{cy + 4:.1f} L{cx + 4:.1f},{cy - 4:.1f}" stroke="{colour}" stroke-width="1.5"/>'
                )
        answer = answers[name] if answers else f"{result.largest[name]:,}"
        legend.append((f"{name}: {answer}", colour, ""))
    legend += [("memory (x: out of memory)", "#000", ""), ("live bytes", "#000", ' stroke-dasharray="6 4"')]
    body.extend(_legend(legend, left + plot_w + 16, top))
    return _svg(width, height, body, title)
