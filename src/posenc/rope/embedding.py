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
from ..kernels import Path, apply_rotary, choose_path, run
from .cache_hooks import CacheHooks
from .checks import check_pair, check_x, key_positions, seq_and_positions
from .frequencies import resolve_schedule
from .table import CosSinTable, default_context

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(CacheHooks, nn.Module):
    """Rotates queries and keys by position-dependent angles (RoPE, Su et al. 2021).

    Args:
        head_dim: size of each head's query/key vector.
        base: the base of the frequency schedule omega_k = base^(-2k/rotary_dim).
        rotary_dim: rotate only the first ``rotary_dim`` dimensions (even, <= head_dim); default head_dim.
        layout: "interleaved" (Su et al. 2021, Meta's Llama, GPT-J) or "half" (GPT-NeoX, Hugging Face Llama).
        scaling: a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict selecting a context-extension
            method (see :mod:`posenc.rope.frequencies`), or None. Its ``rope_theta`` replaces ``base`` and its
            ``partial_rotary_factor`` sets rotary_dim. Kept as a copy: changing the dict later changes
            nothing.
        max_position_embeddings: the model's context length, needed by some scaling methods.

    Shape:
        forward(q, k, positions=None, offset=0) -> (q, k): q (..., q_len, head_dim), k (..., k_len, head_dim).
        positions / k_positions: (seq,) or (batch, seq), integer or fractional; default: keys at
        offset .. offset+k_len-1, queries at the last q_len of those (decoding with a cache).
        rotate(x, positions=None, offset=0) -> x; cos_sin(positions) or cos_sin(seq_len, ...) -> (cos, sin).
        It implements :class:`~.protocol.RotaryProtocol`, as do XPos, M-RoPE and axial RoPE.
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
        head_dim = _checks.even_int("head_dim", head_dim)
        base = _checks.positive_float("base", base)
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
        self._small_ok = self.rotary_dim == head_dim and not schedule.length_dependent

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
        seq_len: int | torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        offset: int = 0,
        device=None,
        dtype: torch.dtype = torch.float32,
        *,
        context_len=None,
        factor=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (attention factor included), each (seq, rotary_dim/2) or (batch, seq, rotary_dim/2).

        Positions are ``positions`` (+ ``offset``) or offset .. offset+seq_len-1; ``cos_sin(positions)``, a
        tensor first (:class:`~.protocol.RotaryProtocol`'s form), is ``cos_sin(seq, positions)``.
        ``context_len`` / ``factor`` (see :meth:`frequencies`) select the schedule of length-dependent
        methods and per-sequence factors.
        """
        seq_len, positions = seq_and_positions(seq_len, positions)
        return self.table.at(seq_len, positions, offset, device, dtype, context_len, factor)

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
        check_x(self, "x", x)
        cos, sin = self.table.for_tensor(x, positions, offset, context_len, factor)
        return apply_rotary(x, cos, sin, layout=self.layout)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        offset: int = 0,
        inplace: bool = False,
        *,
        k_positions: torch.Tensor | None = None,
        context_len=None,
        factor=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys. ``inplace=True`` overwrites q and k (inference only).

        Keys sit at ``k_positions``, else at offset .. offset+k_len-1; queries at ``positions``, else at the
        last q_len of the key positions (bottom-right, where a causal mask puts them when q holds the new
        tokens and k the whole cache). Positions given for q alone also serve k when both have one length.
        ``context_len`` / ``factor``: see :meth:`rotate`; for length-dependent methods the default context is
        1 + the last key position, so q and k always share one schedule.
        """
        check_pair(self, q, k, inplace)
        rows = self._small_ok and positions is k_positions is context_len is factor is None
        # the default call's tables are (seq, r/2) rows of consecutive positions: the path can be chosen
        # before they are looked up, so a decode step takes its memoised rows instead
        path = choose_path((q, k), self.layout, rows=True, inplace=inplace) if rows else None
        if path is Path.SMALL:
            small = _small_rows(self, q, k, offset)
            return run(path, (q, k), None, None, self.layout, inplace=inplace, rows=small)
        q_len, k_len = q.shape[-2], k.shape[-2]
        positions, k_positions, context_len = _placement(
            self, q_len, k_len, positions, k_positions, offset, context_len
        )
        if k_positions is positions and q_len == k_len:  # one table serves both
            cos, sin = self.table.for_tensor(q, positions, offset, context_len, factor)
            path = path or choose_path((q, k), self.layout, cos=cos, inplace=inplace)
            return run(path, (q, k), cos, sin, self.layout, inplace=inplace)
        q_offset = offset if positions is not None else offset + max(k_len - q_len, 0)
        outs = []
        for name, x, at, start in (("q", q, positions, q_offset), ("k", k, k_positions, offset)):
            cos, sin = self.table.for_tensor(x, at, start, context_len, factor)
            chosen = path or choose_path((x,), self.layout, cos=cos, inplace=inplace)
            outs.append(run(chosen, (x,), cos, sin, self.layout, inplace=inplace, names=(name,))[0])
        return tuple(outs)

    def extra_repr(self) -> str:
        s = f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}, "
        s += f"layout={self.layout!r}"
        return s + (f", scaling={self._scaling!r}" if self._scaling else "")


def _placement(
    rope: RotaryEmbedding, q_len: int, k_len: int, positions, k_positions, offset: int, context_len
):
    """Where a forward call's queries and keys sit: (positions, k_positions, context_len).

    Keys at ``k_positions``, else at ``positions`` when q and k have one length (None: offset..); queries
    at ``positions``, else the last q_len key positions (per sequence: left padding shifts them). A
    length-dependent schedule's context defaults to 1 + the last key position, so q and k share it.
    """
    k_positions = key_positions(q_len, k_len, positions, k_positions)
    if (
        positions is None
        and isinstance(k_positions, torch.Tensor)
        and k_positions.shape[-1:] == (k_len,)
        and q_len <= k_len
    ):
        positions = k_positions[..., k_len - q_len :]
    if context_len is None and rope.length_dependent:
        context_len = (
            offset + max(q_len, k_len) if k_positions is None else default_context(k_positions) + offset
        )
    return positions, k_positions, context_len


def _small_rows(rope: RotaryEmbedding, q, k, offset: int):
    """The memoised decode rows of q (the last q_len of the key positions) and of k (offset..)."""
    _checks.offset(offset)
    q_len, k_len = q.shape[-2], k.shape[-2]
    q_start = offset + max(k_len - q_len, 0)
    rows_q = rope.table.small_rows(q_start, q_start + q_len, q.device, rope.layout)
    if q_len == k_len:
        return rows_q, rows_q
    return rows_q, rope.table.small_rows(offset, offset + k_len, k.device, rope.layout)
