"""Rotary positional embedding (RoPE; Su et al. 2021, arxiv.org/abs/2104.09864).

Pair k of a query or key at position p is rotated by theta = p * omega_k. The cos/sin tables are
formed in float64 (angles at positions in the millions need it: in float32, p * omega is off by
~0.1 rad at p = 10^7) and stored as float32; the rotation itself runs in float32 and is cast to the
input's dtype at the end.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import _checks
from ..kernels import apply_rotary, apply_rotary_qk

__all__ = ["RotaryEmbedding", "rotate_eager"]

_CACHE_LIMIT = 1 << 16  # positions past this are computed on the fly instead of growing the cos/sin table


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
            method (see :mod:`posenc.rope.frequencies`), or None.
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
        """float64 inverse frequencies (rotary_dim/2,) and the attention factor applied to cos and sin.

        With ``scaling``, the dict is validated once here; its rope_theta replaces ``base`` and its
        partial_rotary_factor sets rotary_dim when rotary_dim was left at head_dim. For length-dependent
        methods (dynamic, dynamic_yarn, longrope) these are the frequencies up to the original context.
        """
        self._spec = None
        if self.scaling is None:
            k = torch.arange(0, self.rotary_dim, 2, dtype=torch.float64)
            return 1.0 / self.base ** (k / self.rotary_dim), 1.0
        from .frequencies import parse_scaling, rope_frequencies_float64

        spec = parse_scaling(self.scaling, max_position_embeddings=self.max_position_embeddings)
        if spec.rope_theta is not None:
            self.base = spec.rope_theta
        prf = spec.partial_rotary_factor
        if prf is not None and spec.method != "proportional":
            dim = int(self.head_dim * prf)
            if self.rotary_dim == self.head_dim and dim != self.head_dim:
                self.rotary_dim = _checks.even_int("head_dim * scaling['partial_rotary_factor']", dim)
            elif dim != self.rotary_dim:
                raise ValueError(
                    f"rotary_dim={self.rotary_dim} disagrees with scaling['partial_rotary_factor']={prf} "
                    f"(head_dim * factor = {dim}); give one of them"
                )
        self._spec = spec
        return rope_frequencies_float64(self.rotary_dim, base=self.base, scaling=spec)

    @property
    def length_dependent(self) -> bool:
        """True when the frequencies depend on the sequence length (dynamic NTK, dynamic YaRN, LongRoPE)."""
        return self._spec is not None and self._spec.length_dependent

    def frequencies(self, context_len=None, factor=None) -> tuple[torch.Tensor, float | torch.Tensor]:
        """float64 inverse frequencies and attention factor for a context length and/or scaling factor.

        Args:
            context_len: the sequence length length-dependent methods scale for (an int, or a (batch,) tensor
                with one length per sequence); None: the original context. Ignored by static methods.
            factor: overrides the scaling dict's ``factor`` (a number or a (batch,) tensor, one per sequence),
                for methods that have one (linear, ntk, dynamic, yarn, llama3, proportional).

        Returns:
            inv_freq (rotary_dim/2,) and a float, or, when either argument is a tensor, inv_freq
            (batch, rotary_dim/2) and attention factors (batch,) float64.
        """
        if factor is not None and self._spec is None:
            raise ValueError("factor needs a scaling method (RotaryEmbedding(..., scaling={...})), got scaling=None")
        batched = isinstance(context_len, torch.Tensor) and context_len.dim() > 0
        batched = batched or (isinstance(factor, torch.Tensor) and factor.dim() > 0)
        if not batched:
            if isinstance(context_len, torch.Tensor):
                context_len = int(context_len)
            if isinstance(factor, torch.Tensor):
                factor = float(factor)
            if factor is None and (context_len is None or not self.length_dependent):
                return self._inv_freq64, self.attention_factor
            return self._spec.frequencies(self.rotary_dim, base=self.base, seq_len=context_len, factor=factor)
        n = max(t.shape[0] for t in (context_len, factor) if isinstance(t, torch.Tensor) and t.dim() > 0)

        def per_row(v, name):
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                if v.shape != (n,):
                    raise ValueError(f"{name} must have shape ({n},) (one per sequence), got {tuple(v.shape)}")
                return v.tolist()
            return [v.item() if isinstance(v, torch.Tensor) else v] * n

        rows, memo = [], {}
        for c, f in zip(per_row(context_len, "context_len"), per_row(factor, "factor"), strict=True):
            key = (c if self.length_dependent else None, f)
            if key not in memo:  # sequences in a batch often share a length
                memo[key] = self.frequencies(*key)
            rows.append(memo[key])
        inv = torch.stack([r[0] for r in rows])
        attn = torch.tensor([float(r[1]) for r in rows], dtype=torch.float64)
        return inv, attn

    # ------------------------------------------------------------------ angle tables
    def _angles_to_cos_sin(self, positions: torch.Tensor, dtype: torch.dtype, inv=None, attn=None) -> tuple[torch.Tensor, torch.Tensor]:
        # inv: (r/2,) or (batch, r/2) float64 and attn: float or (batch,), default the module's own
        inv = (self._inv_freq64 if inv is None else inv).to(positions.device)
        attn = self.attention_factor if attn is None else attn
        with torch.autocast(positions.device.type, enabled=False):
            if inv.dim() == 2:  # one schedule per sequence: (batch, 1, r/2) against (batch or 1, seq, 1)
                pos = positions.to(torch.float64)
                pos = pos[None] if pos.dim() == 1 else pos
                theta = pos[..., None] * inv[:, None, :]
            else:
                theta = positions.to(torch.float64)[..., None] * inv
            cos, sin = torch.cos(theta), torch.sin(theta)
        if isinstance(attn, torch.Tensor):
            a = attn.to(device=cos.device, dtype=torch.float64)[:, None, None]
            cos, sin = cos * a, sin * a
        elif attn != 1.0:
            cos, sin = cos * attn, sin * attn
        return cos.to(dtype), sin.to(dtype)

    def _scaled_cos_sin(self, positions: torch.Tensor, dtype, context_len, factor):
        """cos/sin when the schedule depends on the sequence (length-dependent methods, per-sequence factors).

        The context length defaults to 1 + the largest position, per sequence for (batch, seq) positions: a
        sequence's rotation never depends on what else is in the batch. (transformers uses the batch maximum;
        posenc.hf passes that explicitly to match it.)
        """
        if context_len is None and self.length_dependent:
            if positions.dim() == 2:
                context_len = positions.amax(-1).floor().long() + 1
            else:
                context_len = int(positions.max().floor()) + 1 if positions.numel() else 1
        inv, attn = self.frequencies(context_len, factor)
        if inv.dim() == 2 and positions.dim() == 2 and positions.shape[0] not in (1, inv.shape[0]):
            raise ValueError(f"positions has batch size {positions.shape[0]}, but {inv.shape[0]} factors/lengths were given")
        return self._angles_to_cos_sin(positions, dtype, inv, attn)

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
        *,
        context_len=None,
        factor=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (attention factor included) for a sequence, each (seq, rotary_dim/2) or (batch, seq, rotary_dim/2).

        Integer positions within the cache are looked up; fractional ones, far ones, or float64 requests are
        computed afresh in float64. ``context_len`` / ``factor`` (see :meth:`frequencies`) select the schedule
        for length-dependent methods and per-sequence factors; a (batch,) tensor gives (batch, seq, rotary_dim/2).
        """
        device = self.cos_cached.device if device is None else device
        if positions is None:
            _checks.non_negative_int("offset", offset)
            positions_ = torch.arange(offset, offset + seq_len, device=device)
            end = offset + seq_len
            if self.length_dependent or factor is not None:
                return self._scaled_cos_sin(positions_, dtype, context_len, factor)
            if dtype == torch.float64 or end > _CACHE_LIMIT:
                return self._angles_to_cos_sin(positions_, dtype)
            if end > self.cos_cached.shape[0] or self.cos_cached.device != torch.device(device):
                self._grow_cache(end, device)
            return self.cos_cached[offset:end], self.sin_cached[offset:end]
        positions = _checks.positions(positions, seq_len).to(device)
        if offset:
            positions = positions + _checks.non_negative_int("offset", offset)
        if self.length_dependent or factor is not None:
            return self._scaled_cos_sin(positions, dtype, context_len, factor)
        end = int(positions.max()) + 1 if positions.numel() else 0
        # a table up to position 10^7 would take gigabytes: far positions are computed, not cached
        if positions.is_floating_point() or dtype == torch.float64 or end > _CACHE_LIMIT:
            return self._angles_to_cos_sin(positions, dtype)
        if end > self.cos_cached.shape[0] or self.cos_cached.device != positions.device:
            self._grow_cache(end, positions.device)
        return self.cos_cached[positions], self.sin_cached[positions]

    def _cos_sin_for(self, x: torch.Tensor, positions, offset: int, context_len=None, factor=None):
        seq = x.shape[-2]
        if positions is not None:
            batch = x.shape[0] if x.dim() >= 3 else None
            _checks.positions(positions, seq, batch)
            if positions.dim() == 2 and x.dim() < 3:
                raise ValueError(f"batched positions of shape {tuple(positions.shape)} need x with a batch dimension, got x of shape {tuple(x.shape)}")
        table_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self.cos_sin(seq, positions, offset, x.device, table_dtype, context_len=context_len, factor=factor)
        if cos.dim() == 3:  # (batch, seq, r/2): line batch up with x's first axis, broadcast over heads
            if x.dim() < 3 or cos.shape[0] not in (1, x.shape[0]):
                raise ValueError(
                    f"factor/context_len give {cos.shape[0]} per-sequence schedules, which do not match x of shape {tuple(x.shape)}"
                )
            shape = (cos.shape[0],) + (1,) * (x.dim() - 3) + cos.shape[1:]
            cos, sin = cos.reshape(shape), sin.reshape(shape)
        return cos, sin

    def _check(self, name: str, x: torch.Tensor) -> None:
        _checks.tensor_rank(name, x, 2)
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"{name} must have last dimension head_dim={self.head_dim}, got shape {tuple(x.shape)}")

    # ------------------------------------------------------------------ public
    def rotate(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, offset: int = 0, *, context_len=None, factor=None
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
        if context_len is None and self.length_dependent and positions is None:
            context_len = offset + max(q.shape[-2], k.shape[-2])
        cos, sin = self._cos_sin_for(q, positions, offset, context_len, factor)
        if k.shape[-2] == q.shape[-2]:
            return apply_rotary_qk(q, k, cos, sin, layout=self.layout, inplace=inplace)
        if positions is not None:
            raise ValueError(
                f"positions apply to q and k of the same length; got q length {q.shape[-2]} and k length "
                f"{k.shape[-2]}: rotate them separately with rotate()"
            )
        cos_k, sin_k = self._cos_sin_for(k, None, offset, context_len, factor)
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
