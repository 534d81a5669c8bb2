"""`vrampool fit`: the largest size whose training steps fit in a device's memory, per allocator."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, List

import pytest

from vrampool.whatif.cli import main
from vrampool.whatif.fit import DoesNotFit, fit, fit_model
from vrampool.whatif.traces import Trace

MIB = 1 << 20


def three_mib_buffers(size: int) -> Trace:
    """`size` buffers of 3 MiB, all live at once."""
    return Trace.from_rows([(i, 0, 1, 3 * MIB) for i in range(size)])


def test_the_answer_follows_from_each_allocators_rules() -> None:
    pytest.importorskip("torch")
    tried: List[int] = []

    def capture(size: int) -> Trace:
        tried.append(size)
        return three_mib_buffers(size)

    # 64 MiB of memory. PyTorch packs requests of 1-10 MiB into 20 MiB segments, six 3 MiB blocks
    # each: three segments hold 18. The pool maps 2 MiB chunks of one range as it grows: 21 blocks
    # take 63 MiB. The plan needs the live bytes, 63 MiB for 21.
    result = fit(capture, 64 * MIB, ["default", "torch", "plan"])
    assert result.largest == {"default": 21, "torch": 18, "plan": 21}
    assert len(tried) == len(set(tried)), "each size is captured once, for every allocator"
    at = result.probe(18)
    assert at is not None and at.fits["torch"] is True
    assert at.peak_reserved_bytes["torch"] == 60 * MIB and at.lower_bound_bytes == 54 * MIB
    assert result.probe(19).fits["torch"] is False
    assert result.probe(21).fits["default"] and not result.probe(22).fits["default"]
    # Nothing fits: 0.
    assert fit(capture, 2 * MIB, ["torch"]).largest == {"torch": 0}


def test_a_buffer_larger_than_the_memory_does_not_fit_rather_than_stop_the_search() -> None:
    # Issue 48: past the device, each pool row raised InvalidSizeError and the search stopped.
    def one_buffer(size: int) -> Trace:
        return Trace.from_rows([(0, 0, 1, size * MIB)])

    pools = ["default", "slab", "best_fit", "buddy", "hybrid"]
    result = fit(one_buffer, 10 * MIB, pools, max_size=64)
    assert all(0 < result.largest[n] <= 10 for n in pools), result.largest
    past = result.probe(16)
    assert past is not None and past.fits and not any(past.fits.values()), past


def past_128_tib(batch: int) -> Any:
    """One parameter, and activations of a batch times 2^45 + 1 floats: past 128 TiB (the most one
    block of the pool can be) at a batch of 1."""
    import torch

    class Spread(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(1))

        def forward(self, x: Any) -> Any:
            return self.scale * x.sum() * torch.ones(x.shape[0] * ((1 << 45) + 1), device=x.device)

    return Spread(), torch.randn(batch, 4)


def test_activations_past_what_one_block_can_be_fit_no_batch_rather_than_fail() -> None:
    # Issue 57: the pool rows refused a request past 128 TiB as an invalid size, and fit stopped
    # with that error, where the answer is that no batch fits.
    pytest.importorskip("torch")
    result = fit_model(past_128_tib, 80 << 30, max_size=4)
    assert result.largest == dict.fromkeys(result.allocators, 0)
    assert result.probes[0].size == 1 and not any(result.probes[0].fits.values()), result.probes[0]


def tiny_mlp(batch: int) -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)), (torch.randn(batch, 256), torch.randint(10, (batch,)))


def test_parameters_larger_than_the_memory_is_said_before_any_search() -> None:
    pytest.importorskip("torch")
    with pytest.raises(DoesNotFit, match="parameters and buffers alone take"):
        fit_model(tiny_mlp, 64 * 1024)


def test_fit_command_table_json_plot_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "models.py"
    script.write_text(
        "import torch\n"
        "def tiny_mlp(batch):\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))\n"
        "    return model, (torch.randn(batch, 256), torch.randint(10, (batch,)))\n"
    )
    spec = f"{script}:tiny_mlp"
    plot = tmp_path / "fit.svg"
    args = ["fit", "--model", spec, "--memory", "4MB", "--strategy", "default,torch,plan", "--max", "512"]
    assert main([*args, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "simulated device of 4.0 MiB" in out
    assert "largest batch size" in out and "vs torch" in out
    for name in ("default", "torch", "plan"):
        assert any(line.startswith(name) for line in out.splitlines()), name
    drawn = {e.get("data-strategy") for e in ET.parse(plot).getroot().iter() if e.get("class") == "series"}
    assert drawn == {"default", "torch", "plan", "memory", "lower bound"}
    assert main([*args, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["memory_bytes"] == 4 * MIB and [r["allocator"] for r in figures["rows"]] == ["default", "torch", "plan"]
    largest = {r["allocator"]: r["largest"] for r in figures["rows"]}
    assert largest["plan"] >= largest["default"] >= largest["torch"] > 0
    for r in figures["rows"]:
        assert r["peak_reserved_bytes"] <= 4 * MIB
    for bad, message in [
        (["--memory", "64KB"], "does not fit: the model's parameters and buffers alone take"),
        (["--memory", "lots"], "--memory"),
        (["--memory", "8MB", "--strategy", "default,jemalloc"], "unknown strategy 'jemalloc'"),
        (["--memory", "8MB", "--seq", "64"], "--batch and --seq are for the built-in models"),
    ]:
        assert main(["fit", "--model", spec, *bad]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert main(["fit", "--model", "cnn", "--memory", "8GB"]) == 1
    assert "fit takes a GPU-scale built-in" in capsys.readouterr().err
