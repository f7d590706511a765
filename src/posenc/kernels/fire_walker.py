"""FIRE's block walker for the blocked score-bias kernel (:mod:`posenc.kernels.block_walkers` has the hook):
its bias in blocks against reversed keys, its parameters' gradients summed by hand from each block's score
gradient instead of autograd through every score (Li et al. 2023's FIRE, arxiv.org/abs/2310.04418, is
:class:`posenc.bias.fire.FireBias`); and the piecewise-linear form of its MLP that both use."""

from __future__ import annotations

import math

import torch

from .block_walkers import BlockWalker
from .blocked_common import diagonal_sums

__all__ = ["FireWalker", "piecewise_linear"]


def piecewise_linear(u: torch.Tensor, bp, slope: torch.Tensor, intercept: torch.Tensor) -> torch.Tensor:
    """(heads, *u.shape): slope_s u + intercept_s on u's segment s, from
    :meth:`~posenc.bias.fire.FireBias.pieces`; the segment choice carries no gradient, the rest does (a
    gather, whose backward is a scatter_add)."""
    seg = torch.searchsorted(bp, u.detach().contiguous(), right=True)
    idx = seg.reshape(1, -1).expand(slope.shape[0], -1)
    return torch.addcmul(
        intercept.gather(1, idx).view(-1, *u.shape), slope.gather(1, idx).view(-1, *u.shape), u[None]
    )


class FireWalker(BlockWalker):
    """FIRE's bias (:class:`~posenc.bias.fire.FireBias`) block by block for
    :mod:`posenc.kernels.bias_blocked`, whose blocks are queries at positions p0 .. p0 + n - 1 against the
    keys kend - 1, ..., 0 (reversed).

    u(i, j) = psi(i - j) / norm(i) splits into a function of the distance, psi (one (2 k_len - 1,) vector, so
    a block's psi is a zero-copy strided view: entry (a, j') is at distance a + j' + p0 - kend + 1), and one
    of the query, norm (a (k_len,) vector). The bias is slope_s u + intercept_s on u's segment s
    (:meth:`~posenc.bias.fire.FireBias.pieces`). Two kinds of rows:

    * queries before the threshold share one normaliser, psi(L), so their bias is a function of i - j alone:
      one (heads, 2 k_len - 1) table whose blocks are strided views, as for T5 (in training, where L is the
      training length, every row);
    * later queries get their block computed: u, its segments (with a causal mask u rises along each row of
      reversed keys, so a row's segment boundaries are a search of the breakpoints in that row, not of
      every score in the breakpoints), slope and intercept gathered per head.

    Backward, from each block's score gradient dS (heads, n, kend), by hand instead of autograd through
    every score: table rows sum dS along each distance into the table's gradient; computed rows give
    d intercept[h, s] = the sum of dS_h over segment s and d slope[h, s] = that of dS_h u, and
    du = sum_h dS_h slope_h(seg), from which d psi (du / norm summed along each distance) and
    d norm(i) = -sum_j du u / norm(i). One autograd call in :meth:`finish` maps these few numbers
    (heads x segments, 2 k_len - 1, k_len, and the table's) to c, the threshold and the MLP's weights.
    """

    def __init__(self, bias, k_len: int, causal: bool, work: torch.dtype):
        self.bias, self.lk, self.causal, self.work = bias, k_len, causal, work
        self.params = [p for p in bias.parameters() if p.requires_grad]
        with torch.no_grad():
            self.psi, self.norm = self._psi_norm()
            self.bp, self.slope, self.intercept = bias.pieces()
            # positions i < L: max(i, L) = L, one normaliser (and autograd sends its gradient to L alone)
            threshold = float(bias.threshold)
            flat = math.ceil(threshold) if math.isfinite(threshold) else (k_len if threshold > 0 else 0)
            self.flat_rows = min(k_len, max(0, flat))
            self.table = (
                self._table(self.psi, self.norm, self.slope, self.intercept) if self.flat_rows else None
            )
            # causal rows search their own breakpoints where their u rises: future keys get u < 0 < every
            # valid u (they are masked), which needs psi non-decreasing in the distance, as log(c d + 1) is
            rises = bool((self.psi[k_len - 1 :].diff() >= 0).all())
            self.row_search = causal and rises
            self.psi_src = (
                torch.cat((self.psi.new_full((k_len - 1,), -1.0), self.psi[k_len - 1 :]))
                if self.row_search
                else self.psi
            )
        self._last = None

    def _psi_norm(self) -> tuple[torch.Tensor, torch.Tensor]:
        """psi at distances 1 - k_len .. k_len - 1 and norm at positions 0 .. k_len - 1, as
        :meth:`~posenc.bias.fire.FireBias.normalised_distance` computes them (the same ops, so the same
        rounding)."""
        b = self.bias
        dtype, device = b.c.dtype, b.c.device
        d = torch.arange(1 - self.lk, self.lk, device=device).to(dtype)
        return b.psi(d), b.normaliser(torch.arange(self.lk, device=device).to(dtype))

    def _table(self, psi, norm, slope, intercept) -> torch.Tensor:
        """(heads, 2 k_len - 1): the bias of a query before the threshold at each distance (-inf at the
        negative ones when causal); differentiable in its inputs."""
        tab = piecewise_linear(psi / norm[0], self.bp, slope, intercept)
        if self.causal:
            tab = torch.cat((tab.new_full((tab.shape[0], self.lk - 1), -math.inf), tab[:, self.lk - 1 :]), 1)
        return tab

    def _split(self, p0: int, n: int) -> int:
        """How many of the block's rows are table rows (they come first)."""
        return min(n, max(0, self.flat_rows - p0))

    def _rows(self, p0: int, n: int, kend: int, r: int):
        """Computed rows r .. n - 1 of block (p0, n, kend): u (m, kend), segments (m * kend,), slope and
        intercept gathered per head (heads, m, kend), m = n - r."""
        key = (p0, n, kend)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        m, start = n - r, p0 + r - kend + self.lk
        src = self.psi_src
        psi = src.as_strided((m, kend), (1, 1), src.storage_offset() + start)
        u = (psi / self.norm[p0 + r : p0 + n, None]).contiguous()
        edges = None
        if self.row_search:  # segment of (a, j') = how many breakpoints its row reaches by column j'
            first = torch.searchsorted(u, self.bp.expand(m, -1).contiguous())
            seg = u.new_zeros((m, kend + 1), dtype=torch.int32)
            seg.scatter_add_(1, first, torch.ones_like(first, dtype=torch.int32))
            seg = seg[:, :kend].cumsum(1, dtype=torch.int32).view(-1)
            # segment s of row a is its columns edges[a, s] .. edges[a, s + 1] - 1
            edges = torch.cat((first.new_zeros(m, 1), first, first.new_full((m, 1), kend)), 1)
        else:  # (int32 indices gather about twice as fast as int64 here)
            seg = torch.searchsorted(self.bp, u, right=True, out_int32=True).view(-1)
        h = self.slope.shape[0]
        slope = self.slope.index_select(1, seg).view(h, m, kend)
        intercept = self.intercept.index_select(1, seg).view(h, m, kend)
        self._last = (key, (u, seg, slope, intercept, edges))
        return self._last[1]

    def _table_view(self, p0: int, n: int, kend: int) -> torch.Tensor:
        h, s = self.table.shape[0], self.table.stride(0)
        off = self.table.storage_offset() + p0 - kend + self.lk
        return self.table.as_strided((h, n, kend), (s, 1, 1), off)

    def mask(self, p0: int, n: int, kend: int) -> torch.Tensor:
        """(1, heads, n, kend) bias in the work dtype, -inf at keys after the query when causal."""
        r = self._split(p0, n)
        if r == n:
            return self._table_view(p0, n, kend).to(self.work)[None]
        u, _, slope, intercept, _ = self._rows(p0, n, kend, r)
        t = torch.addcmul(intercept, slope, u).to(self.work)
        if self.causal:  # reversed keys: the future ones are the first n - 1 - a columns of row a
            a = torch.arange(r, n, device=t.device)
            t[:, :, :n].masked_fill_(
                torch.arange(n, device=t.device)[None, :] < (n - 1 - a)[:, None], -math.inf
            )
        if r:
            t = torch.cat((self._table_view(p0, r, kend).to(self.work), t), 1)
        return t[None]

    def new_grads(self):
        h, s = self.slope.shape
        table = torch.zeros_like(self.table) if self.table is not None else None
        return [
            self.slope.new_zeros(h, s),
            self.slope.new_zeros(h, s),
            torch.zeros_like(self.psi),
            torch.zeros_like(self.norm),
            table,
        ]

    def accumulate(self, grads, p0: int, n: int, kend: int, ds: torch.Tensor) -> None:
        """Add block (p0, n, kend)'s share given its score gradient ds (heads, n, kend); ds is zero at
        masked scores (P = 0 there), so whatever u and slope hold there adds nothing."""
        g_slope, g_intercept, g_psi, g_norm, g_table = grads
        ds = ds.to(self.psi.dtype)
        r = self._split(p0, n)
        if r:
            g_table[:, p0 - kend + self.lk :][:, : kend + r - 1] += diagonal_sums(ds[:, :r])
        if r == n:
            return
        u, seg, slope, _, edges = self._rows(p0, n, kend, r)
        ds, m = ds[:, r:], n - r
        h = ds.shape[0]
        for g, x in ((g_intercept, ds), (g_slope, ds * u)):
            if edges is None:
                g.index_add_(1, seg.long(), x.reshape(h, -1))  # (index_add_ is slow with int32 indices)
            else:  # a row's segments are runs of columns: differences of its prefix sums at their edges
                g += _run_sums(x, edges).sum(1)
        du = (ds * slope).sum(0).div_(self.norm[p0 + r : p0 + n, None])
        g_norm[p0 + r : p0 + n] -= (du * u).sum(-1)
        start = p0 + r - kend + self.lk
        g_psi[start : start + kend + m - 1] += diagonal_sums(du[None])[0]

    def finish(self, grads) -> list:
        """The parameters' gradients (in ``params`` order) from the accumulated ones."""
        g_slope, g_intercept, g_psi, g_norm, g_table = grads
        with torch.enable_grad():
            psi, norm = self._psi_norm()
            _, slope, intercept = self.bias.pieces()
            outputs, grad_outputs = [slope, intercept, psi, norm], [g_slope, g_intercept, g_psi, g_norm]
            if g_table is not None:
                table = self._table(psi, norm, slope, intercept)
                if self.causal:  # the -inf half has no gradient
                    table, g_table = table[:, self.lk - 1 :], g_table[:, self.lk - 1 :]
                outputs.append(table)
                grad_outputs.append(g_table)
            got = torch.autograd.grad(outputs, self.params, grad_outputs, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for p, g in zip(self.params, got, strict=True)]


def _run_sums(x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """(heads, m, s) from x (heads, m, k) and edges (m, s + 1), non-decreasing from 0 to k: entry (h, a, t) is
    the sum of x[h, a, edges[a, t] : edges[a, t + 1]], from one prefix sum per row (a scatter over t costs
    about three times as much)."""
    before = (edges - 1).clamp_(min=0).expand(x.shape[0], -1, -1)
    prefix = x.cumsum(-1).gather(-1, before).masked_fill_(edges == 0, 0)
    return prefix[..., 1:] - prefix[..., :-1]
