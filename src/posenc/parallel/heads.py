"""The grouped-head contractions of a ring block: query head h reads kv head h // (H / Hk), as
scaled_dot_product_attention's ``enable_gqa``, without expanding the keys to the query heads."""

from __future__ import annotations

import torch

__all__ = ["grouped_dk", "grouped_pv", "grouped_qk"]


def grouped_qk(q, k):
    """(B, H, rows, cols) dot products of q (B, H, rows, D) and k (B, Hk, cols, D) (also dP = dO V^T)."""
    b, h, rows, d = q.shape
    hk = k.shape[1]
    return torch.einsum("bkgmd,bknd->bkgmn", q.view(b, hk, h // hk, rows, d), k).reshape(b, h, rows, -1)


def grouped_dk(ds, q, hk: int):
    """(B, Hk, cols, D): dS^T Q summed over each kv head's query heads (also dV = P^T dO)."""
    b, h, rows, n = ds.shape
    g = h // hk
    return torch.einsum("bkgmn,bkgmd->bknd", ds.view(b, hk, g, rows, n), q.view(b, hk, g, rows, -1))


def grouped_pv(p, v):
    """(B, H, rows, D): P V, each query head against its kv head (also dQ = dS K)."""
    b, h, rows, n = p.shape
    hk = v.shape[1]
    return torch.einsum("bkgmn,bknd->bkgmd", p.view(b, hk, h // hk, rows, n), v).reshape(b, h, rows, -1)
