"""Rotary positional embedding (RoPE; Su et al. 2021, arxiv.org/abs/2104.09864).

Pair k of a query or key at position p is rotated by theta = p * omega_k. The cos/sin tables are
formed in float64 (angles at positions in the millions need it: in float32, p * omega is off by
~0.1 rad at p = 10^7) and stored as float32; the rotation itself runs in float32 and is cast to the
input's dtype at the end.
"""

from __future__ import annotations

import torch
from torch import nn

from . import _checks
from .kernels import apply_rotary, apply_rotary_qk

__all__ = ["RotaryEmbedding", "rotate_eager"]


def rotate_eager(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "interleaved") -> torch.Tensor:
    """Plain-torch rotation, the readable version every kernel is tested against.

    Args:
        x: (..., seq, head_dim).
        cos, sin: (..., seq, rotary_dim / 2), broadcastable against x's leading dimensions.
        layout: "interleaved" pairs (2i, 2i+1); "half" pairs (i, i + rotary_dim/2).

    Returns:
        x with its first rotary_dim dimensions rotated, in x's dtype. Arithmetic is float32 (float64 for float64 x).
    """
    r = 2 * cos.shape[-1]
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    rot = x[..., :r].to(work)
    cos, sin = cos.to(work), sin.to(work)
    if layout == "interleaved":
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        a, b = rot[..., : r // 2], rot[..., r // 2 :]
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    out = out.to(x.dtype)
    if r == x.shape[-1]:
        return out
    return torch.cat((out, x[..., r:]), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys by position-dependent angles (RoPE, Su et al. 2021).

    Args:
        head_dim: size of each head's query/key vector.
        base: the base of the frequency schedule omega_k = base^(-2k/rotary_dim).
        rotary_dim: rotate only the first ``rotary_dim`` dimensions (even, <= head_dim); default head_dim.
        layout: "interleaved" (the chapter, Meta's Llama, GPT-J) or "half" (GPT-NeoX, Hugging Face Llama).
        scaling: a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict selecting a context-extension
            method (see :mod:`posenc.frequencies`), or None.
        max_position_embeddings: the model's context length, needed by some scaling methods.

    Shape:
        forward(q, k, positions=None, offset=0) -> (q, k): q (..., seq, head_dim), k (..., seq_k, head_dim).
        positions: (seq,) or (batch, seq), integer or fractional; default offset .. offset+seq-1.
        For k with a different length than q, pass positions=None: each gets offset .. offset+len-1.
    """

    cos_cached: torch.Tensor
    sin_cached: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: str = "interleaved",
        scaling: dict | None = None,
        max_position_embeddings: int | None = None,
    ):
        super().__init__()
        self.head_dim = _checks.even_int("head_dim", head_dim)
        self.rotary_dim = head_dim if rotary_dim is None else _checks.even_int("rotary_dim", rotary_dim)
        if self.rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
        self.base = _checks.positive_float("base", base)
        self.layout = _checks.layout(layout)
        self.scaling = scaling
        self.max_position_embeddings = max_position_embeddings
        inv_freq64, self.attention_factor = self._frequencies()
        self._inv_freq64 = inv_freq64  # master copy, never cast by .to(dtype)
        self.register_buffer("inv_freq", inv_freq64.to(torch.float32), persistent=False)
        self.register_buffer("cos_cached", torch.empty(0, self.rotary_dim // 2), persistent=False)
        self.register_buffer("sin_cached", torch.empty(0, self.rotary_dim // 2), persistent=False)

    def _frequencies(self) -> tuple[torch.Tensor, float]:
        """float64 inverse frequencies (rotary_dim/2,) and the attention factor applied to cos and sin."""
        if self.scaling is None:
            k = torch.arange(0, self.rotary_dim, 2, dtype=torch.float64)
            return 1.0 / self.base ** (k / self.rotary_dim), 1.0
        from .frequencies import rope_frequencies_float64

        return rope_frequencies_float64(
            self.rotary_dim,
            base=self.base,
            scaling=self.scaling,
            max_position_embeddings=self.max_position_embeddings,
        )

    # ------------------------------------------------------------------ angle tables
    def _angles_to_cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv = self._inv_freq64.to(positions.device)
        with torch.autocast(positions.device.type, enabled=False):
            theta = positions.to(torch.float64)[..., None] * inv
            cos, sin = torch.cos(theta), torch.sin(theta)
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)

    def _grow_cache(self, needed: int, device) -> None:
        size = max(needed, 2 * self.cos_cached.shape[0], 256)
        cos, sin = self._angles_to_cos_sin(torch.arange(size, device=device), torch.float32)
        self.cos_cached, self.sin_cached = cos, sin

    def cos_sin(
        self,
        seq_len: int,
        positions: torch.Tensor | None = None,
        offset: int = 0,
        device=None,
        dtype: torch.dtype = torch.float32,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (attention factor included) for a sequence, each (seq, rotary_dim/2) or (batch, seq, rotary_dim/2).

        Integer positions within the cache are looked up; fractional ones, or float64 requests, are computed afresh in float64.
        """
        device = self.cos_cached.device if device is None else device
        if positions is None:
            _checks.non_negative_int("offset", offset)
            if dtype == torch.float64:
                return self._angles_to_cos_sin(torch.arange(offset, offset + seq_len, device=device), dtype)
            end = offset + seq_len
            if end > self.cos_cached.shape[0] or self.cos_cached.device != torch.device(device):
                self._grow_cache(end, device)
            return self.cos_cached[offset:end], self.sin_cached[offset:end]
        positions = _checks.positions(positions, seq_len).to(device)
        if offset:
            positions = positions + _checks.non_negative_int("offset", offset)
        if positions.is_floating_point() or dtype == torch.float64:
            return self._angles_to_cos_sin(positions, dtype)
        end = int(positions.max()) + 1 if positions.numel() else 0
        if end > self.cos_cached.shape[0] or self.cos_cached.device != positions.device:
            self._grow_cache(end, positions.device)
        return self.cos_cached[positions], self.sin_cached[positions]

    def _cos_sin_for(self, x: torch.Tensor, positions, offset: int):
        seq = x.shape[-2]
        if positions is not None:
            batch = x.shape[0] if x.dim() >= 3 else None
            _checks.positions(positions, seq, batch)
            if positions.dim() == 2 and x.dim() < 3:
                raise ValueError(f"batched positions of shape {tuple(positions.shape)} need x with a batch dimension, got x of shape {tuple(x.shape)}")
        table_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self.cos_sin(seq, positions, offset, x.device, table_dtype)
        if cos.dim() == 3:  # (batch, seq, r/2): line batch up with x's first axis, broadcast over heads
            shape = (cos.shape[0],) + (1,) * (x.dim() - 3) + cos.shape[1:]
            cos, sin = cos.reshape(shape), sin.reshape(shape)
        return cos, sin

    def _check(self, name: str, x: torch.Tensor) -> None:
        _checks.tensor_rank(name, x, 2)
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"{name} must have last dimension head_dim={self.head_dim}, got shape {tuple(x.shape)}")

    # ------------------------------------------------------------------ public
    def rotate(self, x: torch.Tensor, positions: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
        """Rotate one tensor x (..., seq, head_dim) by its positions."""
        self._check("x", x)
        cos, sin = self._cos_sin_for(x, positions, offset)
        return apply_rotary(x, cos, sin, layout=self.layout)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        offset: int = 0,
        inplace: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys. ``inplace=True`` overwrites q and k (inference only)."""
        self._check("q", q)
        self._check("k", k)
        cos, sin = self._cos_sin_for(q, positions, offset)
        if k.shape[-2] == q.shape[-2]:
            return apply_rotary_qk(q, k, cos, sin, layout=self.layout, inplace=inplace)
        if positions is not None:
            raise ValueError(
                f"positions apply to q and k of the same length; got q length {q.shape[-2]} and k length "
                f"{k.shape[-2]}: rotate them separately with rotate()"
            )
        cos_k, sin_k = self._cos_sin_for(k, None, offset)
        return (
            apply_rotary(q, cos, sin, layout=self.layout, inplace=inplace),
            apply_rotary(k, cos_k, sin_k, layout=self.layout, inplace=inplace),
        )

    def _apply(self, fn, recurse=True):
        # A model-wide .half() must not round the tables; rebuild them in float32 on the new device.
        super()._apply(fn, recurse)
        device = self.inv_freq.device
        self.inv_freq = self._inv_freq64.to(device=device, dtype=torch.float32)
        self.cos_cached = torch.empty(0, self.rotary_dim // 2, device=device)
        self.sin_cached = torch.empty(0, self.rotary_dim // 2, device=device)
        return self

    def extra_repr(self) -> str:
        s = f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}, layout={self.layout!r}"
        return s + (f", scaling={self.scaling!r}" if self.scaling else "")
