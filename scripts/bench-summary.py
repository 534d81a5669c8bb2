#!/usr/bin/env python3
"""Prints the medians of the last criterion run (target/criterion) with ratios against the
baselines measured in the same run: malloc for the pairs, one thread for the thread scaling."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def medians(root: Path) -> dict[str, float]:
    out = {}
    for est in root.glob("**/new/estimates.json"):
        bench = est.parent.parent.relative_to(root).as_posix()
        out[bench] = json.loads(est.read_text())["median"]["point_estimate"]
    return out


def main() -> int:
    target = Path(os.environ.get("CARGO_TARGET_DIR", "target"))
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else target / "criterion"
    m = medians(root)
    if not m:
        print(f"no criterion results under {root}", file=sys.stderr)
        return 1
    print("| benchmark | median | vs baseline |")
    print("| --- | ---: | ---: |")
    for bench in sorted(m):
        parts = bench.split("/")
        ratio = ""
        if parts[0] == "pair" and len(parts) == 3 and parts[1] != "malloc":
            base = m.get(f"pair/malloc/{parts[2]}")
            ratio = f"{m[bench] / base:.2f}x malloc" if base else ""
        if parts[0] == "threads" and parts[-1] == "2":
            one = m.get("/".join(parts[:-1] + ["1"]))
            ratio = f"{2 * one / m[bench]:.2f}x one thread's throughput" if one else ""
        value = m[bench]
        shown = f"{value / 1000:.2f} us" if value >= 1000 else f"{value:.1f} ns"
        print(f"| {bench} | {shown} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
