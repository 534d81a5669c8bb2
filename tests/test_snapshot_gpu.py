"""The model of PyTorch's caching allocator against the real thing, on a GPU. Marked `cuda`;
skipped without torch or a CUDA device (a failure instead with VRAMPOOL_REQUIRE_GPU=1).

The demo's GPT trains a few steps under PyTorch's own allocator, plain and with
`expandable_segments:True`, with its memory history recorded; each snapshot replays through the
matching model, whose peak reserved must be within 10% of what PyTorch reserved. With OUT set,
the snapshots are kept there (for tests/data) with the figures in OUT/snapshot_gpu.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.cuda

_WHY = ""
try:
    import torch

    if not torch.cuda.is_available():
        _WHY = f"torch {torch.__version__} sees no CUDA device"
except ImportError:
    _WHY = "torch is not installed"
if _WHY:
    if os.environ.get("VRAMPOOL_REQUIRE_GPU") == "1":
        raise RuntimeError(f"VRAMPOOL_REQUIRE_GPU=1 but {_WHY}")
    pytest.skip(_WHY, allow_module_level=True)

TRAIN = textwrap.dedent(
    """
    import sys, torch
    from vrampool.whatif.workloads import gpt_batches, gpt_loss, gpt_model
    torch.manual_seed(0)
    model = gpt_model().cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    for inputs, target in gpt_batches(6, 0, 8):
        gpt_loss(model(inputs.cuda()), target.cuda()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(sys.argv[1])
    """
)


@pytest.mark.parametrize("expandable", [False, True])
def test_the_torch_model_predicts_what_pytorch_reserved(expandable: bool, tmp_path: Path) -> None:
    from vrampool.whatif.replay import replay
    from vrampool.whatif.traces import read

    out = Path(os.environ.get("OUT", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    snapshot = out / f"snapshot-gpt-{'expandable' if expandable else 'plain'}.pickle"
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": f"expandable_segments:{expandable}"}
    done = subprocess.run([sys.executable, "-c", TRAIN, str(snapshot)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    trace = read(snapshot)
    assert trace.recorded_by == "pytorch" and trace.recorded_expandable == expandable
    model = "torch+expandable" if expandable else "torch"
    report = replay(trace, strategy=model)
    recorded = report["recorded_reserved_bytes"]
    figures = {"model": model, "recorded_reserved_bytes": recorded, "predicted_reserved_bytes": report["peak_reserved_bytes"], "lower_bound_bytes": report["lower_bound_bytes"]}
    with open(out / "snapshot_gpu.json", "a") as f:
        f.write(json.dumps(figures) + "\n")
    assert abs(report["peak_reserved_bytes"] - recorded) <= 0.10 * recorded, figures
