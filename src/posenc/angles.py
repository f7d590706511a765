"""The frequency schedule base^(-2k/d) and the angles p * omega_k, formed in float64.

One schedule serves the sinusoidal encoding (Vaswani et al. 2017, sec. 3.5), RoPE (Su et al. 2021) and
every table built from them. Angles are formed in float64 because float32 loses them at large positions:
p * omega_k at p = 10^7 is off by ~0.1 rad when formed in float32.
"""

from __future__ import annotations

import torch

__all__ = ["angles", "inverse_frequencies"]


def inverse_frequencies(dim: int, base: float, device=None) -> torch.Tensor:
    """omega_k = base^(-2k/dim) for k = 0 .. dim/2 - 1, float64, shape (dim/2,)."""
    k = torch.arange(0, dim, 2, dtype=torch.float64, device=device)
    return 1.0 / base ** (k / dim)


def angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """theta = p * omega_k in float64, outside any autocast region.

    Args:
        positions: (seq,) or (batch, seq), integer or floating.
        inv_freq: (r/2,) shared, or (batch, r/2) with one schedule per sequence.

    Returns:
        (seq, r/2), or (batch, seq, r/2) when either argument is batched.
    """
    device = positions.device
    if device.type == "meta":  # shapes only; autocast has no meta device
        return _angles(positions, inv_freq)
    with torch.autocast(device.type, enabled=False):
        return _angles(positions, inv_freq)


def _angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    pos = positions.to(torch.float64)[..., None]
    inv = inv_freq.to(device=positions.device, dtype=torch.float64)
    if inv.dim() == 2:  # (batch, 1, r/2) against (batch or 1, seq, 1)
        pos = pos[None] if pos.dim() == 2 else pos
        inv = inv[:, None, :]
    return pos * inv
