"""FIRE: functional interpolation for relative positions (Li et al. 2023, arxiv.org/abs/2310.04418)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import _checks
from ..kernels.fire_walker import FireWalker, piecewise_linear
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
        # floats per query-key pair that a block of the blocked kernel holds (FireWalker: u, its segment and
        # prefix sums, and per head slope, intercept, bias and two backward products)
        self.tile_width = 5 * n_heads + 3
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, n_heads))
        why = "c |i - j| must fit float32 at every distance up to 2^53"
        self.c = nn.Parameter(torch.tensor(_checks.positive_float("c", c, maximum=1e22, why=why)))
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
        return piecewise_linear(self.normalised_distance(q_pos[:, None], k_pos[None, :]), *self.pieces())

    def block_walker(self, inputs, k_len: int, causal: bool, work: torch.dtype):
        """The blocked CPU kernel's walker (:mod:`posenc.kernels.block_walkers`): this bias's blocks against
        keys in reverse order, and its parameters' gradients from each block's score gradient by hand
        (:class:`~posenc.kernels.fire_walker.FireWalker`) instead of autograd through every score."""
        return FireWalker(self, k_len, causal, work)

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
