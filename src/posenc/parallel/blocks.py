"""One ring step's arithmetic: a rank's queries against one rank's keys at their global indices, forward
(partial output and log-sum-exp) and backward (recomputed from the final log-sum-exp, as FlashAttention's
backward; Dao 2023, arXiv:2307.08691).

Which query-key pairs may meet is decided by global token indices (-1 for a pad slot): causal (key index
<= query index), a sliding window (query index - key index < window), packed documents (equal document
ids). A score bias is evaluated at the pair's positions through :meth:`~posenc.bias.base.ScoreBias.tile`,
so its distances are the global ones whatever the layout; with a remap's views (q and k hold one rotation
per view side by side), each pair is scored by the view whose band holds its global distance.

Three paths, the first that applies: runs of consecutive tokens (contiguous and head-tail shards) with no
bias, window or documents, each pair of runs whole, causal on the diagonal or skipped, on torch's CPU flash
kernel without a mask; chunks of query rows on the flash kernel with an additive mask (a bias without
trained parameters, windows, documents, pads); chunks of rows on this module's own arithmetic (trained
biases, whose parameter gradients need the scores; remaps; content terms: FoX's, the banded bias's,
Shaw's and CoPE's (:mod:`.relative`); values narrower than the queries; CUDA). A
chunk takes only the key columns some of its rows may see, so a causal or windowed block costs what it
must and peak memory is a chunk's scores, not a block's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..kernels.blocked_common import flash, flash_bwd
from .heads import grouped_dk, grouped_pv, grouped_qk
from .relative import cope_gates, cope_term, gate_totals, run_ids, shaw_key_term, shaw_value_term

__all__ = [
    "Keys",
    "Queries",
    "Rule",
    "banded_term",
    "block_backward",
    "block_count_gradients",
    "block_forward",
    "block_gate_totals",
    "merge",
]

# Scores held at once per chunk of query rows (batch x heads x rows x keys).
_CHUNK_SCORES = 1 << 22
# A chunk takes a gathered subset of key columns when it needs at most this share of them.
_GATHER_SHARE = 0.75
# What a disallowed pair adds to its score on the flash path: exp of it is exactly 0 beside any real score.
_MASKED = -1e30
# A shard of at most this many runs of consecutive indices (contiguous: 1, head-tail: 2 per document) is
# attended run against run, each pair whole, causal on the diagonal or skipped: no mask at all.
_MAX_RUNS = 8


@dataclass
class Queries:
    """A rank's queries: q (B, H, m, D) rotated, in the work dtype; their global ``index`` (m,) (-1 = pad),
    ``position`` (m,) for the bias, ``document`` (m,) ids or None, ``term`` (B, H, m) float64 or None: a
    per-token score term, query i and key j adding term_i - term_j (FoX's cumulative log forget gates), and
    ``rel`` (B, H, m, d_rel) or None: the banded bias's r, query i and key j adding r_i . P[:, i - j];
    ``counts`` (B, H, m, runs) or None: CoPE's gate totals of the later runs (:mod:`.relative`)."""

    q: torch.Tensor
    index: torch.Tensor
    position: torch.Tensor
    document: torch.Tensor | None
    term: torch.Tensor | None = None
    rel: torch.Tensor | None = None  # Inkling's r (B, H, m, d_rel) of the banded bias
    counts: torch.Tensor | None = None  # CoPE: (B, H, m, runs) the gates of the runs after each run


@dataclass
class Keys:
    """A rank's keys and values: k (B, Hk, n, D), v (B, Hk, n, Dv), and their index, position, document and
    term (B, H, n)."""

    k: torch.Tensor
    v: torch.Tensor
    index: torch.Tensor
    position: torch.Tensor
    document: torch.Tensor | None
    term: torch.Tensor | None = None


@dataclass(frozen=True)
class Rule:
    """Which pairs may meet and what is added to their scores."""

    causal: bool
    window: int | None
    bias: object  # a ScoreBias or None
    scale: float
    bands: tuple | None = None  # a remap's views: q and k hold one rotation per view side by side
    decay: bool = False  # per-token terms: query i and key j add term_i - term_j (FoX)
    table: torch.Tensor | None = None  # the banded bias's P (d_rel, extent): r_i . P[:, i - j] in the band
    relative: object = None  # a ShawRelative or a CoPE: terms of the query content and the pair (.relative)
    runs: torch.Tensor | None = None  # CoPE: the global index at which each run of keys starts

    @property
    def content(self) -> bool:
        """Whether a term reads the queries' content (FoX's gates, the banded bias's r, Shaw's and CoPE's
        tables): own arithmetic."""
        return self.decay or self.table is not None or self.relative is not None

    @property
    def shaw(self) -> bool:
        """Whether the relative term is Shaw et al.'s (a value term as well), else CoPE's."""
        return hasattr(self.relative, "value_table")

    def flash(self, q: torch.Tensor, v: torch.Tensor) -> bool:
        """Whether blocks run on torch's CPU flash kernel (scores never materialised): on the CPU, values as
        wide as queries (the kernel's condition), without a remap's views or a bias whose parameters need
        their gradient from the scores."""
        trained = self.bias is not None and any(p.requires_grad for p in self.bias.parameters())
        cpu = q.device.type == "cpu" and q.shape[-1] == v.shape[-1]
        return cpu and self.bands is None and not trained and not self.content

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


def _view_masks(rule: Rule, qp, kp):
    """Per view of a remap, (rows, cols) True where the pair's distance lies in the view's band."""
    return [band.inside(qp, kp) for band in rule.bands]


def _views(t, n: int):
    width = t.shape[-1] // n
    return [t[..., v * width : (v + 1) * width] for v in range(n)]


def banded_term(rel, table, qp, kp) -> torch.Tensor:
    """(B, H, rows, cols): r_i . P[:, i - j] where 0 <= i - j < extent, else 0 (Inkling's banded bias at
    global positions); differentiable in r (B, H, rows, d_rel) and P (d_rel, extent)."""
    extent = table.shape[1]
    d = qp[:, None] - kp[None, :]
    inside = (d >= 0) & (d < extent)
    profiles = torch.matmul(rel, table.to(rel.dtype))  # (B, H, rows, extent)
    index = d.clamp(0, extent - 1).expand(*profiles.shape[:2], *d.shape)
    return torch.gather(profiles, -1, index) * inside


@dataclass
class _Chunk:
    """A chunk of query rows against the key columns they may see: q (B, H, rows, D), qp (rows,), the
    mask ok (rows, cols), k, v (B, Hk, cols, .), their positions kp, terms kt and indices ki, and the rows'
    share of the queries' per-token terms (qt, rel, counts)."""

    q: torch.Tensor
    qp: torch.Tensor
    ok: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kp: torch.Tensor
    kt: torch.Tensor | None
    ki: torch.Tensor
    qt: torch.Tensor | None
    rel: torch.Tensor | None
    counts: torch.Tensor | None


def _chunk(queries: Queries, rows, ok, selected) -> _Chunk:
    def mine(t):
        return None if t is None else t[:, :, rows]

    k, v, kp, kt, ki = selected
    return _Chunk(
        queries.q[:, :, rows],
        queries.position[rows],
        ok,
        k,
        v,
        kp,
        kt,
        ki,
        mine(queries.term),
        mine(queries.rel),
        mine(queries.counts),
    )


def _relative_term(rule: Rule, c: _Chunk, q, k, tables) -> torch.Tensor:
    """Shaw's q_i . a^K_{c(j - i)} * scale or CoPE's bias of the chunk's pairs, differentiable in q, k and
    ``tables`` (the term's ``parameters_for_block``)."""
    if rule.shaw:
        return shaw_key_term(q, tables[0], rule.relative.rows(c.qp, c.kp), rule.scale)
    return cope_term(q, k, tables[0], c.counts, c.ok, run_ids(rule.runs, c.ki), rule.scale)[0]


def _scores(rule: Rule, c: _Chunk, dtype) -> torch.Tensor:
    """(B, H, rows, cols) scores with the bias added and disallowed pairs at -inf; with a remap's views,
    each pair scored by the view whose band holds its distance; with per-token terms qt (B, H, rows) and
    kt (B, H, cols), qt_i - kt_j added, the difference taken in float64 and rounded once."""
    q, k, qp, kp = c.q, c.k, c.qp, c.kp
    if rule.bands is None:
        s = grouped_qk(q, k) * rule.scale
    else:
        s = q.new_zeros(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        inside = _view_masks(rule, qp, kp)
        for qv, kv, band in zip(_views(q, len(inside)), _views(k, len(inside)), inside, strict=True):
            s = torch.where(band, grouped_qk(qv, kv) * rule.scale, s)
    if rule.bias is not None:
        s = s + rule.bias.tile(qp, kp).to(dtype)
    if c.qt is not None:
        s = s + (c.qt[..., :, None] - c.kt[..., None, :]).to(dtype)
    if c.rel is not None:
        s = s + banded_term(c.rel, rule.table, qp, kp).to(dtype)
    if rule.relative is not None:
        s = s + _relative_term(rule, c, q, k, rule.relative.parameters_for_block()).to(dtype)
    return s.masked_fill(~c.ok, -math.inf)


def _select(keys: Keys, cols):
    """(k, v, positions, term, indices) of the chosen key columns (all when ``cols`` is None)."""
    if cols is None:
        return keys.k, keys.v, keys.position, keys.term, keys.index
    term = None if keys.term is None else keys.term.index_select(2, cols)
    return (
        keys.k.index_select(2, cols),
        keys.v.index_select(2, cols),
        keys.position.index_select(0, cols),
        term,
        keys.index.index_select(0, cols),
    )


def _visible_chunks(rule: Rule, queries: Queries, keys: Keys):
    """(rows, mask (rows, cols), the chosen columns or None for all, (k, v, positions, term, indices) of
    them) for each chunk of query rows that sees some key."""
    for rows in _chunks(queries, keys):
        qd = None if queries.document is None else queries.document[rows]
        ok = rule.allowed(queries.index[rows], keys.index, qd, keys.document)
        cols = _columns(ok)
        if cols is not None and cols.numel() == 0:
            continue
        yield rows, ok if cols is None else ok.index_select(1, cols), cols, _select(keys, cols)


def _runs(index: torch.Tensor) -> list[tuple[int, int, int]] | None:
    """(start in the shard, length, first global index) of each run of consecutive indices, pads left out;
    None past _MAX_RUNS runs (striped layouts)."""
    real = index >= 0
    starts = torch.ones_like(real)
    starts[1:] = (index[1:] != index[:-1] + 1) | (real[1:] != real[:-1])
    where = starts.nonzero().squeeze(1).tolist()
    if len(where) > 2 * _MAX_RUNS:
        return None
    runs = []
    for a, z in zip(where, [*where[1:], index.numel()], strict=True):
        if bool(real[a]):
            runs.append((a, z - a, int(index[a])))
    return runs if len(runs) <= _MAX_RUNS else None


def _run_pairs(rule: Rule, queries: Queries, keys: Keys):
    """(query rows, key columns, is_causal) of every pair of runs that meets; None when the block is not
    made of whole, diagonal or skipped pairs (a bias, window, documents or remap; striped runs; a pair that
    overlaps other than on the diagonal)."""
    if (
        rule.bias is not None
        or rule.window is not None
        or rule.bands is not None
        or queries.document is not None
    ):
        return None
    q_runs, k_runs = _runs(queries.index), _runs(keys.index)
    if q_runs is None or k_runs is None:
        return None
    pairs = []
    for qa, qn, qi in q_runs:
        for ka, kn, ki in k_runs:
            rows, cols = slice(qa, qa + qn), slice(ka, ka + kn)
            if not rule.causal or ki + kn - 1 <= qi:
                pairs.append((rows, cols, False))
            elif ki == qi and kn == qn:
                pairs.append((rows, cols, True))
            elif ki <= qi + qn - 1:
                return None  # a partial overlap: the masked path
    return pairs


def block_forward(rule: Rule, queries: Queries, keys: Keys):
    """(out (B, H, m, Dv), lse (B, H, m)) of the queries against these keys alone; a row that may see no
    key gets out 0 and lse -inf."""
    b, h, m, _ = queries.q.shape
    dtype = queries.q.dtype
    out = queries.q.new_zeros(b, h, m, keys.v.shape[-1])
    lse = queries.q.new_full((b, h, m), -math.inf)
    pairs = _run_pairs(rule, queries, keys) if rule.flash(queries.q, keys.v) else None
    if pairs is not None:
        k, v = _expanded(keys.k, h), _expanded(keys.v, h)
        for rows, cols, causal in pairs:
            o, l_ = flash(
                queries.q[:, :, rows], k[:, :, cols], v[:, :, cols], is_causal=causal, scale=rule.scale
            )
            out[:, :, rows], lse[:, :, rows] = merge(out[:, :, rows], lse[:, :, rows], o, l_.to(dtype))
        return out, lse
    for rows, ok, _cols, selected in _visible_chunks(rule, queries, keys):
        k, v, kp = selected[:3]
        if rule.flash(queries.q, keys.v):
            o, chunk_lse = _flash_forward(rule, queries.q[:, :, rows], k, v, ok, queries.position[rows], kp)
            out[:, :, rows], lse[:, :, rows] = o, chunk_lse
            continue
        c = _chunk(queries, rows, ok, selected)
        s = _scores(rule, c, dtype)
        chunk_lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - _finite(chunk_lse)[..., None])
        out[:, :, rows] = grouped_pv(p, v)
        if rule.shaw:  # the values' a^V_{c(j - i)}: the probabilities summed per clipped distance, times a^V
            out[:, :, rows] += shaw_value_term(p, rule.relative.value_table, rule.relative.rows(c.qp, kp))
        lse[:, :, rows] = chunk_lse
    return out, lse


def block_gate_totals(rule: Rule, queries: Queries, keys: Keys, totals) -> None:
    """CoPE's first pass: adds each query's gates against these keys per run of keys into ``totals``
    (B, H, m, runs) (:mod:`.relative`)."""
    for rows, ok, _cols, selected in _visible_chunks(rule, queries, keys):
        gates = cope_gates(queries.q[:, :, rows], selected[0], ok, rule.scale)
        gate_totals(gates, run_ids(rule.runs, selected[4]), totals[:, :, rows])


def block_count_gradients(rule: Rule, queries: Queries, keys: Keys, dout, delta, lse, params, d_counts):
    """CoPE's first backward pass: adds the gradients of the queries' counts (B, H, m, runs) through
    this block's pairs into ``d_counts``."""
    for rows, ok, _cols, selected in _visible_chunks(rule, queries, keys):
        c = _chunk(queries, rows, ok, selected)
        _p, ds = _score_gradients(rule, c, dout[:, :, rows], delta[:, :, rows], lse[:, :, rows], params, None)
        with torch.enable_grad():
            counts = c.counts.detach().requires_grad_(True)
            bias = cope_term(c.q, c.k, params[0], counts, ok, run_ids(rule.runs, c.ki), rule.scale)[0]
            (found,) = torch.autograd.grad(bias, counts, ds.to(bias.dtype))
        d_counts[:, :, rows] += found


def _expanded(t: torch.Tensor, heads: int) -> torch.Tensor:
    """k or v (B, Hk, n, D) with each kv head repeated for its query heads (the flash kernel's layout)."""
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def _flash_mask(rule: Rule, ok, qp, kp, dtype) -> torch.Tensor:
    """The additive (1, 1 or H, rows, cols) mask of the flash path: the bias (or 0) where a pair may meet,
    _MASKED elsewhere."""
    if rule.bias is None:
        mask = torch.zeros((1, *ok.shape), dtype=dtype, device=ok.device)
    else:
        mask = rule.bias.tile(qp, kp).detach().to(dtype)
    return mask.masked_fill(~ok, _MASKED)[None]


def _flash_forward(rule: Rule, q, k, v, ok, qp, kp):
    """(out, lse) of a chunk of rows on torch's CPU flash kernel; rows that see no key here get 0, -inf."""
    h = q.shape[1]
    mask = _flash_mask(rule, ok, qp, kp, q.dtype)
    out, lse = flash(q, _expanded(k, h), _expanded(v, h), attn_mask=mask, scale=rule.scale)
    lse = lse.to(q.dtype)
    blind = ~ok.any(1)
    if bool(blind.any()):
        out = out.masked_fill(blind[:, None], 0.0)
        lse = lse.masked_fill(blind, -math.inf)
    return out, lse


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """lse with -inf rows (nothing visible) as 0, so exp(s - lse) is 0 there instead of NaN."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def merge(out, lse, out_b, lse_b):
    """Two partial attentions over disjoint key sets merged by their log-sum-exps (exact)."""
    new = torch.logaddexp(lse, lse_b)
    safe = _finite(new)
    w, w_b = torch.exp(lse - safe), torch.exp(lse_b - safe)
    return out * w[..., None] + out_b * w_b[..., None], new


def _run_pairs_backward(queries, keys, pairs, scale, dout, out, lse, dq, dk, dv) -> None:
    """The flash kernel's backward over every meeting pair of runs (:func:`_run_pairs`)."""
    b, h = queries.q.shape[:2]
    hk = keys.k.shape[1]
    k, v = _expanded(keys.k, h), _expanded(keys.v, h)
    dk_x, dv_x = torch.zeros_like(k), torch.zeros_like(v)
    # a row with no key anywhere (a pad) has lse -inf: any large lse makes its p 0 instead of NaN
    lse = lse.masked_fill(torch.isinf(lse), -_MASKED)
    lse = lse if queries.q.dtype == torch.float64 else lse.to(torch.float32)
    for rows, cols, causal in pairs:
        dq_p, dk_p, dv_p = flash_bwd(
            dout[:, :, rows].contiguous(),
            queries.q[:, :, rows],
            k[:, :, cols],
            v[:, :, cols],
            out[:, :, rows].contiguous(),
            lse[:, :, rows].contiguous(),
            0.0,
            causal,
            scale=scale,
        )
        dq[:, :, rows] += dq_p
        dk_x[:, :, cols] += dk_p
        dv_x[:, :, cols] += dv_p
    dk += dk_x.view(b, hk, h // hk, *dk_x.shape[2:]).sum(2)
    dv += dv_x.view(b, hk, h // hk, *dv_x.shape[2:]).sum(2)


def _add_columns(dk, dv, dk_b, dv_b, cols) -> None:
    """dk += dk_b and dv += dv_b (dv may be None) at the chosen key columns (all when ``cols`` is None)."""
    for total, part in ((dk, dk_b), (dv, dv_b)):
        if total is None:
            continue
        if cols is None:
            total += part
        else:
            total.index_add_(2, cols, part)


def block_backward(
    rule: Rule,
    queries: Queries,
    keys: Keys,
    dout,
    delta,
    lse,
    dq,
    dk,
    dv,
    params,
    grads,
    out=None,
    terms=None,
    rels=None,
    gates=None,
):
    """Adds this block's gradients into dq (B, H, m, D), dk, dv (B, Hk, n, .), the bias parameters'
    ``grads`` and, with per-token terms, ``terms`` = (d query terms (B, H, m), d key terms (B, H, n)); with
    the banded bias, ``rels`` = (d r (B, H, m, d_rel),) and P's gradient into ``grads[0]``; with Shaw's or
    CoPE's term, their tables' gradients into ``grads``, CoPE's taking ``gates`` (B, H, m, runs), the
    gradients of each query's gate total per run (from :func:`block_count_gradients` over the ring).
    ``lse`` is the final (all keys) log-sum-exp, ``delta`` = rowsum(dout * out) - dlse; ``out`` the final
    output, given when the log-sum-exp had no gradient (dlse = 0): then the flash kernel's backward, which
    forms rowsum(dout * out) itself, may run the block."""
    hk = keys.k.shape[1]
    pairs = _run_pairs(rule, queries, keys) if out is not None and rule.flash(queries.q, keys.v) else None
    if pairs is not None:
        _run_pairs_backward(queries, keys, pairs, rule.scale, dout, out, lse, dq, dk, dv)
        return
    for rows, ok, cols, selected in _visible_chunks(rule, queries, keys):
        q, qp, (k, v, kp) = queries.q[:, :, rows], queries.position[rows], selected[:3]
        if out is not None and rule.flash(q, v):
            dq_b, dk_b, dv_b = _flash_chunk_backward(
                rule, q, k, v, ok, qp, kp, dout[:, :, rows], out[:, :, rows], lse[:, :, rows]
            )
            dq[:, :, rows] += dq_b
            _add_columns(dk, dv, dk_b, dv_b, cols)
            continue
        c = _chunk(queries, rows, ok, selected)
        do = dout[:, :, rows]
        p, ds = _score_gradients(rule, c, do, delta[:, :, rows], lse[:, :, rows], params, grads)
        dq_b, dk_b = _qk_gradients(rule, ds, q, k, qp, kp)
        if rule.relative is not None:
            d_gates = None if gates is None else gates[:, :, rows]
            dq_r, dk_r = _relative_gradients(rule, c, ds, params, grads, d_gates)
            dq_b = dq_b + dq_r
            dk_b = dk_b if dk_r is None else dk_b + dk_r
        dq[:, :, rows] += dq_b
        _add_columns(dk, dv, dk_b, grouped_dk(p, do, hk), cols)
        if terms is not None:  # d(term_i - term_j): +dS summed over a row, -dS over a column
            dqt, dkt = terms
            dqt[:, :, rows] += ds.sum(-1).to(dqt.dtype)
            _add_columns(dkt, None, -ds.sum(-2).to(dkt.dtype), None, cols)
        if c.rel is not None:
            _banded_gradients(rule, c.rel, qp, kp, ds, rels[0][:, :, rows], params, grads)
        elif params and rule.relative is None:
            _bias_gradients(rule, qp, kp, ds, params, grads)


def _score_gradients(rule: Rule, c: _Chunk, do, delta, lse, params, grads):
    """(P, dS) of a chunk, recomputed from the final log-sum-exp; with Shaw's value term, dP_ij gains
    dO_i . a^V_{c(j - i)} and a^V's gradient (P summed per distance, times dO) goes into ``grads[1]``."""
    s = _scores(rule, c, c.q.dtype)
    p = torch.exp(s - _finite(lse)[..., None])
    dp = grouped_qk(do, c.v)
    if rule.shaw:
        rows = rule.relative.rows(c.qp, c.kp)
        dp = dp + shaw_key_term(do, params[1], rows, 1.0)
        if grads is not None:
            with torch.enable_grad():
                table = params[1].detach().requires_grad_(True)
                (found,) = torch.autograd.grad(shaw_value_term(p, table, rows), table, do)
            grads[1] += found
    return p, p * (dp - delta[..., None])


def _relative_gradients(rule: Rule, c: _Chunk, ds, params, grads, d_gates):
    """(dq, dk or None) of a chunk's Shaw or CoPE score term, and its table's gradient into ``grads[0]``;
    CoPE's gates also take ``d_gates`` (B, H, rows, runs), the gradients of their run totals."""
    with torch.enable_grad():
        q = c.q.detach().requires_grad_(True)
        k = c.k.detach().requires_grad_(not rule.shaw)
        table = params[0].detach().requires_grad_(True)
        if rule.shaw:
            term = _relative_term(rule, c, q, k, (table,))
            dq, found = torch.autograd.grad(term, (q, table), ds.to(term.dtype))
            grads[0] += found
            return dq, None
        ids = run_ids(rule.runs, c.ki)
        bias, gate = cope_term(q, k, table, c.counts, c.ok, ids, rule.scale)
        to_gates = d_gates.gather(-1, ids.clamp(min=0).expand(*gate.shape[:-1], ids.shape[0]))
        dq, dk, found = torch.autograd.grad((bias, gate), (q, k, table), (ds.to(bias.dtype), to_gates))
        grads[0] += found
        return dq, dk


def _flash_chunk_backward(rule: Rule, q, k, v, ok, qp, kp, dout, out, lse):
    """(dq, dk, dv) of a chunk of rows on the flash kernel's backward, dk and dv summed to the kv heads."""
    b, h = q.shape[:2]
    hk = k.shape[1]
    mask = _flash_mask(rule, ok, qp, kp, q.dtype)
    # a row with no key anywhere (a pad) has lse -inf: any large lse makes its p 0 instead of NaN
    lse = lse.masked_fill(torch.isinf(lse), -_MASKED).contiguous()
    dq_b, dk_b, dv_b = flash_bwd(
        dout.contiguous(),
        q,
        _expanded(k, h),
        _expanded(v, h),
        out.contiguous(),
        lse.to(torch.float32) if q.dtype != torch.float64 else lse,
        0.0,
        False,
        attn_mask=mask,
        scale=rule.scale,
    )
    return (
        dq_b,
        dk_b.view(b, hk, h // hk, *dk_b.shape[2:]).sum(2),
        dv_b.view(b, hk, h // hk, *dv_b.shape[2:]).sum(2),
    )


def _qk_gradients(rule: Rule, ds, q, k, qp, kp):
    """(dq, dk) of a chunk from its score gradients dS; with a remap's views, each view's share of dS."""
    hk = k.shape[1]
    if rule.bands is None:
        return rule.scale * grouped_pv(ds, k), rule.scale * grouped_dk(ds, q, hk)
    n = len(rule.bands)
    dq_v, dk_v = [], []
    for qv, kv, band in zip(_views(q, n), _views(k, n), _view_masks(rule, qp, kp), strict=True):
        ds_v = ds * band
        dq_v.append(grouped_pv(ds_v, kv))
        dk_v.append(grouped_dk(ds_v, qv, hk))
    return rule.scale * torch.cat(dq_v, dim=-1), rule.scale * torch.cat(dk_v, dim=-1)


def _banded_gradients(rule: Rule, rel, qp, kp, ds, d_rel, params, grads) -> None:
    """Adds a chunk's gradients of r (into ``d_rel``) and of P (``params[0]``, into ``grads[0]``)."""
    with torch.enable_grad():
        r = rel.detach().requires_grad_(True)
        term = banded_term(r, params[0], qp, kp)
        g_r, g_table = torch.autograd.grad(term, (r, params[0]), ds.to(term.dtype))
    d_rel += g_r.to(d_rel.dtype)
    grads[0] += g_table


def _bias_gradients(rule: Rule, qp, kp, ds, params, grads) -> None:
    """Adds the bias parameters' gradients of a chunk: its tile's, against dS summed over the batch."""
    with torch.enable_grad():
        tile = rule.bias.tile(qp, kp)
        found = torch.autograd.grad(tile, params, ds.sum(0).to(tile.dtype), allow_unused=True)
    for total, grad in zip(grads, found, strict=True):
        if grad is not None:
            total += grad
