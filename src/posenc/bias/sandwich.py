"""Sandwich (Chi, Fan, Rudnicky & Ramadge 2023, "Dissecting Transformer Length Extrapolation via the Lens of
Receptive Field Analysis", arxiv.org/abs/2212.10356)."""

from __future__ import annotations

import torch

from .. import _checks
from .base import ScoreBias

__all__ = ["SandwichBias"]


class SandwichBias(ScoreBias):
    """Sandwich: the inner product of two sinusoidal position embeddings as a parameter-free score bias,

        b_h(i, j) = (p_i . p_j - dim / 2) / (8 h / H),   h = 1 .. H,

    with p the sinusoidal embedding of width ``dim`` (Vaswani et al. 2017), so p_i . p_j = sum_k cos((i - j)
    omega_k), omega_k = 10000^(-2k/dim), k < dim/2; minus its value dim/2 at distance 0, so the bias is 0 on
    the diagonal and negative elsewhere (a row constant: softmax is unchanged by it). The per-head division
    by 8h/H is the paper's "compression ratio" (its appendix; FlexAttention's attn-gym does the same): head 1
    decays fastest. The paper uses dim = 128 whatever the model width.

    Args:
        n_heads: attention heads H.
        dim: width of the sinusoidal embedding (even).
    """

    precise_buffers = ("omega", "ratio")

    def __init__(self, n_heads: int, dim: int = 128):
        super().__init__()
        self.n_heads = _checks.positive_int("n_heads", n_heads, size=True)
        self.dim = _checks.even_int("dim", dim)
        omega = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        ratio = torch.arange(1, n_heads + 1, dtype=torch.float64) * 8.0 / n_heads
        self.register_buffer("omega", omega, persistent=False)
        self.register_buffer("ratio", ratio, persistent=False)

    def table(self, distance: torch.Tensor) -> torch.Tensor:
        angles = distance.to(torch.float64)[:, None] * self.omega[None, :]
        kernel = torch.cos(angles).sum(-1) - self.dim / 2
        return (kernel[None, :] / self.ratio[:, None]).to(torch.float32)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, dim={self.dim}"
