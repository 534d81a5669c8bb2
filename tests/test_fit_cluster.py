"""`vrampool fit --parallel`: what fits on every rank, rank symmetry detected from FSDP2's shard
shapes, and `--over ranks`: the fewest FSDP ranks at which a batch fits."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from vrampool.whatif.cli import main  # noqa: E402
from vrampool.whatif.cluster import CannotShard, capture_ranks, fewest_ranks, fit_cluster, layout, measure_ranks, shardable_world_sizes  # noqa: E402
from vrampool.whatif.replay import replay  # noqa: E402
from vrampool.whatif.training import capture_model  # noqa: E402

MIB = 1 << 20
MODELS = '''
import torch

def even(batch):
    return torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)]), torch.randn(batch, 256)

def heavy(batch):
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]), torch.randn(batch, 1024)

def own_group(batch):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    return even(batch)
'''


def even(batch: int) -> Any:
    """Every parameter's dim 0 is 256: 4 ranks hold 64 rows each."""
    return torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)]), torch.randn(batch, 256)


def uneven(batch: int) -> Any:
    """Dim 0 of 250 over 4 ranks: 63, 63, 63 and 61 rows."""
    layers = [torch.nn.Linear(256, 250), torch.nn.Linear(250, 256), torch.nn.Linear(256, 250), torch.nn.Linear(250, 256)]
    return torch.nn.Sequential(*layers), torch.randn(batch, 256)


def heavy(batch: int) -> Any:
    """16 MiB of parameters (64 MiB with gradients and AdamW's states) and small activations."""
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]), torch.randn(batch, 1024)


def rank_peaks(fn: Any, world_size: int, batch: int = 8) -> list:
    return [capture_model(lambda: fn(batch), 2, parallel="fsdp", world_size=world_size, rank=r).peak_allocated_bytes() for r in range(world_size)]


def test_symmetry_is_detected_both_ways_and_matches_the_ranks_captures() -> None:
    assert layout(even, "fsdp", 4).groups == [[0, 1, 2, 3]]
    assert len(set(rank_peaks(even, 4))) == 1, "alike shards, alike ranks"
    lopsided = layout(uneven, "fsdp", 4)
    assert lopsided.groups == [[0, 1, 2], [3]] and not lopsided.symmetric
    peaks = rank_peaks(uneven, 4)
    assert peaks[0] == peaks[1] == peaks[2] != peaks[3], peaks
    # Data-parallel ranks hold the whole model: alike whatever the shapes.
    assert layout(uneven, "ddp", 4).symmetric
    # A probe captures one rank of each kind.
    assert measure_ranks(even, "fsdp", 4, 8, ["default"], 64 * MIB).captured == [0]
    probe = measure_ranks(uneven, "fsdp", 4, 8, ["default"], 64 * MIB)
    assert probe.captured == [0, 3] and probe.deciding_rank["default"] in (0, 3)


def test_the_rank_that_fits_least_decides_and_agrees_with_every_ranks_capture() -> None:
    result = fit_cluster(uneven, 8 * MIB, "fsdp", 4, ["default"], max_size=4096)
    largest = result.largest["default"]
    assert largest > 0

    def fits(batch: int, rank: int) -> bool:
        trace = capture_model(lambda: uneven(batch), 2, parallel="fsdp", world_size=4, rank=rank)
        return replay(trace, "default", capacity=8 * MIB)["out_of_memory"] is None

    assert all(fits(largest, r) for r in range(4))
    assert not all(fits(largest + 1, r) for r in range(4))


def test_fewest_ranks_is_monotone_and_agrees_with_a_direct_capture() -> None:
    memory = 24 * MIB
    result = fewest_ranks(heavy, memory, 8, ["default", "plan"])
    assert result.bound == 1024  # dim 0 of 1,024: the most ranks that shard every layer
    for name in result.allocators:
        ranks = result.fewest[name]
        assert ranks is not None and 1 < ranks < result.bound, result.fewest
        for p in result.probes:
            if name in p.fits:
                assert p.fits[name] == (p.world_size >= ranks), (name, p)

    def fits(world_size: int) -> bool:
        trace = capture_model(lambda: heavy(8), 2, parallel="fsdp", world_size=world_size, rank=0)
        return replay(trace, "default", capacity=memory)["out_of_memory"] is None

    assert fits(result.fewest["default"]) and not fits(result.fewest["default"] // 2)
    # More memory never needs more ranks.
    roomier = fewest_ranks(heavy, 2 * memory, 8, ["default", "plan"])
    assert all(roomier.fewest[n] <= result.fewest[n] for n in result.allocators), (roomier.fewest, result.fewest)


def test_a_world_size_that_leaves_a_rank_none_of_a_layer_is_refused() -> None:
    with pytest.raises(CannotShard, match="250 rows in chunks of 1 leave the last ranks none"):
        layout(uneven, "fsdp", 256)
    # Fewer ranks than rows can still leave some none: 250 rows in chunks of 3 fill 84 ranks.
    with pytest.raises(CannotShard, match="250 rows in chunks of 3 leave the last ranks none"):
        layout(uneven, "fsdp", 100)
    assert shardable_world_sizes(lambda: uneven(8), [4, 5, 64, 100]) == [4, 5]  # 64: 250 rows in chunks of 4 fill 63


def test_llama_sizes_have_their_published_parameter_counts() -> None:
    from vrampool.whatif.models import LLAMA_SIZES

    def count(size: str) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in LLAMA_SIZES[size]().parameters())

    assert abs(count("7b") - 6.74e9) < 0.01e9 and abs(count("13b") - 13.02e9) < 0.01e9


def test_fit_cluster_command_table_json_plot_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "models.py"
    script.write_text(MODELS)
    args = ["fit", "--model", f"{script}:even", "--memory", "8MB", "--strategy", "default,torch", "--max", "1024", "--parallel", "fsdp", "--ranks", "4"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "FSDP on 4 ranks" in out and "rank 0 captured for all 4" in out
    assert main([*args, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert (figures["parallel"], figures["ranks"], figures["memory_bytes"]) == ("fsdp", 4, 8 * MIB)
    assert [r["allocator"] for r in figures["rows"]] == ["default", "torch"] and all(r["largest"] > 0 for r in figures["rows"])
    assert all(p["world_size"] == 4 and p["captured"] == [0] for p in figures["probes"])

    over = ["fit", "--model", f"{script}:heavy", "--memory", "24MB", "--strategy", "default,plan", "--over", "ranks", "--batch", "8", "--parallel", "fsdp"]
    plot = tmp_path / "ranks.svg"
    assert main([*over, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "activations do not shrink" in out and "fewest ranks" in out
    drawn = {e.get("data-strategy") for e in ET.parse(plot).getroot().iter() if e.get("class") == "series"}
    assert drawn == {"default", "plan", "memory", "lower bound"}
    assert main([*over, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["batch"] == 8 and figures["max_ranks"] == 1024
    assert {r["allocator"]: r["fewest_ranks"] for r in figures["rows"]}.keys() == {"default", "plan"}
    assert all(isinstance(r["fewest_ranks"], int) and r["deciding_rank"] == 0 for r in figures["rows"])

    # Activations alone pass the memory: no number of ranks fits.
    assert main(["fit", "--model", f"{script}:even", "--memory", "2MB", "--strategy", "plan", "--over", "ranks", "--batch", "256", "--parallel", "fsdp"]) == 0
    assert "no number of ranks up to 256 fits" in capsys.readouterr().out

    for bad, message in [
        (["--model", f"{script}:even", "--parallel", "fsdp", "--ranks", "0"], "--ranks must be at least 1"),
        (["--model", f"{script}:even", "--parallel", "fsdp", "--ranks", "512"], "256 rows in chunks of 1 leave the last ranks none"),
        (["--model", f"{script}:even", "--parallel", "fsdp", "--over", "ranks"], "--over ranks needs --batch"),
        (["--model", f"{script}:even", "--parallel", "ddp", "--over", "ranks", "--batch", "8"], "--over ranks needs --parallel fsdp"),
        (["--model", f"{script}:even", "--ranks", "4"], "--ranks needs --parallel"),
        (["--model", f"{script}:own_group", "--parallel", "fsdp", "--ranks", "2"], "builds its own process group"),
        (["--model", "gpt2-medium", "--size", "7b"], "--size is for --model llama"),
    ]:
        assert main(["fit", "--memory", "8MB", *bad]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not torch.distributed.is_initialized(), "a refused process group is not left behind"


CAPTURED = """
import torch
from torch.distributed import init_process_group

def sixty_four_rows():
    return torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(2)]), torch.randn(8, 64)

def seven_rows():
    return torch.nn.Sequential(torch.nn.Linear(64, 7), torch.nn.Linear(7, 64)), torch.randn(8, 64)

def seven_rows_at(batch):
    return seven_rows()[0], torch.randn(batch, 64)

def own_group():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    return sixty_four_rows()

def own_group_bound_at_import():
    from torch.testing._internal.distributed.fake_pg import FakeStore
    init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    return sixty_four_rows()

def chatty():
    print("building the model")
    return sixty_four_rows()

def chatty_at(batch):
    print("building the model at", batch)
    return sixty_four_rows()[0], torch.randn(batch, 64)
"""


def test_capture_parallel_refuses_what_fit_refuses_before_any_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 57: capture recorded FSDP on 8 ranks of a 7-row layer, which fit refuses; 4,096 ranks of
    # a 64-row model ran for minutes before writing nothing; a model that made its own process group
    # ended in torch's "initialize the default process group twice".
    import vrampool.whatif.training

    script = tmp_path / "captured.py"
    script.write_text(CAPTURED)
    out = tmp_path / "t.jsonl"
    fit = ["fit", "--model", f"{script}:seven_rows_at", "--memory", "1GB", "--parallel", "fsdp", "--ranks", "8"]
    assert main(fit) == 1
    refusal = "8 ranks: FSDP splits each layer's parameters on dim 0 in chunks of ceil(rows / ranks), and 7 rows in chunks of 1 leave the last ranks none"
    assert refusal in capsys.readouterr().err

    def no_capture(*_: object, **__: object) -> None:
        raise AssertionError("a rank was captured before the model was checked")

    monkeypatch.setattr(vrampool.whatif.training, "capture_model", no_capture)
    for function, ranks, message in [
        ("seven_rows", 8, refusal),
        ("sixty_four_rows", 4096, "4,096 ranks: FSDP splits each layer's parameters on dim 0 in chunks of ceil(rows / ranks), and 64 rows"),
        ("own_group", 2, "builds its own process group"),
        ("own_group_bound_at_import", 2, "builds its own process group"),
    ]:
        assert main(["capture", "--model", f"{script}:{function}", "--parallel", "fsdp", "--ranks", str(ranks), "--output", str(out)]) == 1
        captured = capsys.readouterr()
        assert message in captured.err and captured.err.count("\n") == 1 and captured.out == "", (function, captured)
        assert "twice" not in captured.err and not list(tmp_path.glob("t-rank*")), function
        assert not torch.distributed.is_initialized(), "a refused process group is not left behind"
    with pytest.raises(CannotShard):
        capture_ranks(lambda: (torch.nn.Sequential(torch.nn.Linear(64, 7)), torch.randn(8, 64)), 8, "fsdp")


def test_json_on_stdout_is_json_alone_whatever_the_model_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 57: a model's own prints came out on stdout before the JSON.
    script = tmp_path / "captured.py"
    script.write_text(CAPTURED)
    for args in [
        ["capture", "--model", f"{script}:chatty", "--parallel", "fsdp", "--ranks", "2", "--output", str(tmp_path / "t.jsonl")],
        ["capture", "--model", f"{script}:chatty", "--output", str(tmp_path / "one.jsonl")],
        ["fit", "--model", f"{script}:chatty_at", "--memory", "1GB", "--strategy", "default", "--max", "2", "--parallel", "fsdp", "--ranks", "2"],
        ["fit", "--model", f"{script}:chatty_at", "--memory", "1GB", "--strategy", "default", "--max", "2"],
    ]:
        assert main([*args, "--json"]) == 0
        captured = capsys.readouterr()
        json.loads(captured.out)
        assert "building the model" in captured.err, args
