"""A small decoder-only transformer whose positional encoding is chosen by name.

Pre-norm blocks (RMSNorm, Zhang & Sennrich 2019), SwiGLU feed-forward (Shazeer 2020), tied input and
output embeddings (Press & Wolf 2017): the Llama recipe at toy size, in the spirit of nanoGPT's
``model.py``. The encoding comes from the core (``posenc``) through a registry, so adding a scheme
is one decorated function:

    @register_encoding("mine")
    def _mine(cfg: GPTConfig) -> Encoding:
        return Encoding(input=..., rotary=..., alibi=...)

Shapes: token ids ``(B, T)``; residual stream ``(B, T, D)``; q, k, v ``(B, H, T, hd)`` with
``D = H * hd``; logits ``(B, T, V)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

import posenc
from posenc.absolute import LearnedEmbedding, NoPositionalEncoding, SinusoidalEncoding
from posenc.bias import ALiBi
from posenc.lab.data import VOCAB_SIZE
from posenc.lab.errors import LabError
from posenc.rope import RotaryEmbedding


@dataclass(frozen=True)
class GPTConfig:
    """Everything needed to rebuild a model; saved as JSON next to its weights.

    ``max_len`` is the training length; it sizes the learned position table and is the
    ``original_max_position_embeddings`` of eval-time RoPE extensions.
    """

    encoding: str = "rope"
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    max_len: int = 64
    vocab_size: int = VOCAB_SIZE
    rope_base: float = 10000.0

    def __post_init__(self):
        if self.encoding not in ENCODINGS:
            raise LabError(
                f"encoding={self.encoding!r} is not known; allowed: {', '.join(sorted(ENCODINGS))}"
            )
        for name in ("n_layer", "n_head", "d_model", "max_len", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LabError(f"{name}={value!r} must be a positive integer")
        if self.d_model % self.n_head or (self.d_model // self.n_head) % 2:
            raise LabError(
                f"d_model={self.d_model} must be a multiple of n_head={self.n_head} with an even head size "
                f"(RoPE rotates pairs of dimensions)"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise LabError(f"model config has unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
        return cls(**d)


@dataclass
class Encoding:
    """The positional machinery of one scheme.

    input: adds position to the embeddings, ``(B, T, D), offset -> (B, T, D)``.
    rotary: rotates q and k in every layer (RoPE), or None.
    alibi: the attention-score bias passed to :func:`posenc.attention`, or None.
    """

    input: nn.Module
    rotary: RotaryEmbedding | None = None
    alibi: ALiBi | None = None


ENCODINGS: dict[str, Callable[[GPTConfig], Encoding]] = {}


def register_encoding(name: str):
    """Decorator adding ``fn(cfg) -> Encoding`` to the registry under ``name``."""

    def wrap(fn):
        ENCODINGS[name] = fn
        return fn

    return wrap


@register_encoding("none")
def _none(cfg: GPTConfig) -> Encoding:
    # NoPE: a causal decoder can still infer position from the mask (Haviv et al. 2022).
    return Encoding(input=NoPositionalEncoding())


@register_encoding("sinusoidal")
def _sinusoidal(cfg: GPTConfig) -> Encoding:
    return Encoding(input=SinusoidalEncoding(cfg.d_model))


@register_encoding("learned")
def _learned(cfg: GPTConfig) -> Encoding:
    return Encoding(input=LearnedEmbedding(cfg.max_len, cfg.d_model))


@register_encoding("rope")
def _rope(cfg: GPTConfig) -> Encoding:
    return Encoding(input=NoPositionalEncoding(), rotary=RotaryEmbedding(cfg.head_dim, base=cfg.rope_base))


@register_encoding("alibi")
def _alibi(cfg: GPTConfig) -> Encoding:
    return Encoding(input=NoPositionalEncoding(), alibi=ALiBi(cfg.n_head))


class KVCache:
    """Keys and values of the tokens seen so far, per layer: lists of ``(B, H, T_past, hd)`` tensors.

    Keys are cached *after* rotation, so RoPE never rotates a past key twice.
    """

    def __init__(self, n_layer: int):
        self.k: list[torch.Tensor | None] = [None] * n_layer
        self.v: list[torch.Tensor | None] = [None] * n_layer
        self.length = 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k[layer] is not None:
            k = torch.cat((self.k[layer], k), dim=-2)
            v = torch.cat((self.v[layer], v), dim=-2)
        self.k[layer], self.v[layer] = k, v
        return k, v


class SwiGLU(nn.Module):
    """FFN(x) = W2 (SiLU(W1 x) * W3 x), Shazeer 2020; hidden ~ 8/3 D keeps the FLOPs of a 4D GELU MLP."""

    def __init__(self, d_model: int):
        super().__init__()
        hidden = 32 * math.ceil(8 * d_model / 3 / 32)
        self.w13 = nn.Linear(d_model, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(a) * b)


class Block(nn.Module):
    """x + Attn(RMSNorm(x)); x + SwiGLU(RMSNorm(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.norm1 = nn.RMSNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.norm2 = nn.RMSNorm(cfg.d_model)
        self.mlp = SwiGLU(cfg.d_model)

    def forward(self, x, enc: Encoding, layer: int, cache: KVCache | None, offset: int) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        if enc.rotary is not None:
            q, k = enc.rotary(q, k, offset=offset)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        y = posenc.attention(q, k, v, bias=enc.alibi, causal=True)  # (B, H, T, hd)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Decoder-only transformer over bytes.

    forward(idx (B, T) int64, cache=None) -> logits (B, T, V) float32. With a :class:`KVCache`, ``idx``
    holds only the new tokens; their positions continue from ``cache.length``.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.enc = ENCODINGS[cfg.encoding](cfg)
        # Registered as children so .to(device) and state_dict see them (learned table, learnable slopes).
        self.pos_input = self.enc.input
        self.rotary = self.enc.rotary
        self.alibi = self.enc.alibi
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.d_model)
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2's std 0.02 for the tied table: with a final RMSNorm the logit of "repeat the current
        # byte" starts at ~d * std (2.6 at d=128), not ~sqrt(d) as with a d^-1/2 init, which would
        # waste the first steps of a short run unlearning it. The input is scaled by sqrt(d)
        # (Vaswani et al. 2017, sec. 3.4) so tokens are not swamped by a unit-scale sinusoidal table.
        nn.init.normal_(self.tok.weight, std=0.02)
        for name, p in self.blocks.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith("proj.weight") or name.endswith("w2.weight"):
                    std = 0.02 / math.sqrt(2 * self.cfg.n_layer)  # GPT-2: residual branches scaled by depth
                nn.init.normal_(p, std=std)

    def set_rope_scaling(self, scaling: dict | None) -> None:
        """Swap in an eval-time RoPE context extension (a Hugging Face ``rope_scaling`` dict, or None).

        ``max_position_embeddings`` (what dynamic NTK treats as the trained context) is the training
        length. Rotary has no parameters, so this changes nothing that was trained.
        """
        if self.enc.rotary is None:
            raise LabError(f"rope scaling needs a rope model; this model's encoding is {self.cfg.encoding!r}")
        device = self.tok.weight.device
        rotary = RotaryEmbedding(
            self.cfg.head_dim,
            base=self.cfg.rope_base,
            scaling=scaling,
            max_position_embeddings=self.cfg.max_len,
        ).to(device)
        self.enc.rotary = self.rotary = rotary

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        offset = cache.length if cache is not None else 0
        x = self.tok(idx) * math.sqrt(self.cfg.d_model)
        x = self.enc.input(x, offset=offset)
        for i, block in enumerate(self.blocks):
            x = block(x, self.enc, i, cache, offset)
        if cache is not None:
            cache.length += idx.shape[1]
        return self.norm(x) @ self.tok.weight.T

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-byte cross-entropy (nats)."""
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Continue ``prompt`` (B, T0) by ``max_new_tokens`` tokens; temperature 0 is greedy. Returns (B, T0 + n).

        With ``use_cache`` the prompt is processed once and each new token costs one position; without
        it the whole sequence is re-run each step (the reference the cache is tested against).
        """
        if temperature < 0:
            raise LabError(f"temperature={temperature!r} must be >= 0 (0 means greedy)")
        out = prompt
        cache = KVCache(self.cfg.n_layer) if use_cache else None
        step_input = prompt
        for _ in range(max_new_tokens):
            logits = self(step_input, cache) if use_cache else self(out)
            logits = logits[:, -1, :].float()
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, -math.inf)
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            out = torch.cat((out, nxt), dim=1)
            step_input = nxt
        return out


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
