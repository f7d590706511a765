"""One ring step's arithmetic: a rank's queries against one rank's keys at their global indices, forward
(partial output and log-sum-exp) and backward (recomputed from the final log-sum-exp, as FlashAttention's
backward; Dao 2023, arXiv:2307.08691).

Which query-key pairs may meet is decided by global token indices (-1 for a pad slot): causal (key index
<= query index), a sliding window (query index - key index < window), packed documents (equal document
ids). A score bias is evaluated at the pair's positions through :meth:`~posenc.bias.base.ScoreBias.tile`,
so its distances are the global ones whatever the layout; with a remap's views (q and k hold one rotation
per view side by side), each pair is scored by the view whose band holds its global distance. Queries go
in chunks of rows and each chunk takes only the key columns some of its rows may see, so a causal or
windowed block costs what it must and peak memory is a chunk's scores, not a block's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Keys", "Queries", "Rule", "block_backward", "block_forward", "merge"]

# Scores held at once per chunk of query rows (batch x heads x rows x keys).
_CHUNK_SCORES = 1 << 22
# A chunk takes a gathered subset of key columns when it needs at most this share of them.
_GATHER_SHARE = 0.75


@dataclass
class Queries:
    """A rank's queries: q (B, H, m, D) rotated, in the work dtype; their global ``index`` (m,) (-1 = pad),
    ``position`` (m,) for the bias and ``document`` (m,) ids or None."""

    q: torch.Tensor
    index: torch.Tensor
    position: torch.Tensor
    document: torch.Tensor | None


@dataclass
class Keys:
    """A rank's keys and values: k (B, Hk, n, D), v (B, Hk, n, Dv), and their index, position, document."""

    k: torch.Tensor
    v: torch.Tensor
    index: torch.Tensor
    position: torch.Tensor
    document: torch.Tensor | None


@dataclass(frozen=True)
class Rule:
    """Which pairs may meet and what is added to their scores."""

    causal: bool
    window: int | None
    bias: object  # a ScoreBias or None
    scale: float
    bands: tuple | None = None  # a remap's views: q and k hold one rotation per view side by side

    def allowed(self, qi, ki, qd, kd) -> torch.Tensor:
        """(rows, n) True where query index qi may see key index ki."""
        ok = (qi[:, None] >= 0) & (ki[None, :] >= 0)
        if self.causal:
            ok &= ki[None, :] <= qi[:, None]
        if self.window is not None:
            ok &= (qi[:, None] - ki[None, :]) < self.window
            if not self.causal:
                ok &= (ki[None, :] - qi[:, None]) < self.window
        if qd is not None:
            ok &= qd[:, None] == kd[None, :]
        return ok


def _chunks(queries: Queries, keys: Keys):
    b, h, m, _ = queries.q.shape
    rows = max(1, _CHUNK_SCORES // max(1, b * h * keys.k.shape[2]))
    for start in range(0, m, rows):
        yield slice(start, min(m, start + rows))


def _columns(ok: torch.Tensor):
    """The key columns a chunk needs: None for all of them, else their indices."""
    cols = ok.any(0)
    count = int(cols.sum())
    if count == 0:
        return torch.empty(0, dtype=torch.long, device=ok.device)
    if count > _GATHER_SHARE * ok.shape[1]:
        return None
    return cols.nonzero().squeeze(1)


def _grouped_qk(q, k):
    """(B, H, rows, cols) dot products; grouped heads: q head h uses kv head h // (H / Hk), as
    scaled_dot_product_attention's enable_gqa."""
    b, h, rows, d = q.shape
    hk = k.shape[1]
    return torch.einsum("bkgmd,bknd->bkgmn", q.view(b, hk, h // hk, rows, d), k).reshape(b, h, rows, -1)


def _view_masks(rule: Rule, qp, kp):
    """Per view of a remap, (rows, cols) True where the pair's distance lies in the view's band."""
    return [band.inside(qp, kp) for band in rule.bands]


def _views(t, n: int):
    width = t.shape[-1] // n
    return [t[..., v * width : (v + 1) * width] for v in range(n)]


def _scores(rule: Rule, q, k, ok, qp, kp, dtype) -> torch.Tensor:
    """(B, H, rows, cols) scores with the bias added and disallowed pairs at -inf; with a remap's views,
    each pair scored by the view whose band holds its distance."""
    if rule.bands is None:
        s = _grouped_qk(q, k) * rule.scale
    else:
        s = q.new_zeros(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        inside = _view_masks(rule, qp, kp)
        for qv, kv, band in zip(_views(q, len(inside)), _views(k, len(inside)), inside, strict=True):
            s = torch.where(band, _grouped_qk(qv, kv) * rule.scale, s)
    if rule.bias is not None:
        s = s + rule.bias.tile(qp, kp).to(dtype)
    return s.masked_fill(~ok, -math.inf)


def _select(keys: Keys, cols):
    if cols is None:
        return keys.k, keys.v, keys.position
    return keys.k.index_select(2, cols), keys.v.index_select(2, cols), keys.position.index_select(0, cols)


def _chunk_mask(rule, queries, keys, rows):
    qd = None if queries.document is None else queries.document[rows]
    return rule.allowed(queries.index[rows], keys.index, qd, keys.document)


def block_forward(rule: Rule, queries: Queries, keys: Keys):
    """(out (B, H, m, Dv), lse (B, H, m)) of the queries against these keys alone; a row that may see no
    key gets out 0 and lse -inf."""
    b, h, m, _ = queries.q.shape
    dtype = queries.q.dtype
    out = queries.q.new_zeros(b, h, m, keys.v.shape[-1])
    lse = queries.q.new_full((b, h, m), -math.inf)
    for rows in _chunks(queries, keys):
        ok = _chunk_mask(rule, queries, keys, rows)
        cols = _columns(ok)
        if cols is not None and cols.numel() == 0:
            continue
        k, v, kp = _select(keys, cols)
        ok = ok if cols is None else ok.index_select(1, cols)
        s = _scores(rule, queries.q[:, :, rows], k, ok, queries.position[rows], kp, dtype)
        chunk_lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - _finite(chunk_lse)[..., None])
        out[:, :, rows] = _grouped_pv(p, v)
        lse[:, :, rows] = chunk_lse
    return out, lse


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """lse with -inf rows (nothing visible) as 0, so exp(s - lse) is 0 there instead of NaN."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def _grouped_dq(ds, k):
    """(B, H, rows, D): dS K, each query head against its kv head."""
    b, h, rows, n = ds.shape
    hk = k.shape[1]
    return torch.einsum("bkgmn,bknd->bkgmd", ds.view(b, hk, h // hk, rows, n), k).reshape(b, h, rows, -1)


def _grouped_dk(ds, q, hk: int):
    """(B, Hk, cols, D): dS^T Q summed over each kv head's query heads."""
    b, h, rows, n = ds.shape
    g = h // hk
    return torch.einsum("bkgmn,bkgmd->bknd", ds.view(b, hk, g, rows, n), q.view(b, hk, g, rows, -1))


def _grouped_pv(p, v):
    b, h, rows, n = p.shape
    hk = v.shape[1]
    return torch.einsum("bkgmn,bknd->bkgmd", p.view(b, hk, h // hk, rows, n), v).reshape(b, h, rows, -1)


def merge(out, lse, out_b, lse_b):
    """Two partial attentions over disjoint key sets merged by their log-sum-exps (exact)."""
    new = torch.logaddexp(lse, lse_b)
    safe = _finite(new)
    w, w_b = torch.exp(lse - safe), torch.exp(lse_b - safe)
    return out * w[..., None] + out_b * w_b[..., None], new


def block_backward(rule: Rule, queries: Queries, keys: Keys, dout, delta, lse, dq, dk, dv, params, grads):
    """Adds this block's gradients into dq (B, H, m, D), dk, dv (B, Hk, n, .) and the bias parameters'
    ``grads``. ``lse`` is the final (all keys) log-sum-exp, ``delta`` = rowsum(dout * out) - dlse."""
    b, h, m, d = queries.q.shape
    hk = keys.k.shape[1]
    g = h // hk
    dtype = queries.q.dtype
    for rows in _chunks(queries, keys):
        ok = _chunk_mask(rule, queries, keys, rows)
        cols = _columns(ok)
        if cols is not None and cols.numel() == 0:
            continue
        k, v, kp = _select(keys, cols)
        ok = ok if cols is None else ok.index_select(1, cols)
        q = queries.q[:, :, rows]
        r = q.shape[2]
        s = _scores(rule, q, k, ok, queries.position[rows], kp, dtype)
        p = torch.exp(s - _finite(lse[:, :, rows])[..., None])
        do = dout[:, :, rows]
        dp = torch.einsum("bkgmd,bknd->bkgmn", do.view(b, hk, g, r, -1), v).reshape(b, h, r, -1)
        ds = p * (dp - delta[:, :, rows, None])
        if rule.bands is None:
            dq[:, :, rows] += rule.scale * _grouped_dq(ds, k)
            dk_b = rule.scale * _grouped_dk(ds, q, hk)
        else:
            n = len(rule.bands)
            inside = _view_masks(rule, queries.position[rows], kp)
            dq_v, dk_v = [], []
            for qv, kv, band in zip(_views(q, n), _views(k, n), inside, strict=True):
                ds_v = ds * band
                dq_v.append(_grouped_dq(ds_v, kv))
                dk_v.append(_grouped_dk(ds_v, qv, hk))
            dq[:, :, rows] += rule.scale * torch.cat(dq_v, dim=-1)
            dk_b = rule.scale * torch.cat(dk_v, dim=-1)
        dv_b = torch.einsum("bkgmn,bkgmd->bknd", p.view(b, hk, g, r, -1), do.view(b, hk, g, r, -1))
        if cols is None:
            dk += dk_b
            dv += dv_b
        else:
            dk.index_add_(2, cols, dk_b)
            dv.index_add_(2, cols, dv_b)
        if params:
            with torch.enable_grad():
                tile = rule.bias.tile(queries.position[rows], kp)
                found = torch.autograd.grad(tile, params, ds.sum(0).to(tile.dtype), allow_unused=True)
            for total, grad in zip(grads, found, strict=True):
                if grad is not None:
                    total += grad
