"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", arxiv.org/abs/2212.10554): RoPE whose pairs
also decay with distance, and the blockwise causal mask the paper evaluates it with past the training length.

Pair i of the rotary dimensions d has zeta_i = (2i/d + gamma) / (1 + gamma) in (0, 1) (torchscale's
``(arange(0, d, 2) + 0.4 d) / (1.4 d)`` for gamma = 0.4). A query at position n is rotated as by RoPE and
multiplied by zeta_i^((n - c)/B), a key at m by zeta_i^(-(m - c)/B), B = ``scale_base`` (Algorithm 1), so
q.k carries zeta_i^((n - m)/B) in every pair: a key before the query weighs less the farther it is, the
high-frequency pairs (small zeta) fastest. The centre c cancels in every score. It exists because each
factor alone grows exponentially: zeta_0 = gamma / (1 + gamma) = 2/7 for gamma = 0.4, so a key 4,533
positions from c is scaled by zeta_0^(-4533/512) > 65,504 (float16's largest) and one 36,261 positions away
past float32's. Measured from position 0 (c = 0), float16 would overflow at position ~4.5k and float32 at
~36k; with the default centre, the middle of a call's keys, a call may hold ~9k (float16) or ~72k (float32)
keys. The factors are computed in float64 and folded into RoPE's float32 cos/sin, so half-precision inputs
are scaled in float32 and rounded once. A CPU call whose factors exceed its dtype raises instead of returning
inf (on accelerators and while tracing the check is skipped, as for positions: it would read a tensor); the
factor bounds the scaling, so a component of size a overflows a distance B ln(a) / ln(1/zeta_0) sooner.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .. import _checks
from .base import Placement
from .checks import check_fits, check_positions
from .embedding import RotaryEmbedding
from .table import align_to

__all__ = ["XPos", "blockwise_causal_mask"]

KINDS = ("q", "k")


class _CallCentre(NamedTuple):
    """The centre a forward call takes once, from its keys, for both tables: checked once, never read."""

    value: object


class XPos(RotaryEmbedding):
    """xPos: RoPE times a per-pair exponential decay (Sun et al. 2022, arxiv.org/abs/2212.10554).

    A :class:`RotaryEmbedding` (same layouts, partial rotary, positions / offset / k_positions, bottom-right
    queries), so ``posenc.attention(q, k, v, rotary=XPos(...))`` applies it. Dimensions past rotary_dim are
    neither rotated nor scaled. The default layout is "interleaved", as torchscale's implementation.

    Args:
        head_dim, base, rotary_dim, layout: as for :class:`RotaryEmbedding` (no context-extension scaling).
        scale_base: B, the distance over which a pair's score decays by zeta_i (paper and torchscale: 512).
        gamma: > 0; zeta_i = (2i/rotary_dim + gamma) / (1 + gamma) (paper: 0.4). Larger gamma, weaker decay.
        centre: a fixed centre c for every call (see the module docstring); None: each call centres on the
            middle of its key positions, rounded up (keys 0..L-1: L // 2). Decoding with a cache of keys
            already scaled needs one centre for the whole sequence: give it here or to each call.

    Shape:
        forward(q, k, positions=None, offset=0, inplace=False, *, k_positions=None, centre=None) -> (q, k), as
        :meth:`RotaryEmbedding.forward`; ``centre``: a number or a (batch,) tensor, one per sequence.
        rotate(x, positions=None, offset=0, *, kind="q", centre=None) -> x: one tensor, as queries unless
        ``kind="k"`` (queries scale by zeta^(+n/B), keys by zeta^(-n/B)); with the default centre,
        ``rotate(x)`` is ``forward(x, k)[0]`` for any k of x's length. The dispatch is
        :class:`~.base.Rotary`'s: this class gives RoPE's :meth:`tables` times its scale, per kind, and the
        centre a call's queries and keys share (:meth:`place`).
    """

    shared_tables = False  # queries and keys scale apart

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: str = "interleaved",
        *,
        scale_base: float = 512.0,
        gamma: float = 0.4,
        centre: float | None = None,
    ):
        super().__init__(head_dim, base=base, rotary_dim=rotary_dim, layout=layout)
        self.decodes_from_rows = False  # the memoised rows are RoPE's, without the scale
        self.scale_base = _checks.positive_float("scale_base", scale_base)
        self.gamma = _checks.positive_float("gamma", gamma)  # gamma = 0 makes zeta_0 = 0: 0^(-x) = inf
        self.centre = None if centre is None else float(_checks.number("centre", centre))
        r = self.rotary_dim
        # Python floats, not a tensor attribute: a traced call builds its constant from them (see table.py).
        self._log_zeta = tuple(math.log((2 * i / r + self.gamma) / (1 + self.gamma)) for i in range(r // 2))

    @property
    def zeta(self) -> torch.Tensor:
        """The per-pair decay bases zeta_i, (rotary_dim/2,) float64."""
        return torch.tensor(self._log_zeta, dtype=torch.float64).exp()

    def scale(self, positions: torch.Tensor, centre, kind: str) -> torch.Tensor:
        """zeta_i^(+-(p - c)/B) (+ for kind="q", - for "k"), float64, (seq, rotary_dim/2) or
        (batch, seq, rotary_dim/2) for (batch, seq) positions or a (batch,) centre."""
        _checks.one_of("kind", kind, KINDS)
        pos = positions.to(torch.float64)
        c = centre.to(pos.device, torch.float64) if isinstance(centre, torch.Tensor) else centre
        if isinstance(c, torch.Tensor) and c.dim() == 1:  # one centre per sequence
            c = c[:, None]
        exponent = (pos - c) / self.scale_base if kind == "q" else (c - pos) / self.scale_base
        log_zeta = torch.tensor(self._log_zeta, dtype=torch.float64, device=pos.device)
        return torch.exp(exponent[..., None] * log_zeta)

    def tables(
        self, x, positions=None, offset: int = 0, *, kind="q", centre=None, context_len=None, factor=None
    ):
        """RoPE's cos and sin (:meth:`RotaryEmbedding.tables`) times the xPos factors of x (..., seq,
        head_dim) as queries (kind="q", the default: what :meth:`forward` does to q) or keys (kind="k").

        ``centre`` (else the module's, else the middle of x's own positions): pass the same one for the
        queries and keys that will meet, e.g. new tokens' keys appended to a cache of scaled keys.
        """
        _checks.one_of("kind", kind, KINDS)
        cos, sin = super().tables(x, positions, offset, context_len=context_len, factor=factor)
        p = self._positions(x, positions, offset)
        if isinstance(centre, _CallCentre):
            c = centre.value
        else:
            c = self._centre(centre, p, offset, x.shape[-2], positions is None)
        return self._scaled(x, cos, sin, p, c, kind)

    def place(self, q, k, positions, k_positions, offset, options: dict) -> Placement:
        """:meth:`RotaryEmbedding.place`, and the centre q and k share: ``centre``, else the module's, else
        the middle of the key positions."""
        at = super().place(q, k, positions, k_positions, offset, options)
        pk = None  # the keys' positions: only a default centre of explicit ones reads them
        if at.k is not None and at.options.get("centre") is None and self.centre is None:
            check_positions(k, at.k)  # before the tables would: the centre is taken first
            pk = self._positions(k, at.k, at.k_offset)
        c = self._centre(at.options.get("centre"), pk, at.k_offset, k.shape[-2], at.k is None)
        return at._replace(options={**at.options, "centre": _CallCentre(c)})

    def check_cache_mode(self, mode: str) -> None:
        """A cache that keeps keys already scaled needs the fixed centre its queries will be scaled about."""
        if self.centre is None and mode != "unrotated":
            raise ValueError(
                f"mode={mode!r} caches xPos keys already scaled, which only meet queries scaled about the "
                "same centre: give the XPos a fixed centre (XPos(..., centre=c), c near the middle of the "
                "positions you expect) or use mode='unrotated'"
            )

    def rotate_cached(self, x, offset: int, total: int, kind: str):
        """Rotated and scaled as queries or keys about the fixed centre, else about the centre of a forward
        pass over keys 0..total-1 (their middle)."""
        centre = self.centre if self.centre is not None else total // 2
        return self.rotate(x, offset=offset, context_len=total, kind=kind, centre=centre)

    def rotate_as(self, x, positions, kind, *, context_len=None, centre=None):
        """As queries or keys about the module's fixed centre, else about ``centre``: queries and keys
        scaled about one centre, whatever it is, meet with zeta^((n - m)/B) (the centre cancels)."""
        _checks.one_of("kind", kind, KINDS)
        centre = self.centre if self.centre is not None else centre
        return self.rotate(x, positions, kind=kind, centre=centre, context_len=context_len)

    def shift_scale(self, delta):
        """zeta_i^(-delta/B): a key's scale at p + delta over its scale at p (the centre cancels)."""
        return self.scale(delta, 0.0, "k")

    def _positions(self, x, positions, offset) -> torch.Tensor:
        if positions is None:
            return torch.arange(offset, offset + x.shape[-2], device=x.device)
        positions = positions.to(x.device)
        return positions + offset if offset else positions

    def _centre(self, centre, key_positions, offset, k_len, contiguous: bool):
        if centre is None:
            centre = self.centre
        if centre is None:
            if contiguous:  # keys offset .. offset+k_len-1: ceil of their midpoint, without reading a tensor
                return offset + k_len // 2
            if key_positions.numel() == 0:
                return 0.0
            pk = key_positions.to(torch.float64)
            return torch.ceil((pk.amin(-1) + pk.amax(-1)) / 2)
        if isinstance(centre, torch.Tensor) and centre.dim() > 0:
            if centre.dim() != 1 or centre.is_complex():
                raise ValueError(
                    f"centre must be a number or a (batch,) tensor, got shape {tuple(centre.shape)}"
                )
            if _checks.can_read(centre) and not bool(torch.isfinite(centre).all()):
                raise ValueError(f"centre must be finite, got {centre.tolist()}")
            return centre
        return _checks.number("centre", centre)

    def _scaled(self, x, cos, sin, positions, centre, kind: str):
        """cos and sin times the xPos factors, in the table's dtype (float32, float64 for float64 x). Both
        members of a pair share its factor, so the kernels' backward (the same rotation with sin negated) is
        still the transpose: (s R(theta))^T = s R(-theta)."""
        s = self.scale(positions, centre, kind)
        if _checks.can_read(s) and s.numel():
            why = (
                f"positions lie too far from the centre {centre!r}; pass a centre nearer the positions "
                "(default: the middle of the keys) or use a wider dtype"
            )
            check_fits(x.dtype, cos.dtype, s, why)
        s = s.to(cos.dtype)
        s, _ = align_to(s, s, x, "centre/positions")
        return cos * s, sin * s

    def extra_repr(self) -> str:
        s = super().extra_repr() + f", scale_base={self.scale_base:g}, gamma={self.gamma:g}"
        return s + ("" if self.centre is None else f", centre={self.centre:g}")


def blockwise_causal_mask(
    q_len: int, k_len: int, window: int, *, offset: int = 0, device=None
) -> torch.Tensor:
    """Blockwise causal attention (BCA; Sun et al. 2022, section 3.3), for inference past the training length.

    Positions fall in blocks of ``window``; a query at position i sees the keys j <= i of its own block and
    the previous one: (i // window - 1) * window <= j <= i, so between window and 2 * window - 1 keys once
    past the first block. The paper takes window = l/2 for training length l ("we divide the query as blocks
    with l/2 length, and each query interacts with its own block and the last block"), so no query sees
    more than l - 1 keys back. Blocks are counted from position 0: keys sit at offset .. offset+k_len-1 and
    the queries are the last q_len of them (bottom-right, as :func:`posenc.attention` puts them).

    Returns:
        bool (q_len, k_len), True where a query may attend: ``posenc.attention``'s ``bias=``.
    """
    _checks.positive_int("q_len", q_len, minimum=0, size=True)
    _checks.positive_int("k_len", k_len, minimum=0, size=True)
    _checks.positive_int("window", window, position=True)
    _checks.offset(offset)
    if q_len > k_len:
        raise ValueError(f"q_len must be <= k_len (queries are the last q_len keys), got {q_len} > {k_len}")
    i = torch.arange(offset + k_len - q_len, offset + k_len, device=device)[:, None]
    j = torch.arange(offset, offset + k_len, device=device)[None, :]
    return (j <= i) & (j >= (torch.div(i, window, rounding_mode="floor") - 1) * window)
