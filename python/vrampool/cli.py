"""The `vrampool` command."""

from __future__ import annotations

import argparse
import random
import sys
from typing import List, Optional, Sequence

from vrampool.pool import DevicePool

STRATEGIES = ("slab", "best_fit", "buddy", "hybrid")


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _varying_batches(seed: int, steps: int) -> List[List[int]]:
    """Each step's tensor sizes: a recommender-like loop whose batch size changes every step (the
    course notes' story), with small bias/norm tensors beside large activations."""
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        batch = rng.choice([96, 128, 160, 200, 256])
        sizes = []
        for _layer in range(12):
            sizes.append(batch * rng.choice([1024, 2048, 4096]) * 4)  # activations
            sizes.append(rng.choice([512, 2048, 4096, 16384]))  # biases, norms
            sizes.append(batch * 64 * 4)  # small per-row tensors
        out.append(sizes)
    return out


def demo(seed: int = 0, steps: int = 40) -> int:
    """Runs the same varying-batch workload through each strategy on the simulated device and
    prints what each reserved."""
    workload = _varying_batches(seed, steps)
    print(f"vrampool demo: {steps} steps of a varying-batch training loop on the simulated device\n")
    header = f"{'strategy':<10} {'peak allocated':>16} {'peak reserved':>16} {'reserved/alloc':>15} {'device allocs':>14} {'fast-path hits':>15}"
    print(header)
    print("-" * len(header))
    for strategy in STRATEGIES:
        with DevicePool("sim", capacity=64 << 30, strategy=strategy, host_backed=False) as pool:
            for sizes in workload:
                live = [pool.allocate(s) for s in sizes]
                # Activations die in reverse order (the backward pass), small tensors in between.
                for buf in reversed(live):
                    pool.deallocate(buf)
            s = pool.stats()
            ratio = s["reserved_bytes.all.peak"] / max(1, s["allocated_bytes.all.peak"])
            print(
                f"{strategy:<10} {_mib(s['allocated_bytes.all.peak']):>16} {_mib(s['reserved_bytes.all.peak']):>16} "
                f"{ratio:>15.2f} {s['num_device_alloc']:>14} {s['fast_path_hits']:>15}"
            )
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="vrampool", description="GPU memory pool tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="compare the strategies on a training-like workload")
    p_demo.add_argument("--seed", type=int, default=0)
    p_demo.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(args.seed, args.steps)
    return 2


if __name__ == "__main__":
    sys.exit(main())
