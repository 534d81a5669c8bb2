"""Built-in training workloads whose allocation traces the demo and ``vrampool capture`` record:
two small ones the demo trains on the CPU, a GPT (token embedding, causal ``TransformerEncoder``
layers, LM head) fed sequences of a different length each step and a CNN fed a different batch
size each step, the two ways real training loops make an allocator's life hard; and two at GPU
scale, GPT-2 medium and a Llama-style 1.1 B model, captured under fake tensors (GBs live, no
memory needed) at a batch and sequence length of your choice.

>>> from vrampool.whatif.workloads import capture_workload
>>> trace = capture_workload("cnn", steps=2)
>>> [e.op for e in trace.events].count("step"), trace.peak_allocated_bytes() > 0
(2, True)
"""

from __future__ import annotations

import itertools
import random
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Sequence, Tuple

from vrampool.whatif.traces import Trace

#: The built-in workloads, for ``--model``.
MODELS = ("gpt", "cnn", "gpt2-medium", "llama")
#: The small ones the demo trains on the CPU (12 steps, Adam); the others take a batch size and
#: sequence lengths and train with AdamW.
DEMO_MODELS = ("gpt", "cnn")
#: Sequences per batch and sequence length of the GPU-scale models unless told otherwise.
BATCH, SEQUENCE = 8, 1024
#: Sequence lengths of the GPT's steps and batch sizes of the CNN's: drawn anew each step.
GPT_SEQUENCE_LENGTHS = (32, 48, 64, 96, 128)
CNN_BATCH_SIZES = (16, 24, 32, 48, 64)
# Sized to capture a dozen steps in seconds on one CPU core, with a vocabulary large enough that
# the logits are the big tensors they are in real language models.
GPT_BATCH, GPT_VOCAB = 4, 4096


def gpt_model(vocab: int = GPT_VOCAB, width: int = 128, layers: int = 2, heads: int = 4, max_len: int = 128) -> Any:
    """A small decoder-only transformer: token and position embeddings, ``layers`` encoder
    layers under a causal mask, and a linear LM head; ``forward(tokens) -> logits``."""
    import torch
    from torch import nn

    class TinyGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(vocab, width)
            self.positions = nn.Embedding(max_len, width)
            layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(width, vocab)

        def forward(self, tokens: Any) -> Any:
            length = tokens.shape[1]
            x = self.tokens(tokens) + self.positions(torch.arange(length, device=tokens.device))
            mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
            return self.head(self.blocks(x, mask=mask, is_causal=True))

    return TinyGPT()


def gpt_batches(steps: int, seed: int = 0, scale: int = 1, vocab: int = GPT_VOCAB) -> Iterator[Tuple[Any, Any]]:
    """``(tokens, next tokens)`` pairs of random text, ``scale * GPT_BATCH`` sequences a step,
    each step's length drawn from :data:`GPT_SEQUENCE_LENGTHS`. Tensors are made as the loop asks,
    so a capture sees their allocation as a GPU run sees the copy to the device."""
    import torch

    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        text = torch.randint(vocab, (scale * GPT_BATCH, rng.choice(GPT_SEQUENCE_LENGTHS) + 1), generator=generator)
        yield text[:, :-1], text[:, 1:]


def gpt_loss(logits: Any, target: Any) -> Any:
    """Cross-entropy of every position's next token."""
    import torch

    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def cnn_model(classes: int = 10) -> Any:
    """A small convolutional classifier for 3x32x32 images (conv, batch norm, ReLU, pooling)."""
    from torch import nn

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

    return nn.Sequential(block(3, 16), block(16, 32), block(32, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes))


def cnn_batches(steps: int, seed: int = 0, scale: int = 1, classes: int = 10) -> Iterator[Tuple[Any, Any]]:
    """``(images, labels)`` pairs, each step's batch size drawn from :data:`CNN_BATCH_SIZES`
    (times ``scale``)."""
    import torch

    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = scale * rng.choice(CNN_BATCH_SIZES)
        yield torch.randn(batch, 3, 32, 32, generator=generator), torch.randint(classes, (batch,), generator=generator)


#: name -> (model builder, batches(steps, seed, scale), loss)
_WORKLOADS: Dict[str, Tuple[Callable[[], Any], Callable[[int, int, int], Iterator[Tuple[Any, Any]]], Optional[Callable[[Any, Any], Any]]]] = {
    "gpt": (gpt_model, gpt_batches, gpt_loss),
    "cnn": (cnn_model, cnn_batches, None),
}


def _workload(name: str) -> Tuple[Any, Any, Any]:
    if name not in _WORKLOADS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(DEMO_MODELS)}")
    return _WORKLOADS[name]


def token_batches(batch: int, lengths: Sequence[int], vocab: int) -> Iterator[Tuple[Any, Any]]:
    """``(tokens, next tokens)`` of ``batch`` sequences of each length in turn, for ever (made as
    the loop asks)."""
    import torch

    for length in itertools.cycle(lengths):
        text = torch.randint(vocab, (batch, length + 1))
        yield text[:, :-1], text[:, 1:]


def _gpu_scale(name: str, longest: int, size: Optional[str]) -> Tuple[Callable[[], Any], int]:
    """The model's builder and vocabulary; GPT-2's learned positions (1,024 of them) are made as
    many as the longest sequence needs; Llama's ``size`` is one of :data:`LLAMA_SIZES` (1b unless
    told)."""
    from vrampool.whatif.models import LLAMA_SIZES, gpt

    if name == "gpt2-medium":
        if size is not None:
            raise ValueError(f"size is for llama ({', '.join(LLAMA_SIZES)}); gpt2-medium has one size")
        return (lambda: gpt(layers=24, d_model=1024, heads=16, seq_len=max(1024, longest), vocab=50257)), 50257
    if size is not None and size not in LLAMA_SIZES:
        raise ValueError(f"unknown llama size {size!r}; choose one of {', '.join(LLAMA_SIZES)}")
    return LLAMA_SIZES[size or "1b"], 32000


def model_function(
    name: str,
    steps: int = 12,
    seed: int = 0,
    scale: int = 1,
    batch: Optional[int] = None,
    lengths: Optional[Sequence[int]] = None,
    size: Optional[str] = None,
) -> Callable[[], Any]:
    """The model function (see :mod:`vrampool.whatif.training`) of workload ``name`` (:data:`MODELS`):
    the demo's models with their batches (``scale`` times the usual) for ``steps`` steps, or a
    GPU-scale model (llama of ``size``, :data:`vrampool.whatif.models.LLAMA_SIZES`) with ``batch``
    sequences of each of ``lengths`` in turn."""
    if name in DEMO_MODELS:
        if batch is not None or lengths is not None or size is not None:
            raise ValueError(f"{name} sets its own batches (use scale); batch, lengths and size are for {', '.join(m for m in MODELS if m not in DEMO_MODELS)}")
        build, batches, loss = _workload(name)
        return lambda: (build(), batches(steps, seed, scale), loss or _cross_entropy)
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    if scale != 1:
        raise ValueError(f"{name} takes a batch size, not a scale")
    batch = BATCH if batch is None else batch
    lengths = list(lengths) if lengths else [SEQUENCE]
    build, vocab = _gpu_scale(name, max(lengths), size)
    if batch < 1 or min(lengths) < 1:
        raise ValueError(f"batch and sequence lengths must be at least 1, got {batch} and {lengths}")
    return lambda: (build(), token_batches(batch, lengths, vocab))


def _cross_entropy(output: Any, target: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(output, target)


def _demo_optimizer(parameters: Iterable[Any]) -> Any:
    """The demo's optimizer: Adam as the CPU runs it."""
    import torch

    return torch.optim.Adam(parameters, lr=1e-3)


def capture_workload(
    name: str,
    steps: int = 12,
    seed: int = 0,
    progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda steps: steps,
    scale: int = 1,
    *,
    fake: bool = False,
    batch: Optional[int] = None,
    lengths: Optional[Sequence[int]] = None,
) -> Trace:
    """The allocation trace of training model ``name`` (:data:`MODELS`) for ``steps`` steps: the
    model's parameters and buffers from the start, then each step's tensors. The demo's models
    train with Adam on their batches (``scale`` times the usual), on the CPU for real unless
    ``fake``; the GPU-scale ones with AdamW on ``batch`` sequences of each of ``lengths`` in turn
    (see :func:`model_function`), under fake tensors unless told otherwise. ``progress`` may wrap
    the steps (e.g. in ``tqdm``)."""
    import torch

    from vrampool.whatif.training import adamw, capture_model

    if steps < 1 or scale < 1:
        raise ValueError(f"steps and scale must be at least 1, got {steps} and {scale}")
    torch.manual_seed(seed)
    optimizer = _demo_optimizer if name in DEMO_MODELS else adamw
    return capture_model(model_function(name, steps, seed, scale, batch, lengths), steps, fake=fake, optimizer=optimizer, name=name, progress=progress)


def measure_cuda(name: str, allocator: str, steps: int = 12, seed: int = 0, scale: int = 1) -> Dict[str, Any]:
    """Trains model ``name`` (batches times ``scale``) on CUDA device 0 with ``allocator``
    (``"pytorch"`` or ``"vrampool"``, which must be chosen before this process's first CUDA
    tensor) and returns its peak reserved and allocated bytes and the seconds taken."""
    import time

    import torch

    if allocator == "vrampool":
        import vrampool.torch as stats

        stats.install(strategy="hybrid")
    elif allocator == "pytorch":
        stats = torch.cuda
    else:
        raise ValueError(f"unknown allocator {allocator!r}; choose pytorch or vrampool")
    build, batches, loss = _workload(name)
    loss = loss or torch.nn.functional.cross_entropy
    torch.manual_seed(seed)
    model = build().cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    for inputs, target in batches(steps, seed, scale):
        loss(model(inputs.cuda()), target.cuda()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return {
        "allocator": allocator,
        "peak_reserved_bytes": stats.max_memory_reserved(),
        "peak_allocated_bytes": stats.max_memory_allocated(),
        "seconds": time.perf_counter() - start,
    }
