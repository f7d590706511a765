"""The rotary base: one dispatch over one hook (RoPE, Su et al. 2021, arxiv.org/abs/2104.09864).

Every rotary embedding turns pair k of a query or key at position p by an angle theta_k(p), so q . k depends
on the positions through their difference: (a, b) -> (a cos - b sin, a sin + b cos) per pair. What differs
between posenc's five is only where the cos and sin come from; the rest is shared here, in
:class:`Rotary`:

* :meth:`Rotary.place`: the argument checks of q and k and where they sit (keys at ``offset``.., queries at
  the last q_len of the key positions, positions given for q alone also serving k at one length), and the
  settings both tables of one call share;
* :meth:`Rotary.forward` / :meth:`Rotary.rotate`: the dispatch: ask :meth:`Rotary.tables` for cos and sin,
  one table for q and k where one serves both, and run the kernel :func:`posenc.kernels.choose_path` picks.

A rotary overrides :meth:`Rotary.tables` (``tables(x, positions, offset, **options) -> (cos, sin)``,
shaped to broadcast against x) and nothing else need change: :class:`~.embedding.RotaryEmbedding` looks its
table up (and offers the small decode path's memoised rows), :class:`~.xpos.XPos` multiplies RoPE's by
its per-pair scale, :class:`~.mrope.MRotaryEmbedding` takes (axes, batch, seq) positions,
:class:`~.axial.AxialRotaryEmbedding` grid coordinates after unrotated prefix tokens, :class:`~.fope.FoPE`
per-head Fourier series. The last three place their own positions (:meth:`Rotary.place`), as their
positions are not a 1-D run.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from .. import _checks
from ..kernels import Path, apply_rotary, choose_path, run
from .checks import check_distinct, check_pair, key_positions

__all__ = ["Checked", "Placement", "Rotary"]


class Checked(NamedTuple):
    """Positions :meth:`Rotary.place` has checked against the tensor they go with: a :meth:`Rotary.tables`
    that checks its x and positions itself (M-RoPE's, axial's: their values are read to check them) takes
    these as they are instead of checking them twice."""

    positions: torch.Tensor


class Placement(NamedTuple):
    """Where one forward call's queries and keys sit (:meth:`Rotary.place`).

    ``q`` / ``k``: the positions handed to :meth:`Rotary.tables` (None: consecutive from ``q_offset`` /
    ``k_offset``; :class:`Checked` where place checked them); ``options``: the keywords both tables take
    (a setting of the whole call, such as a length-dependent schedule's context or xPos's centre,
    included)."""

    q: torch.Tensor | None
    q_offset: int
    k: torch.Tensor | None
    k_offset: int
    options: dict


class Rotary(nn.Module):
    """A rotary position embedding whose :meth:`forward` and :meth:`rotate` dispatch over :meth:`tables`.

    A subclass sets ``head_dim`` and ``layout`` ("interleaved" or "half" pairs) and overrides
    :meth:`tables`; what is its own besides (positions that are not a 1-D run, a decode path) it adds by
    overriding :meth:`place` or offering rows (``decodes_from_rows``, :meth:`rows`).

    Shape:
        forward(q, k, positions=None, offset=0, inplace=False, *, k_positions=None, **options) -> (q, k):
        q (..., q_len, head_dim), k (..., k_len, head_dim); positions / k_positions (seq,) or (batch, seq);
        default: keys at offset .. offset+k_len-1, queries at the last q_len of them. ``options`` go to
        :meth:`tables`. rotate(x, positions=None, offset=0, **options) -> x. cos_sin(positions) -> (cos,
        sin). It implements :class:`~.protocol.RotaryProtocol`.
    """

    head_dim: int
    layout: str
    #: one table serves q and k at the same positions (False where tables differ by kind or by x's heads)
    shared_tables: bool = True
    #: a default call (consecutive positions, no options) may take the small kernel on :meth:`rows`
    decodes_from_rows: bool = False
    #: its frequencies depend on the length of the call (dynamic NTK, LongRoPE): a schedule's subclass says so
    length_dependent: bool = False

    def tables(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, offset: int = 0, *, kind="q", **options
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The hook: cos and sin for x (..., seq, head_dim) at ``positions`` (+ ``offset``; None:
        offset .. offset+seq-1), each (..., seq, rotary_dim/2), broadcastable against x, float32 (float64
        for float64 x). It checks x and positions as only it knows them. ``kind``: "q" or "k", which of a
        forward's pair x is (ignored where queries and keys rotate alike)."""
        raise NotImplementedError(f"{type(self).__name__} must define tables(x, positions, offset, ...)")

    def rows(self, q: torch.Tensor, k: torch.Tensor, offset: int) -> tuple:
        """The small kernel's memoised rows (see :func:`posenc.kernels.rotate_small`) of k at offset.. and
        q at the last q_len of those, for a rotary with ``decodes_from_rows``."""
        raise NotImplementedError(f"{type(self).__name__} offers no decode rows")

    def place(self, q, k, positions, k_positions, offset, options: dict) -> Placement:
        """Check q and k and place them: keys at ``k_positions``, else at ``positions`` when q and k have one
        length, else at offset..; queries at ``positions``, else at the last q_len key positions (per
        sequence: left padding shifts them), bottom-right as a causal mask puts them."""
        check_pair(self, q, k, False)
        _checks.offset(offset)
        q_len, k_len = q.shape[-2], k.shape[-2]
        if positions is None and k_positions is None:  # the default, a decode step's
            return _consecutive(q_len, k_len, offset, options)
        k_positions = key_positions(q_len, k_len, positions, k_positions)
        if (
            positions is None
            and isinstance(k_positions, torch.Tensor)
            and k_positions.shape[-1:] == (k_len,)
            and q_len <= k_len
        ):
            positions = k_positions[..., k_len - q_len :]
        q_offset = offset if positions is not None else offset + max(k_len - q_len, 0)
        return Placement(positions, q_offset, k_positions, offset, options)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`tables` at 1-D positions (seq,) or (batch, seq), for one head: (seq, rotary_dim/2) or
        (batch, 1, seq, rotary_dim/2). A rotary whose positions are otherwise overrides it."""
        lead = (positions.shape[0], 1) if positions.dim() == 2 else ()
        x = torch.zeros(*lead, positions.shape[-1], self.head_dim, device=positions.device)
        return self.tables(x, positions)

    def rotate(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, offset: int = 0, **options
    ) -> torch.Tensor:
        """Rotate one tensor x (..., seq, head_dim) at ``positions`` (+ ``offset``), else at offset..;
        ``options`` go to :meth:`tables` (xPos: ``kind="k"`` rotates and scales x as keys)."""
        return apply_rotary(x, *self.tables(x, positions, offset, **options), layout=self.layout)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        offset: int = 0,
        inplace: bool = False,
        *,
        k_positions: torch.Tensor | None = None,
        **options,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys as :meth:`place` puts them. ``inplace=True`` overwrites q and k
        (inference only); ``options`` go to :meth:`tables`."""
        path = None
        if self.decodes_from_rows and positions is None and k_positions is None and _unset(options):
            # a default call's tables are rows of consecutive positions: the path can be chosen before
            # anything is looked up, so a decode step takes memoised rows instead; placed here, as place()
            # would place it (a static schedule), without checking q and k twice
            check_pair(self, q, k, inplace)
            _checks.offset(offset)
            path = choose_path((q, k), self.layout, rows=True, inplace=inplace)
            if path is Path.SMALL:
                rows = self.rows(q, k, offset)
                return run(path, (q, k), None, None, self.layout, inplace=inplace, rows=rows)
            at = _consecutive(q.shape[-2], k.shape[-2], offset, options)
        else:
            at = self.place(q, k, positions, k_positions, offset, options)
        if inplace:
            check_distinct(q, k, inplace)
        if self.shared_tables and at.k is at.q and q.shape[-2] == k.shape[-2]:  # one table serves both
            cos, sin = self.tables(q, at.q, at.q_offset, **at.options)
            path = path or choose_path((q, k), self.layout, cos=cos, inplace=inplace)
            return run(path, (q, k), cos, sin, self.layout, inplace=inplace)
        pair = (("q", q, at.q, at.q_offset), ("k", k, at.k, at.k_offset))
        # both tables before either rotation: on decode-sized calls ~20 us faster than alternating
        tables = [self.tables(x, where, start, kind=name, **at.options) for name, x, where, start in pair]
        outs = []
        for (name, x, _, _), (cos, sin) in zip(pair, tables, strict=True):
            chosen = path or choose_path((x,), self.layout, cos=cos, inplace=inplace)
            outs.append(run(chosen, (x,), cos, sin, self.layout, inplace=inplace, names=(name,))[0])
        return tuple(outs)


def _consecutive(q_len: int, k_len: int, offset: int, options: dict) -> Placement:
    """Keys at offset.., queries at the last q_len of them: the placement of a call given no positions."""
    return Placement(None, offset + max(k_len - q_len, 0), None, offset, options)


def _unset(options: dict) -> bool:
    return all(value is None for value in options.values())
