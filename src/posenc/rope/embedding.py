"""Rotary positional embedding (RoPE; Su et al. 2021, arxiv.org/abs/2104.09864).

Pair k of a query or key at position p is rotated by theta = p * omega_k. Everything that defines the
schedule is resolved once, at construction (:func:`~.frequencies.resolve_schedule`); cos/sin come from
one table (:mod:`.table`, angles formed in float64, stored as float32): the :meth:`~RotaryEmbedding.tables`
hook of :class:`~.base.Rotary`'s dispatch is that table's lookup, and the decode path's rows are its memo.
The rotation runs on the fused kernels (:mod:`posenc.kernels`) in float32 and is cast to the input's dtype
at the end.
"""

from __future__ import annotations

import torch

from .. import _checks
from .base import Placement, Rotary
from .cache_hooks import CacheHooks
from .checks import check_positions, check_x, seq_and_positions
from .frequencies import resolve_schedule
from .table import CosSinTable, align_to, default_context

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(CacheHooks, Rotary):
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
        forward(q, k, positions=None, offset=0, inplace=False, *, k_positions=None, context_len=None,
        factor=None) -> (q, k): q (..., q_len, head_dim), k (..., k_len, head_dim).
        positions / k_positions: (seq,) or (batch, seq), integer or fractional; default: keys at
        offset .. offset+k_len-1, queries at the last q_len of those (decoding with a cache); positions
        given for q alone also serve k when both have one length. ``inplace=True`` overwrites q and k
        (inference only). ``context_len`` / ``factor``: see :meth:`tables`; for length-dependent methods the
        default context is 1 + the last key position, so q and k always share one schedule.
        rotate(x, positions=None, offset=0, *, context_len=None, factor=None) -> x; cos_sin(positions) or
        cos_sin(seq_len, ...) -> (cos, sin). The dispatch is :class:`~.base.Rotary`'s; this class gives
        its :meth:`tables` and the decode path's memoised :meth:`rows`. It implements
        :class:`~.protocol.RotaryProtocol`, as do XPos, M-RoPE, axial RoPE and FoPE.
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
        # the small kernel rotates every dimension by the original schedule's rows
        self.decodes_from_rows = self.rotary_dim == head_dim and not schedule.length_dependent
        self._context_from_keys = schedule.length_dependent  # read once: place() asks on every call

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
        return self.table.lookup(
            positions,
            offset,
            length=seq_len,
            device=device,
            dtype=dtype,
            context_len=context_len,
            factor=factor,
        )

    def tables(self, x, positions=None, offset: int = 0, *, kind="q", context_len=None, factor=None):
        """cos/sin for x (..., seq, head_dim) at ``positions`` (+ ``offset``), shaped to broadcast against x
        (per-sequence tables (batch, seq, r/2) line up with x's batch); float64 for float64 x, else float32.
        ``context_len`` and ``factor`` (int/float or (batch,) tensors) pick the schedule of length-dependent
        methods and per-sequence scaling factors; see :meth:`frequencies`. Queries and keys (``kind``)
        rotate alike."""
        check_x(self, "x", x)
        check_positions(x, positions)
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self.table.lookup(
            positions,
            offset,
            length=x.shape[-2],
            device=x.device,
            dtype=dtype,
            context_len=context_len,
            factor=factor,
        )
        return align_to(cos, sin, x, "factor/context_len/positions")

    def place(self, q, k, positions, k_positions, offset, options: dict) -> Placement:
        """:meth:`Rotary.place`; a length-dependent schedule's context defaults to 1 + the last key position
        (or query, past the keys), so q and k always share one schedule."""
        at = super().place(q, k, positions, k_positions, offset, options)
        if self._context_from_keys and options.get("context_len") is None:
            end = offset + max(q.shape[-2], k.shape[-2]) if at.k is None else default_context(at.k) + offset
            at = at._replace(options={**options, "context_len": end})
        return at

    def rows(self, q, k, offset: int):
        """The memoised decode rows (:meth:`CosSinTable.small_rows`) of k at offset.. and q at the last q_len
        of those."""
        _checks.offset(offset)
        q_len, k_len = q.shape[-2], k.shape[-2]
        q_start = offset + max(k_len - q_len, 0)
        rows_q = self.table.small_rows(q_start, q_start + q_len, q.device, self.layout)
        if q_len == k_len:
            return rows_q, rows_q
        return rows_q, self.table.small_rows(offset, offset + k_len, k.device, self.layout)

    def extra_repr(self) -> str:
        s = f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}, "
        s += f"layout={self.layout!r}"
        return s + (f", scaling={self._scaling!r}" if self._scaling else "")
