"""Real model structures written with ``torch.nn`` (no torchvision or transformers needed), for
liveness analysis, planning benchmarks and fake-tensor captures: a GPT-2-style decoder, a
Llama-style decoder and a ResNet with bottleneck blocks. ``gpt2_small()``, ``gpt2_medium()``,
``llama_1b()``, ``llama_7b()``, ``llama_13b()`` and ``resnet50()`` give the published sizes; the parameters let tests build
scaled-down versions of the same graphs.

>>> import torch
>>> from vrampool.whatif.models import gpt, resnet
>>> gpt(layers=1, d_model=32, heads=2, seq_len=8, vocab=50)(torch.zeros(2, 8, dtype=torch.long)).shape
torch.Size([2, 8, 50])
>>> resnet([1, 1], num_classes=10, width=8)(torch.zeros(2, 3, 32, 32)).shape
torch.Size([2, 10])
>>> llama(layers=1, d_model=32, heads=4, kv_heads=2, ffn=64, vocab=50)(torch.zeros(2, 8, dtype=torch.long)).shape
torch.Size([2, 8, 50])
"""

from __future__ import annotations

from typing import Any, Sequence


def gpt(layers: int, d_model: int, heads: int, seq_len: int, vocab: int) -> Any:
    """A GPT-2 decoder: token and position embeddings, ``layers`` pre-norm blocks (causal
    self-attention and a 4x GELU MLP), a final norm and a head tied to the token embedding.
    Takes ``(batch, seq)`` token ids, returns ``(batch, seq, vocab)`` logits."""
    import torch  # here, so that importing this module doesn't import torch

    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.c_attn, self.c_proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
            self.mlp = nn.Sequential(
                nn.Linear(d_model, 4 * d_model), nn.GELU(approximate="tanh"), nn.Linear(4 * d_model, d_model)
            )

        def forward(self, x: Any) -> Any:
            b, t, c = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(d_model, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            # The explicit softmax(QK^T)V that GPT-2 computes (not a fused kernel), so the graph
            # holds the (batch, heads, seq, seq) attention matrices a real training step keeps.
            att = (q @ k.transpose(-2, -1)) * (1.0 / (c // heads) ** 0.5)
            att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
            x = x + self.c_proj(y)
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d_model), nn.Embedding(seq_len, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            for block in self.blocks:
                block.register_buffer("mask", torch.tril(torch.ones(seq_len, seq_len)).view(1, 1, seq_len, seq_len))
            self.ln_f = nn.LayerNorm(d_model)

        def forward(self, idx: Any) -> Any:
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return F.linear(self.ln_f(x), self.wte.weight)

    return GPT()


def gpt2_small() -> Any:
    """GPT-2 small: 12 layers, d_model 768, 12 heads, context 1024, vocabulary 50,257 (124 M
    parameters)."""
    return gpt(layers=12, d_model=768, heads=12, seq_len=1024, vocab=50257)


def gpt2_medium() -> Any:
    """GPT-2 medium: 24 layers, d_model 1024, 16 heads, context 1024, vocabulary 50,257 (355 M
    parameters)."""
    return gpt(layers=24, d_model=1024, heads=16, seq_len=1024, vocab=50257)


def llama(layers: int, d_model: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> Any:
    """A Llama-style decoder: token embeddings, ``layers`` pre-norm blocks (RMSNorm, rotary
    position embeddings, grouped-query attention with ``kv_heads`` key/value heads through
    ``scaled_dot_product_attention``, a SwiGLU MLP of width ``ffn``), a final RMSNorm and an
    untied head. Takes ``(batch, seq)`` token ids of any length (positions are rotary), returns
    logits."""
    import torch

    nn, F = torch.nn, torch.nn.functional
    head_dim = d_model // heads

    def rotate(x: Any, cos: Any, sin: Any) -> Any:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn_norm, self.mlp_norm = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
            self.q = nn.Linear(d_model, heads * head_dim, bias=False)
            self.kv = nn.Linear(d_model, 2 * kv_heads * head_dim, bias=False)
            self.o = nn.Linear(heads * head_dim, d_model, bias=False)
            self.gate_up = nn.Linear(d_model, 2 * ffn, bias=False)
            self.down = nn.Linear(ffn, d_model, bias=False)

        def forward(self, x: Any, cos: Any, sin: Any) -> Any:
            b, t, _ = x.shape
            h = self.attn_norm(x)
            q = self.q(h).view(b, t, heads, head_dim).transpose(1, 2)
            k, v = self.kv(h).view(b, t, 2, kv_heads, head_dim).permute(2, 0, 3, 1, 4)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.o(y.transpose(1, 2).reshape(b, t, d_model))
            gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(gate) * up)

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.RMSNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)
            inverse = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
            self.register_buffer("inverse_frequencies", inverse, persistent=False)

        def forward(self, idx: Any) -> Any:
            angles = torch.outer(torch.arange(idx.shape[1], device=idx.device).float(), self.inverse_frequencies)
            angles = torch.cat((angles, angles), dim=-1)
            cos, sin = angles.cos(), angles.sin()
            x = self.embed(idx)
            for block in self.blocks:
                x = block(x, cos, sin)
            return self.head(self.norm(x))

    return Llama()


def llama_1b() -> Any:
    """A Llama-style model of about 1.1 B parameters (the TinyLlama shape): 22 layers, d_model
    2048, 32 heads with 4 key/value heads, SwiGLU width 5632, vocabulary 32,000."""
    return llama(layers=22, d_model=2048, heads=32, kv_heads=4, ffn=5632, vocab=32000)


def llama_7b() -> Any:
    """Llama 7B: 32 layers, d_model 4096, 32 heads (no grouping), SwiGLU width 11,008,
    vocabulary 32,000 (6.7 B parameters)."""
    return llama(layers=32, d_model=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000)


def llama_13b() -> Any:
    """Llama 13B: 40 layers, d_model 5120, 40 heads (no grouping), SwiGLU width 13,824,
    vocabulary 32,000 (13 B parameters)."""
    return llama(layers=40, d_model=5120, heads=40, kv_heads=40, ffn=13824, vocab=32000)


#: The Llama sizes ``--size`` takes.
LLAMA_SIZES = {"1b": llama_1b, "7b": llama_7b, "13b": llama_13b}


def resnet(blocks: Sequence[int], num_classes: int = 1000, width: int = 64) -> Any:
    """A ResNet of bottleneck blocks (1x1, 3x3, 1x1 convolutions with batch norm, expansion 4),
    ``blocks[i]`` of them in stage ``i``; stage ``i`` has ``width * 2**i`` channels inside its
    blocks. Takes ``(batch, 3, H, W)`` images."""
    import torch

    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, inplanes: int, planes: int, stride: int) -> None:
            super().__init__()
            out = planes * 4
            self.body = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
                nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(planes),
                nn.ReLU(inplace=True),
                nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out),
            )
            self.downsample = (
                nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
                if stride != 1 or inplanes != out else nn.Identity()
            )

        def forward(self, x: Any) -> Any:
            return torch.relu(self.body(x) + self.downsample(x))

    layers = [nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, stride=2, padding=1)]
    inplanes = width
    for stage, count in enumerate(blocks):
        planes = width * 2**stage
        for i in range(count):
            layers.append(Bottleneck(inplanes, planes, stride=2 if stage > 0 and i == 0 else 1))
            inplanes = planes * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inplanes, num_classes)]
    return nn.Sequential(*layers)


def resnet50() -> Any:
    """ResNet-50: bottleneck stages of 3, 4, 6 and 3 blocks, 1,000 classes (25.6 M parameters)."""
    return resnet([3, 4, 6, 3])
