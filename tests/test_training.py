"""Training steps of any model as traces: fake against real capture, torch's MemTracker, FSDP2 and
data-parallel ranks, and one clear line for every way a model function can fail."""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any, List, Tuple

import pytest

torch = pytest.importorskip("torch")

from vrampool.whatif.capture import storage_tracker  # noqa: E402
from vrampool.whatif.cli import main  # noqa: E402
from vrampool.whatif.cluster import capture_ranks  # noqa: E402
from vrampool.whatif.models import gpt, llama  # noqa: E402
from vrampool.whatif.traces import Trace  # noqa: E402
from vrampool.whatif.training import ModelFunctionError, capture_model, load_model_function, memtracker_peak_bytes  # noqa: E402


def small_gpt() -> Tuple[Any, Tuple[Any, Any]]:
    tokens = torch.randint(500, (2, 65))
    return gpt(layers=2, d_model=128, heads=4, seq_len=64, vocab=500), (tokens[:, :-1], tokens[:, 1:])


def events(trace: Trace) -> List[Tuple[str, int]]:
    return [(e.op, e.size) for e in trace.events]


def after_first_step(trace: Trace) -> List[Tuple[str, int]]:
    ops = events(trace)
    return ops[ops.index(("step", 0)) + 1 :]


def test_fake_tensors_allocate_what_the_cpu_run_allocates() -> None:
    real = capture_model(small_gpt, steps=2, fake=False)
    fake = capture_model(small_gpt, steps=2)
    # The second step is the same op for op; the first differs only by the real build's
    # initialisation temporaries (a fake model is made from the meta device, without them).
    assert after_first_step(fake) == after_first_step(real)
    first_real = collections.Counter(events(real)[: events(real).index(("step", 0))])
    first_fake = collections.Counter(events(fake)[: events(fake).index(("step", 0))])
    assert first_fake - first_real == collections.Counter()
    assert fake.peak_allocated_bytes() <= real.peak_allocated_bytes()
    # Parameters and buffers are the first allocations and live to the end.
    params = sum(p.numel() * 4 for p in small_gpt()[0].parameters())
    assert min(r[2] for r in fake.rows()[:5]) == len(fake.events) and params < fake.peak_allocated_bytes()


def test_the_peak_is_the_one_torchs_memtracker_reports() -> None:
    def model() -> Tuple[Any, Tuple[Any, Any]]:
        tokens = torch.randint(100, (2, 33))
        return llama(layers=2, d_model=64, heads=4, kv_heads=2, ffn=128, vocab=100), (tokens[:, :-1], tokens[:, 1:])

    trace = capture_model(model)
    ours, theirs = trace.peak_allocated_bytes(), memtracker_peak_bytes(model)
    # They differ by what each leaves out: MemTracker the batch (made before its step), we the
    # optimizer's step counts (host tensors on a GPU, 4 B per parameter).
    batch = 2 * 33 * 8
    counts = 4 * len(list(model()[0].parameters()))
    assert ours - theirs == batch - counts, (ours, theirs)


def test_fsdp2_ranks_shard_and_data_parallel_ranks_replicate() -> None:
    fsdp = capture_ranks(small_gpt, 4, "fsdp")
    ddp = capture_ranks(small_gpt, 2, "ddp")
    alone = capture_model(small_gpt).peak_allocated_bytes()
    assert len(fsdp) == 4 and len({t.peak_allocated_bytes() for t in fsdp}) == 1, "equal shards: equal ranks"
    assert len({t.peak_allocated_bytes() for t in ddp}) == 1
    assert fsdp[0].peak_allocated_bytes() < 0.8 * alone, (fsdp[0].peak_allocated_bytes(), alone)
    assert ddp[0].peak_allocated_bytes() >= alone
    # The unsharded parameters are freed in place after each use (FSDP2 resizes their storage to
    # 0): the rank's trace frees them.
    assert sum(e.op == "free" for e in fsdp[0].events) > sum(e.op == "free" for e in capture_model(small_gpt).events)


def test_a_storage_resized_in_place_dies_and_is_born_again() -> None:
    seen: List[Tuple[str, int]] = []
    with storage_tracker(lambda i, s: seen.append(("alloc", s)), lambda i, s: seen.append(("free", s))):
        t = torch.empty(256)
        t.untyped_storage().resize_(0)
        t.untyped_storage().resize_(4096)
        del t
    assert seen == [("alloc", 1024), ("free", 1024), ("alloc", 4096), ("free", 4096)]


def test_batches_of_each_step_and_a_training_step_of_ones_own() -> None:
    def lengths() -> Tuple[Any, List[Tuple[Any, Any]]]:
        model = gpt(layers=1, d_model=64, heads=2, seq_len=128, vocab=100)
        batches = []
        for length in (32, 128):
            tokens = torch.randint(100, (2, length + 1))
            batches.append((tokens[:, :-1], tokens[:, 1:]))
        return model, batches

    trace = capture_model(lengths, steps=2)
    short, long = (piece.peak_allocated_bytes() for piece in trace.steps()[:2])
    assert long > short

    def own() -> Any:
        model = torch.nn.Linear(64, 64)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def step() -> None:
            model(torch.randn(32, 64)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

        return step

    trace = capture_model(own, steps=3)
    assert [e.op for e in trace.events].count("step") == 3 and trace.peak_allocated_bytes() >= 64 * 64 * 4


def raises() -> Any:
    raise KeyError("no such checkpoint")


def wrong() -> Any:
    return 42


def exits_0() -> Any:
    sys.exit(0)


def exits_3() -> Any:
    sys.exit(3)


class Halt(BaseException):
    pass


def raises_base() -> Any:
    raise Halt("stop here")


def exits_in_its_step() -> Any:
    def step() -> None:
        sys.exit(5)

    return step


def not_a_module() -> Any:
    return "model", torch.zeros(2)


def data_dependent() -> Any:
    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(4))

        def forward(self, x: Any) -> Any:
            return x * self.scale if x.sum().item() > 0 else x

    return Branchy(), torch.randn(4, 4)


def no_parameters() -> Any:
    return torch.nn.ReLU(), torch.randn(4)


def bad_batch() -> Any:
    return torch.nn.Linear(2, 2), ("x", "y")


@pytest.mark.parametrize(
    "fn, message",
    [
        (raises, "raises raised KeyError: 'no such checkpoint' (under fake tensors: if it runs for real, capture with --real)"),
        (wrong, "wrong returned a int; expected (model, batch)"),
        (exits_0, "exits_0 exited with code 0 before its steps finished"),
        (exits_3, "exits_3 exited with code 3 before its steps finished"),
        (exits_in_its_step, "exits_in_its_step's training step exited with code 5 before its steps finished"),
        (raises_base, "raises_base raised Halt: stop here"),
        (not_a_module, "returned a str as the model"),
        (data_dependent, "op aten._local_scalar_dense.default cannot run on fake tensors: its result depends on the data"),
        (bad_batch, "gave a tuple of 2 (str, str) as a batch"),
        (no_parameters, "making the optimizer raised ValueError: optimizer got an empty parameter list"),
    ],
)
def test_a_model_function_that_cannot_be_captured_is_one_clear_line(fn: Any, message: str) -> None:
    with pytest.raises(ModelFunctionError) as caught:
        capture_model(fn)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def int_batch_into_linear() -> Any:
    return torch.nn.Linear(64, 64), torch.randint(0, 10, (8, 64))


def int_batch_into_conv() -> Any:
    # With a bias, conv2d's own check ("Input type and bias type should be the same") raises already.
    return torch.nn.Conv2d(3, 8, 3, bias=False), torch.randint(0, 255, (2, 3, 16, 16))


def int_batch_into_bias_free_linear() -> Any:
    return torch.nn.Linear(64, 64, bias=False), torch.randint(0, 10, (8, 64))


@pytest.mark.parametrize(
    "fn, message",
    [
        (int_batch_into_linear, "aten::addmm: mat1 and mat2 must have the same dtype, but got torch.int64 and torch.float32"),
        (int_batch_into_bias_free_linear, "aten::mm: self and mat2 must have the same dtype, but got torch.int64 and torch.float32"),
        (int_batch_into_conv, "aten::convolution: input and weight must have the same dtype, but got torch.int64 and torch.float32"),
    ],
)
def test_operands_of_different_dtypes_fail_under_fake_tensors_as_for_real(fn: Any, message: str) -> None:
    # Issue 57: the meta kernels fake tensors run check these ops' shapes, not their dtypes, so an
    # int64 batch fed to a Linear was captured as if the step ran; torch's CPU kernel refuses it.
    with pytest.raises(ModelFunctionError, match="training step raised RuntimeError") as caught:
        capture_model(fn)
    assert message in str(caught.value), caught.value
    with pytest.raises(ModelFunctionError, match="training step raised RuntimeError: .*(same dtype|scalar type)"):
        capture_model(fn, fake=False)
    # Cast to the weights' dtype, the same model captures.
    model, batch = fn()
    assert capture_model(lambda: (model, batch.float())).peak_allocated_bytes() > 0


def test_model_functions_are_found_by_module_or_path(tmp_path: Path) -> None:
    assert load_model_function("vrampool.whatif.models:gpt2_small").__name__ == "gpt2_small"
    script = tmp_path / "mymodel.py"
    script.write_text("import torch\ndef build():\n    return torch.nn.Linear(8, 8), torch.randn(4, 8)\n")
    assert capture_model(load_model_function(f"{script}:build")).peak_allocated_bytes() > 0
    quits = tmp_path / "quits.py"
    quits.write_text("import sys\nsys.exit(4)\n")
    for spec, message in [
        ("nocolon", "expected module:function"),
        ("no_such_module_here:build", "importing no_such_module_here raised ModuleNotFoundError"),
        (f"{script}:missing", "has no function missing"),
        (f"{tmp_path}/absent.py:build", "no file"),
        (f"{quits}:build", "quits.py exited with code 4"),
    ]:
        with pytest.raises(ModelFunctionError, match=message):
            load_model_function(spec)


def test_capture_command_fake_real_ranks_and_bad_functions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "models.py"
    script.write_text(
        "import torch\n"
        "def mlp():\n    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)), (torch.randn(16, 64), torch.randint(8, (16,)))\n"
        "def broken():\n    raise RuntimeError('CUDA is required')\n"
    )
    out = tmp_path / "t.jsonl"
    assert main(["capture", "--model", f"{script}:mlp", "--steps", "2", "--output", str(out), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["fake"] is True and figures["steps"] == 2 and figures["peak_live_bytes"] > 0
    assert main(["capture", "--model", f"{script}:mlp", "--real", "--output", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fake"] is False
    assert main(["capture", "--model", f"{script}:mlp", "--parallel", "fsdp", "--ranks", "2", "--output", str(out), "--json"]) == 0
    ranks = json.loads(capsys.readouterr().out)
    assert [Path(r["output"]).name for r in ranks] == ["t-rank0.jsonl", "t-rank1.jsonl"]
    assert main(["replay", ranks[1]["output"], "--strategy", "default", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lower_bound_bytes"] == ranks[1]["peak_live_bytes"]
    for args, message in [
        (["--model", f"{script}:broken"], "broken raised RuntimeError: CUDA is required (under fake tensors: if it runs for real, capture with --real)"),
        (["--model", "gpt2-medium", "--scale", "2"], "takes a batch size, not a scale"),
        (["--model", "gpt", "--batch", "2"], "sets its own batches"),
        (["--model", "llama", "--seq", "10,x"], "--seq"),
        (["--model", f"{script}:mlp", "--ranks", "2"], "--ranks needs --parallel"),
        (["--model", "resnet9000"], "a built-in"),
    ]:
        assert main(["capture", *args, "--output", str(out)]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_the_docstrings_examples_run() -> None:
    import doctest

    import vrampool.whatif.ahead
    import vrampool.whatif.capture
    import vrampool.whatif.models
    import vrampool.whatif.replay
    import vrampool.whatif.traces
    import vrampool.whatif.training
    import vrampool.whatif.workloads

    modules = (vrampool.whatif.training, vrampool.whatif.workloads, vrampool.whatif.models, vrampool.whatif.replay, vrampool.whatif.traces, vrampool.whatif.capture, vrampool.whatif.ahead)
    for module in modules:
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
