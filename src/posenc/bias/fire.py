"""FIRE: functional interpolation for relative positions (Li et al. 2023, arxiv.org/abs/2310.04418)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import _checks
from ..kernels.blocked_common import diagonal_sums
from .base import ScoreBias, check_lengths

__all__ = ["FireBias"]


class FireBias(ScoreBias):
    """FIRE: b(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) = log(c |x| + 1), an MLP f: 1 -> hidden -> heads
    (ReLU), c and the threshold L learnable (Li et al. 2023, section 3 and their appendix's listing).

    Args:
        n_heads: attention heads; the MLP's output width.
        hidden: the MLP's hidden width (paper: 32).
        train_len: the training sequence length.
        threshold: initial L; default ``train_len``.
        c: initial c (paper: 0.1).

    Why L starts at the training length: for queries before L the normaliser is psi(L), so during training
    the MLP sees inputs up to psi(T - 1) / psi(L) only. With the paper's L = 512 and T = 64 that is about 0.5:
    the MLP never learns (0.5, 1], yet past position L every query's farthest keys map there. With L <= T
    training already covers [0, 1), and longer inputs stay in the range it was trained on. L = |L0 * m|
    with a learnable multiplier m (init 1), as in the paper's listing; eps = 1e-6 keeps the normaliser > 0.

    The normaliser depends on the query's absolute position, so this is a *tile* bias: queries of a decoding
    step take their true positions (the last q_len of the k_len keys). Without a causal mask the distance is
    |i - j| (psi's absolute value), so the bias is symmetric.
    """

    per_tile = True
    eps = 1e-6

    precise_buffers = ("init_threshold",)

    def __init__(self, n_heads: int, hidden: int = 32, *, train_len: int, threshold=None, c: float = 0.1):
        super().__init__()
        self.n_heads = _checks.positive_int("n_heads", n_heads, size=True)
        self.hidden = _checks.positive_int("hidden", hidden, size=True)
        self.train_len = _checks.positive_int("train_len", train_len)
        threshold = float(train_len) if threshold is None else _checks.positive_float("threshold", threshold)
        # floats per query-key pair that a block of the blocked kernel holds (FireBlocks: u, its segment and
        # prefix sums, and per head slope, intercept, bias and two backward products)
        self.tile_width = 5 * n_heads + 3
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, n_heads))
        self.c = nn.Parameter(torch.tensor(_checks.positive_float("c", c)))
        self.register_buffer("init_threshold", torch.tensor(threshold))
        self.threshold_multiplier = nn.Parameter(torch.tensor(1.0))

    @property
    def threshold(self) -> torch.Tensor:
        """L = |L0 * m|, a 0-dim tensor."""
        return (self.init_threshold * self.threshold_multiplier).abs()

    def normalised_distance(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """psi(i - j) / (psi(max(L, i)) + eps) for broadcastable position tensors i and j."""
        dtype = self.c.dtype
        i, j = i.to(dtype), j.to(dtype)
        return self.psi(i - j) / self.normaliser(i)

    def psi(self, distance: torch.Tensor) -> torch.Tensor:
        """psi(d) = log(c |d| + 1), elementwise, in the parameters' dtype."""
        return torch.log(torch.abs(self.c * distance) + 1)

    def normaliser(self, i: torch.Tensor) -> torch.Tensor:
        """The normaliser of a query at position i: psi(max(L, i)) + eps, elementwise."""
        return self.psi(torch.maximum(i, self.threshold)) + self.eps

    def _mlp(self, u: torch.Tensor, h=None) -> torch.Tensor:
        """f(u) on the last axis: (..., heads), or head h's value (broadcast like u) when h is given."""
        lin1, lin2 = self.mlp[0], self.mlp[2]
        hid = torch.relu(u[..., None] * lin1.weight[:, 0] + lin1.bias)
        if h is None:
            return hid @ lin2.weight.T + lin2.bias
        return (hid * lin2.weight[h]).sum(-1) + lin2.bias[h]

    def pieces(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """f as the piecewise-linear function of u it is (one input, ReLU): sorted breakpoints (hidden,) and
        per segment slope and intercept (heads, hidden + 1), differentiable in the MLP's weights. Segment s
        holds u with s breakpoints <= u; a unit with zero input weight has its breakpoint at a quarter of the
        dtype's largest value (never reached: u lies in [0, 1])."""
        lin1, lin2 = self.mlp[0], self.mlp[2]
        w1, b1 = lin1.weight[:, 0], lin1.bias
        never = torch.finfo(w1.dtype).max / 4  # finite in every dtype, and room for the +-1 below
        with torch.no_grad():
            bp = (
                torch.where(w1 != 0, -b1 / torch.where(w1 != 0, w1, 1.0), never)
                .clamp(-never, never)
                .sort()[0]
            )
            mids = torch.cat((bp[:1] - 1, (bp[1:] + bp[:-1]) / 2, bp[-1:] + 1))
            active = (mids[:, None] * w1 + b1 > 0).to(w1.dtype)  # (segments, hidden)
        slope = (active * w1) @ lin2.weight.T
        intercept = (active * b1) @ lin2.weight.T + lin2.bias
        return bp.contiguous(), slope.T, intercept.T

    def tile(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(heads, nq, nk): f(u) = slope_s u + intercept_s on u's segment s, equal to the MLP (to rounding)
        at a few ops per score instead of ~hidden x heads."""
        return _piecewise(self.normalised_distance(q_pos[:, None], k_pos[None, :]), *self.pieces())

    def blocked_tiles(self, k_len: int, causal: bool, work: torch.dtype):
        """The blocked CPU kernel's view of this bias (:mod:`posenc.kernels.bias_blocked`): its blocks against
        keys in reverse order, and its parameters' gradients from each block's score gradient by hand
        (:class:`FireBlocks`) instead of autograd through every score."""
        return FireBlocks(self, k_len, causal, work)

    def score_mod(self, q_len: int, k_len: int | None = None, causal: bool = True):
        """FlexAttention ``score_mod``: the MLP evaluated per score (queries at q_idx + k_len - q_len)."""
        q_len, k_len = check_lengths(q_len, k_len)
        shift = k_len - q_len

        def fire_score_mod(score, b, h, q_idx, kv_idx):
            i = q_idx + shift
            biased = score + self._mlp(self.normalised_distance(i, kv_idx), h)
            if causal:
                biased = torch.where(i >= kv_idx, biased, -math.inf)
            return biased

        return fire_score_mod

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, hidden={self.hidden}, train_len={self.train_len}"


def _piecewise(u: torch.Tensor, bp, slope: torch.Tensor, intercept: torch.Tensor) -> torch.Tensor:
    """(heads, *u.shape): slope_s u + intercept_s on u's segment s, from :meth:`FireBias.pieces`; the segment
    choice carries no gradient, the rest does (a gather, whose backward is a scatter_add)."""
    seg = torch.searchsorted(bp, u.detach().contiguous(), right=True)
    idx = seg.reshape(1, -1).expand(slope.shape[0], -1)
    return torch.addcmul(
        intercept.gather(1, idx).view(-1, *u.shape), slope.gather(1, idx).view(-1, *u.shape), u[None]
    )


class FireBlocks:
    """FIRE's bias block by block for :mod:`posenc.kernels.bias_blocked`, whose blocks are queries at
    positions p0 .. p0 + n - 1 against the keys kend - 1, ..., 0 (reversed).

    u(i, j) = psi(i - j) / norm(i) splits into a function of the distance, psi (one (2 k_len - 1,) vector, so
    a block's psi is a zero-copy strided view: entry (a, j') is at distance a + j' + p0 - kend + 1), and one
    of the query, norm (a (k_len,) vector). The bias is slope_s u + intercept_s on u's segment s
    (:meth:`FireBias.pieces`). Two kinds of rows:

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

    def __init__(self, bias: FireBias, k_len: int, causal: bool, work: torch.dtype):
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
        :meth:`FireBias.normalised_distance` computes them (the same ops, so the same rounding)."""
        b = self.bias
        dtype, device = b.c.dtype, b.c.device
        d = torch.arange(1 - self.lk, self.lk, device=device).to(dtype)
        return b.psi(d), b.normaliser(torch.arange(self.lk, device=device).to(dtype))

    def _table(self, psi, norm, slope, intercept) -> torch.Tensor:
        """(heads, 2 k_len - 1): the bias of a query before the threshold at each distance (-inf at the
        negative ones when causal); differentiable in its inputs."""
        tab = _piecewise(psi / norm[0], self.bp, slope, intercept)
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
