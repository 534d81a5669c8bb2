"""Writes the trace of a KV-cache decode whose caches grow a token at a time by copy (each new
cache is allocated while the old one still lives, as ``torch.cat`` does), for ``replay_calls``
and ``vrampool replay``: per token and layer an activation, the key and value caches grown, a
smaller buffer; weights live throughout.

Run: ``python benches/kv_decode_trace.py OUT.csv [--layers N] [--tokens N] [--prompt N]
[--unit BYTES] [--activation BYTES] [--weights BYTES]``. The defaults write the small decode of
BENCHMARKS.md (16 MiB live at most); ``--layers 12 --tokens 64 --prompt 256 --unit 16384
--activation 4194304 --weights 8388608`` the larger one.
"""

from __future__ import annotations

import argparse
from typing import Dict, List, Optional, Tuple


def decode_trace(layers: int, tokens: int, prompt: int, unit: int, activation: int, weights: int) -> List[List[int]]:
    """Rows of ``[id, lower, upper, size]``: each buffer's allocation and free, as event indices."""
    events: List[Tuple[str, int]] = [("alloc", weights) for _ in range(layers if weights else 0)]
    held = len(events)
    caches = list(range(held, held + 2 * layers))
    events.extend(("alloc", prompt * unit) for _ in range(2 * layers))
    for token in range(1, tokens + 1):
        for layer in range(layers):
            act = len(events)
            events.append(("alloc", activation))
            for j in (2 * layer, 2 * layer + 1):
                grown = len(events)
                events.append(("alloc", (prompt + token) * unit))
                events.append(("free", caches[j]))
                caches[j] = grown
            small = len(events)
            events.append(("alloc", activation // 4))
            events.append(("free", act))
            events.append(("free", small))
    events.extend(("free", c) for c in caches)
    events.extend(("free", w) for w in range(held))
    row_of: Dict[int, int] = {}
    rows: List[List[int]] = []
    for time, (kind, value) in enumerate(events):
        if kind == "alloc":
            row_of[time] = len(rows)
            rows.append([len(rows) + 1, time, -1, value])
        else:
            rows[row_of[value]][2] = time
    return rows


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("output")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--unit", type=int, default=4096, help="bytes a token adds to each cache")
    p.add_argument("--activation", type=int, default=2 << 20)
    p.add_argument("--weights", type=int, default=0, help="bytes of each layer's weights (0: none)")
    args = p.parse_args(argv)
    rows = decode_trace(args.layers, args.tokens, args.prompt, args.unit, args.activation, args.weights)
    with open(args.output, "w") as f:
        f.write("id,lower,upper,size,stream\n")
        f.writelines(f"{i},{lower},{upper},{size},0\n" for i, lower, upper, size in rows)
    print(f"{args.output}: {len(rows):,} buffers")


if __name__ == "__main__":
    main()
