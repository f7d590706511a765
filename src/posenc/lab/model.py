"""A small decoder-only transformer whose positional encoding is chosen by name.

Pre-norm blocks (RMSNorm, Zhang & Sennrich 2019), SwiGLU feed-forward (Shazeer 2020), tied input and
output embeddings (Press & Wolf 2017): the Llama recipe at toy size, in the spirit of nanoGPT's
``model.py``. The encoding comes from the core (:mod:`posenc`) by name through
:data:`posenc.lab.encodings.ENCODINGS`; every layer attends through the one entry point
:func:`posenc.attention`, which applies RoPE or ALiBi itself.

Shapes: token ids ``(B, T)``; residual stream ``(B, T, D)``; q, k, v ``(B, H, T, hd)`` with
``D = H * hd``; logits ``(B, T, V)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

import posenc
from posenc.lab.config import GPTConfig, check_choice, check_number
from posenc.lab.encodings import EXTENSIONS, extension_scaling, lookup
from posenc.lab.errors import LabError

__all__ = ["GPT", "GPTConfig", "KVCache", "next_byte_loss", "rope_extension"]


class KVCache:
    """Keys and values of the tokens seen so far, per layer: lists of ``(B, H, T_past, hd)`` tensors.

    Keys are cached *unrotated*: :func:`posenc.attention` rotates the query and every cached key on each
    call, so all keys always share one rotation schedule (which matters for length-dependent RoPE
    extensions such as dynamic NTK, whose frequencies change as the context grows).
    """

    def __init__(self, n_layer: int):
        self.k: list[torch.Tensor | None] = [None] * n_layer
        self.v: list[torch.Tensor | None] = [None] * n_layer
        self.length = 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add a layer's new keys and values; returns all of them, ``(B, H, T_past + T, hd)`` each."""
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

    def forward(
        self,
        x: torch.Tensor,
        rotary: posenc.RotaryEmbedding | None,
        bias: torch.nn.Module | None,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        """``x`` (B, T, D) -> (B, T, D). When decoding, ``cache`` holds every layer's past; this is
        ``layer``."""
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        # Keys sit at positions 0 .. len-1 and the T queries at the last T of them, as the causal mask
        # places them, so one call serves training (T == len) and cached decoding (T < len).
        y = posenc.attention(q, k, v, rotary=rotary, bias=bias, causal=True)  # (B, H, T, hd)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.norm2(x))


def next_byte_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of logits ``(B, T, V)`` against target ids ``(B, T)``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class GPT(nn.Module):
    """Decoder-only transformer over bytes.

    forward(idx (B, T) int64, cache=None) -> logits (B, T, V) float32. With a :class:`KVCache`, ``idx``
    holds only the new tokens; their positions continue from ``cache.length``.

    The encoding's modules are children (``pos_input``, ``rotary``, ``score_bias``) so ``.to(device)`` and
    ``state_dict`` see them (a learned table, a bias's parameters); ``rotary`` and ``score_bias`` may be None.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        enc = lookup(cfg.encoding)(cfg)
        self.pos_input, self.rotary, self.score_bias = enc.input, enc.rotary, enc.bias
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
        length. Rotary has no parameters, so this changes nothing that was trained. Prefer
        :func:`rope_extension`, which also puts the original back.
        """
        if self.rotary is None:
            raise LabError(f"rope scaling needs a rope model; this model's encoding is {self.cfg.encoding!r}")
        self.rotary = posenc.RotaryEmbedding(
            self.cfg.head_dim,
            base=self.cfg.rope_base,
            scaling=scaling,
            max_position_embeddings=self.cfg.max_len,
        ).to(self.tok.weight.device)

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        offset = cache.length if cache is not None else 0
        x = self.tok(idx) * math.sqrt(self.cfg.d_model)
        x = self.pos_input(x, offset=offset)
        for i, block in enumerate(self.blocks):
            x = block(x, self.rotary, self.score_bias, cache, i)
        if cache is not None:
            cache.length += idx.shape[1]
        return self.norm(x) @ self.tok.weight.T

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-byte cross-entropy (nats)."""
        return next_byte_loss(self(idx), targets)

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
        """Continue ``prompt`` (B, T0) by ``max_new_tokens`` tokens -> (B, T0 + n); temperature 0 is greedy.

        With ``use_cache`` the prompt is processed once and each new token costs one position; without
        it the whole sequence is re-run each step (the reference the cache is tested against).
        """
        check_number("temperature", temperature, low=0, why="0 means greedy")
        out = prompt
        cache = KVCache(self.cfg.n_layer) if use_cache else None
        step_input = prompt
        for _ in range(max_new_tokens):
            logits = self(step_input, cache) if use_cache else self(out)
            nxt = _pick(logits[:, -1, :].float(), temperature, top_k, generator)
            out = torch.cat((out, nxt), dim=1)
            step_input = nxt
        return out


def _pick(logits: torch.Tensor, temperature: float, top_k: int | None, generator) -> torch.Tensor:
    """The next token (B, 1) from last-position logits (B, V): argmax at temperature 0, else a sample."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)


@contextmanager
def rope_extension(model: GPT, method: str | None, factor: float, train_len: int) -> Iterator[GPT]:
    """Inside the block ``model`` uses RoPE eval-time extension ``method`` at ``factor``; after, its own.

    Args:
        method: a key of :data:`posenc.lab.encodings.EXTENSIONS`, or None for no change (so a caller
            evaluating with and without extensions needs no branch).
        factor: evaluation length / training length. At ``factor <= 1`` every method reduces to plain
            RoPE, so the model is left as it is.
        train_len: the training length (YaRN's original context).
    """
    if method is None:
        yield model
        return
    check_choice("extension", method, EXTENSIONS)
    if model.rotary is None:
        raise LabError(f"extension={method!r} needs a rope model; this one is {model.cfg.encoding!r}")
    original = model.rotary
    try:
        if factor > 1:
            model.set_rope_scaling(extension_scaling(method, factor, train_len))
        yield model
    finally:
        model.rotary = original
