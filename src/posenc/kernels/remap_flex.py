"""Remapped-distance attention on FlexAttention: one call per view of a remap, merged by log-sum-exp.

Each view of a remap (:mod:`posenc.remap`) scores the causal pairs of one :class:`~.remap_blocked.Band`
with its own rotated queries and keys. Here every view is one FlexAttention call whose block mask admits the
band's pairs (blocks outside the band are skipped, so a view costs what its band covers), returning its
rows' log-sum-exps; the views are merged as in flash-attention's split-KV decoding (Dao et al. 2023):
out = sum_n exp(lse_n - lse) out_n with lse = log sum_n exp(lse_n). Attention sinks (a logit s_h per head,
one more softmax entry with no value) are one more term of lse with output 0. Autograd differentiates the
merge; FlexAttention differentiates its own calls, log-sum-exps included. Compiled (CUDA), memory is O(L):
outputs and log-sum-exps per view, block masks of (L / 128)^2 entries. On the CPU FlexAttention runs eager,
torch's reference implementation: forward only, each view's scores materialised (a check, not a fast path).
"""

from __future__ import annotations

import math

import torch

from .flex import flex_with_lse
from .remap_blocked import Band

__all__ = ["band_mask_mod", "remap_attention_flex"]


def band_mask_mod(band: Band, q_start: int, k_start: int, device=None):
    """A FlexAttention ``mask_mod`` admitting ``band``'s causal pairs, for query index q_idx at absolute
    position q_start + q_idx and key index kv_idx at k_start + kv_idx."""
    lo, hi, unit = band.lo, band.hi, band.unit
    bounded = not math.isinf(hi)
    # the starts move with every decoding step: as tensors they are data to the compiler, not constants
    # that would compile the mask anew at each step
    q0, k0 = (torch.tensor(start, device=device) for start in (q_start, k_start))

    def mask_mod(b, h, q_idx, kv_idx):
        i, j = q_idx + q0, kv_idx + k0
        d = (i - j) if unit == 1 else (i // unit - j // unit)
        inside = (j <= i) & (d >= lo)
        return inside & (d < int(hi)) if bounded else inside

    return mask_mod


def remap_attention_flex(
    qs: torch.Tensor,
    ks: torch.Tensor,
    v: torch.Tensor,
    bands: tuple[Band, ...],
    *,
    scale: float,
    sinks: torch.Tensor | None = None,
    offset: int = 0,
) -> torch.Tensor:
    """qs (V, B, H, Lq, D) and ks (V, B, Hk, Lk, D): queries and keys rotated for each of the V views;
    v (B, Hk, Lk, Dv); keys at absolute positions offset .. offset+Lk-1, the queries the last Lq of them;
    ``bands[n]`` the pairs view n scores; ``sinks`` (H,) or None. Returns (B, H, Lq, Dv) in q's dtype."""
    from torch.nn.attention.flex_attention import create_block_mask

    lq, lk = qs.shape[-2], ks.shape[-2]
    batch, heads = qs.shape[1], qs.shape[2]
    work = torch.promote_types(qs.dtype, torch.float32)
    outs, lses = [], []
    for n, band in enumerate(bands):
        mask = band_mask_mod(band, offset + lk - lq, offset, qs.device)
        block_mask = create_block_mask(mask, None, None, lq, lk, device=qs.device, _compile=qs.is_cuda)
        out, lse = flex_with_lse(qs[n], ks[n], v, block_mask=block_mask, scale=scale)
        outs.append(out.to(work))
        lses.append(lse.to(work))
    lse = torch.stack(lses)  # (V, B, H, Lq)
    terms = lse
    if sinks is not None:
        sink = sinks.to(work).view(1, 1, heads, 1).expand(1, batch, heads, lq)
        terms = torch.cat((lse, sink))
    total = torch.logsumexp(terms, dim=0)  # every row has its diagonal key in some view: finite
    weights = torch.exp(lse - total).unsqueeze(-1)
    return (weights * torch.stack(outs)).sum(0).to(qs.dtype)
