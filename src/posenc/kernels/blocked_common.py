"""What the blocked CPU attention kernels share: torch's CPU flash kernel, the work dtype, argument checks,
the sum of a block of scores along each distance."""

from __future__ import annotations

import torch

flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
flash_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else is computed in float32 (half precision cannot hold the
    integer distances the kernels append or index with past 256 / 2048)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def diagonal_sums(x: torch.Tensor) -> torch.Tensor:
    """(heads, m + k - 1) from a block x (heads, m, k) of scores against keys in reverse order: entry t is the
    sum of x[:, a, j'] over a + j' = t, i.e. along one distance. A pad and a reshape ("skew"), no index."""
    h, m, k = x.shape
    width = k + m - 1
    return torch.nn.functional.pad(x, (0, m)).flatten(1)[:, : m * width].view(h, m, width).sum(1)


def check_qkv(q, k, v, block) -> None:
    """q (B, H, Lq, D), k (B, Hk, Lk, D), v (B, Hk, Lk, Dv), Hk dividing H, Lq <= Lk; block None or >= 1."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_floating_point():
            raise ValueError(
                f"{name} must be a floating tensor of shape (batch, heads, seq, dim), got "
                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}"
            )
    b, h, lq, d = q.shape
    if k.shape[0] != b or v.shape[:3] != k.shape[:3] or k.shape[-1] != d or h % k.shape[1]:
        raise ValueError(
            f"k (batch, kv_heads, k_len, {d}) and v (batch, kv_heads, k_len, v_dim) must match q of shape "
            f"{tuple(q.shape)} with kv_heads dividing heads; got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if lq > k.shape[2]:
        raise ValueError(
            f"q_len must be <= k_len (queries are the last q_len positions), got {lq} > {k.shape[2]}"
        )
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
        raise ValueError(f"block must be an integer >= 1, got {block!r}")
