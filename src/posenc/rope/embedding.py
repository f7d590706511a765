"""Rotary positional embedding (RoPE; Su et al. 2021, arxiv.org/abs/2104.09864).

Pair k of a query or key at position p is rotated by theta = p * omega_k. Everything that defines the
schedule is resolved once, at construction (:func:`~.frequencies.resolve_schedule`); cos/sin come from
one table (:mod:`.table`, angles formed in float64, stored as float32); the rotation runs on the fused
kernels (:mod:`posenc.kernels`) in float32 and is cast to the input's dtype at the end.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import _checks
from ..kernels import apply_rotary, apply_rotary_qk
from .frequencies import resolve_schedule
from .table import CosSinTable, align_to

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys by position-dependent angles (RoPE, Su et al. 2021).

    Args:
        head_dim: size of each head's query/key vector.
        base: the base of the frequency schedule omega_k = base^(-2k/rotary_dim).
        rotary_dim: rotate only the first ``rotary_dim`` dimensions (even, <= head_dim); default head_dim.
        layout: "interleaved" (the chapter, Meta's Llama, GPT-J) or "half" (GPT-NeoX, Hugging Face Llama).
        scaling: a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict selecting a context-extension
            method (see :mod:`posenc.rope.frequencies`), or None. Its ``rope_theta`` replaces ``base`` and its
            ``partial_rotary_factor`` sets rotary_dim. Kept as a copy: changing the dict later changes
            nothing.
        max_position_embeddings: the model's context length, needed by some scaling methods.

    Shape:
        forward(q, k, positions=None, offset=0) -> (q, k): q (..., seq, head_dim), k (..., seq_k, head_dim).
        positions: (seq,) or (batch, seq), integer or fractional; default offset .. offset+seq-1.
        For k with a different length than q, pass positions=None: each gets offset .. offset+len-1.
    """

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
        _checks.even_int("head_dim", head_dim)
        _checks.positive_float("base", base)
        schedule = resolve_schedule(
            head_dim,
            base=base,
            scaling=scaling,
            rotary_dim=rotary_dim,
            max_position_embeddings=max_position_embeddings,
        )
        self.head_dim, self.rotary_dim, self.base = head_dim, schedule.rotary_dim, schedule.base
        self.layout = _checks.layout(layout)
        self._scaling = None if scaling is None else dict(scaling)
        self.max_position_embeddings = max_position_embeddings
        self.table = CosSinTable(schedule)

    @property
    def scaling(self) -> dict | None:
        """A copy of the scaling dict this module was built with (changing it changes nothing)."""
        return None if self._scaling is None else dict(self._scaling)

    @property
    def attention_factor(self) -> float:
        """The factor that multiplies cos and sin at the original context (YaRN, LongRoPE; else 1.0)."""
        return self.table.attention_factor

    @property
    def inv_freq(self) -> torch.Tensor:
        """Inverse frequencies (rotary_dim/2,) at the original context, float32."""
        return self.table.inv_freq64.to(torch.float32)

    @property
    def length_dependent(self) -> bool:
        """True when the frequencies depend on the sequence length (dynamic NTK, dynamic YaRN, LongRoPE)."""
        return self.table.schedule.length_dependent

    def frequencies(self, context_len=None, factor=None):
        """float64 inverse frequencies and attention factor; see :meth:`CosSinTable.frequencies`."""
        return self.table.frequencies(context_len, factor)

    def cos_sin(
        self,
        seq_len: int,
        positions: torch.Tensor | None = None,
        offset: int = 0,
        device=None,
        dtype: torch.dtype = torch.float32,
        *,
        context_len=None,
        factor=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (attention factor included), each (seq, rotary_dim/2) or (batch, seq, rotary_dim/2).

        Positions are ``positions`` (+ ``offset``) or offset .. offset+seq_len-1. ``context_len`` / ``factor``
        (see :meth:`frequencies`) select the schedule of length-dependent methods and per-sequence factors.
        """
        if positions is not None:
            positions = _checks.positions(positions, seq_len)
        return self._lookup(seq_len, positions, offset, device, dtype, context_len, factor)

    def _lookup(self, seq_len, positions, offset, device, dtype, context_len, factor):
        """:meth:`cos_sin` for positions already checked."""
        _checks.non_negative_int("offset", offset)
        if positions is None and _checks.tracing():  # a symbolic length stays symbolic in arange
            positions = torch.arange(offset, offset + seq_len, device=device)
        elif positions is None:
            positions = range(offset, offset + seq_len)
        else:
            positions = positions if device is None else positions.to(device)
            positions = positions + offset if offset else positions
        return self.table.lookup(
            positions, device=device, dtype=dtype, context_len=context_len, factor=factor
        )

    def _cos_sin_for(self, x: torch.Tensor, positions, offset: int, context_len=None, factor=None):
        """cos/sin for x (..., seq, head_dim), shaped to broadcast against it."""
        if positions is not None:
            _checks.positions(positions, x.shape[-2], x.shape[0] if x.dim() >= 3 else None)
            if positions.dim() == 2 and x.dim() < 3:
                raise ValueError(
                    f"batched positions of shape {tuple(positions.shape)} need x with a batch dimension, "
                    f"got x of shape {tuple(x.shape)}"
                )
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self._lookup(x.shape[-2], positions, offset, x.device, dtype, context_len, factor)
        return align_to(cos, sin, x, "factor/context_len/positions")

    def _check(self, name: str, x: torch.Tensor) -> None:
        _checks.tensor_rank(name, x, 2)
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{name} must have last dimension head_dim={self.head_dim}, got shape {tuple(x.shape)}"
            )

    def rotate(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        offset: int = 0,
        *,
        context_len=None,
        factor=None,
    ) -> torch.Tensor:
        """Rotate one tensor x (..., seq, head_dim) by its positions.

        ``context_len`` and ``factor`` (int/float or (batch,) tensors) pick the schedule of length-dependent
        methods and per-sequence scaling factors; see :meth:`frequencies`.
        """
        self._check("x", x)
        cos, sin = self._cos_sin_for(x, positions, offset, context_len, factor)
        return apply_rotary(x, cos, sin, layout=self.layout)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        offset: int = 0,
        inplace: bool = False,
        *,
        context_len=None,
        factor=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys. ``inplace=True`` overwrites q and k (inference only).

        ``context_len`` / ``factor``: see :meth:`rotate`. For length-dependent methods the default context is
        1 + the last position of q (of k when k is longer), so q and k always share one schedule.
        """
        self._check("q", q)
        self._check("k", k)
        if k.shape[-2] != q.shape[-2] and positions is not None:
            raise ValueError(
                f"positions apply to q and k of the same length; got q length {q.shape[-2]} and k length "
                f"{k.shape[-2]}: rotate them separately with rotate()"
            )
        if context_len is None and self.length_dependent and positions is None:
            context_len = offset + max(q.shape[-2], k.shape[-2])
        cos, sin = self._cos_sin_for(q, positions, offset, context_len, factor)
        if k.shape[-2] == q.shape[-2]:
            return apply_rotary_qk(q, k, cos, sin, layout=self.layout, inplace=inplace)
        cos_k, sin_k = self._cos_sin_for(k, None, offset, context_len, factor)
        return (
            apply_rotary(q, cos, sin, layout=self.layout, inplace=inplace),
            apply_rotary(k, cos_k, sin_k, layout=self.layout, inplace=inplace),
        )

    def extra_repr(self) -> str:
        s = f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}, "
        s += f"layout={self.layout!r}"
        return s + (f", scaling={self._scaling!r}" if self._scaling else "")
