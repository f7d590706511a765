"""Ring attention: each rank holds a shard of the sequence; keys and values travel around the ring of ranks
while each rank attends its queries to the shard it holds, and the partial results merge exactly by their
log-sum-exps (Liu et al. 2023, "Ring Attention with Blockwise Transformers", arXiv:2310.01889).

Positions are global: q and k are rotated at their shard's global positions before the ring (RoPE's score
depends on the distance only, so rotated keys can travel), a remap's views too (each view's positions are a
function of the token's own position), a score bias is evaluated at each pair's global positions, and
causal, window and document masks compare global token indices
(:mod:`posenc.parallel.blocks`). Forward: W steps; at each the next shard is already in flight (sends and
receives posted before the compute, so the transfer overlaps it). Backward: the keys travel again, and
each shard's dK and dV accumulate as it goes round and arrive home after W transfers.

Two rings run the same code: :class:`ProcessRing` (torch.distributed point-to-point: gloo on CPU, NCCL on
GPU; one rank per process) and :class:`VirtualRing` (every rank in one process, a list of shards; the fast
way to test the algorithm, and the exactness tests run both).
"""

from __future__ import annotations

import math

import torch

from .. import _checks
from ..bias.banded import BandedBias
from ..bias.base import ScoreBias
from ..bias.cope import CoPE
from ..bias.forget import ForgetBias
from ..bias.shaw import ShawRelative
from ..rope.protocol import is_rotary, length_dependent
from .blocks import (
    Keys,
    Queries,
    Rule,
    block_backward,
    block_count_gradients,
    block_forward,
    block_gate_totals,
    merge,
)
from .relative import earlier_runs, later_runs, run_starts

__all__ = ["ProcessRing", "VirtualRing", "ring_attention", "virtual_ring_attention"]


class VirtualRing:
    """Every rank of a ring of ``world_size`` in this process: shards are lists indexed by rank."""

    def __init__(self, world_size: int):
        self.world_size = _checks.positive_int("world_size", world_size, size=True)
        self.ranks = list(range(self.world_size))

    def largest(self, value: int) -> int:
        """The largest of the ranks' values (here the caller already holds them all)."""
        return value

    def gather(self, tensors: list) -> list:
        """Every rank's tensor, in rank order (here the caller holds them all)."""
        return list(tensors)

    def start_shift(self, parcels: list) -> _Done:
        """Each rank's parcel (a tuple of tensors) handed to the next rank: rank r receives r - 1's."""
        return _Done([parcels[(j - 1) % self.world_size] for j in range(self.world_size)])


class _Done:
    def __init__(self, value):
        self.value = value

    def wait(self):
        return self.value


class ProcessRing:
    """This process's rank of a torch.distributed group; a shift is one isend to the next rank and one irecv
    from the previous per tensor, posted as one batch and waited on later (overlapping the caller's
    compute)."""

    def __init__(self, group=None):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                "ring_attention needs torch.distributed initialised (dist.init_process_group with gloo on "
                "CPU or nccl on GPU); for every rank in one process use virtual_ring_attention"
            )
        self.dist = dist
        self.group = group
        self.world_size = dist.get_world_size(group)
        rank = dist.get_rank(group)
        self.ranks = [rank]
        self.next = (
            dist.get_global_rank(group, (rank + 1) % self.world_size)
            if group
            else (rank + 1) % self.world_size
        )
        self.prev = (
            dist.get_global_rank(group, (rank - 1) % self.world_size)
            if group
            else (rank - 1) % self.world_size
        )

    def largest(self, value: int) -> int:
        """The largest of the ranks' values: one all-reduce."""
        nccl = self.dist.get_backend(self.group) == "nccl"  # NCCL reduces device tensors only
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        t = torch.tensor([value], dtype=torch.long, device=device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.group)
        return int(t)

    def gather(self, tensors: list) -> list:
        """Every rank's tensor, in rank order: one all-gather, differentiable (each rank's gradient comes
        home summed over the ranks)."""
        (tensor,) = tensors
        return list(_AllGather.apply(self, tensor))

    def start_shift(self, parcels: list) -> _Pending:
        (parcel,) = parcels
        # an empty placeholder (no documents, no terms) stays: every rank holds the same one
        received = tuple(
            t if t.numel() == 0 else torch.empty_like(t, memory_format=torch.contiguous_format)
            for t in parcel
        )
        ops = []
        for t, buf in zip(parcel, received, strict=True):
            if t.numel():
                ops.append(self.dist.P2POp(self.dist.irecv, buf, self.prev, self.group))
                ops.append(self.dist.P2POp(self.dist.isend, t.contiguous(), self.next, self.group))
        # one batch: NCCL may deadlock on a ring of separately issued sends and receives
        return _Pending(self.dist.batch_isend_irecv(ops), [received])


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ring, x):
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(ring.world_size)]
        ring.dist.all_gather(parts, x.contiguous(), group=ring.group)
        ctx.ring = ring
        return tuple(parts)

    @staticmethod
    def backward(ctx, *grads):
        ring = ctx.ring
        full = torch.stack(grads)  # each rank's gradient for every rank's part; summed, each takes its own
        ring.dist.all_reduce(full, group=ring.group)
        return None, full[ring.dist.get_rank(ring.group)]


class _Pending:
    def __init__(self, works, value):
        self.works, self.value = works, value

    def wait(self):
        for work in self.works:
            work.wait()
        return self.value


def _keys_parcel(keys: Keys) -> tuple:
    """What travels: k, v, index, position, and the document ids and term where there are (else empty)."""
    doc = keys.document if keys.document is not None else keys.index.new_zeros(0)
    term = keys.term if keys.term is not None else keys.k.new_zeros(0)
    return keys.k, keys.v, keys.index, keys.position, doc, term


def _keys_from(parcel, documents: bool, terms: bool) -> Keys:
    k, v, index, position, doc, term = parcel[:6]
    return Keys(k, v, index, position, doc if documents else None, term if terms else None)


def _content_inputs(rule: Rule, rest, n: int):
    """(FoX's terms, the banded bias's r, the parameters) from the inputs after q, k, v: one term and one r
    per local rank where the rule has them, else None each."""
    rest = list(rest)
    terms = rest[:n] if rule.decay else [None] * n
    rest = rest[n:] if rule.decay else rest
    rels = rest[:n] if rule.table is not None else [None] * n
    rest = rest[n:] if rule.table is not None else rest
    return terms, rels, rest


class _RingFunction(torch.autograd.Function):
    """Outputs and log-sum-exps of every local rank's queries over the whole ring; inputs are the local
    ranks' q, k, v (rotated, work dtype) and the bias's trained parameters."""

    @staticmethod
    def forward(ctx, ring, rule, meta, n_local, n_params, *tensors):
        qs, ks, vs = tensors[:n_local], tensors[n_local : 2 * n_local], tensors[2 * n_local : 3 * n_local]
        terms, rels, _ = _content_inputs(rule, tensors[3 * n_local :], n_local)
        queries = [Queries(q, *m, t, r) for q, m, t, r in zip(qs, meta, terms, rels, strict=True)]
        keys = [Keys(k, v, *m, t) for k, v, m, t in zip(ks, vs, meta, terms, strict=True)]
        documents = meta[0][2] is not None
        outs = [None] * n_local
        lses = [None] * n_local
        parcels = [_keys_parcel(kk) for kk in keys]
        ctx.counts = _cope_counts(ring, rule, queries, parcels, documents)
        for query, counts in zip(queries, ctx.counts, strict=True):
            query.counts = counts

        def visit(j, keys_b):
            out_b, lse_b = block_forward(rule, queries[j], keys_b)
            if outs[j] is None:
                outs[j], lses[j] = out_b, lse_b
            else:
                outs[j], lses[j] = merge(outs[j], lses[j], out_b, lse_b)

        _walk(ring, parcels, documents, rule.decay, visit)
        ctx.ring, ctx.rule, ctx.meta, ctx.n_local, ctx.n_params = ring, rule, meta, n_local, n_params
        ctx.set_materialize_grads(False)  # an unused log-sum-exp's gradient stays None: the flash backward
        ctx.save_for_backward(*qs, *ks, *vs, *outs, *lses, *tensors[3 * n_local :])
        return (*outs, *lses)

    @staticmethod
    def backward(ctx, *grads):
        ring, rule, meta, n = ctx.ring, ctx.rule, ctx.meta, ctx.n_local
        saved = ctx.saved_tensors
        qs, ks, vs = saved[:n], saved[n : 2 * n], saved[2 * n : 3 * n]
        outs, lses = saved[3 * n : 4 * n], saved[4 * n : 5 * n]
        terms, rels, params = _content_inputs(rule, saved[5 * n :], n)
        douts = [torch.zeros_like(o) if g is None else g for o, g in zip(outs, grads[:n], strict=True)]
        dlses = [torch.zeros_like(lse) if g is None else g for lse, g in zip(lses, grads[n:], strict=True)]
        documents = meta[0][2] is not None
        queries = [
            Queries(q, *m, t, r, c) for q, m, t, r, c in zip(qs, meta, terms, rels, ctx.counts, strict=True)
        ]
        d_rels = [None if r is None else torch.zeros_like(r) for r in rels]
        deltas = [(do * o).sum(-1) - dl for do, o, dl in zip(douts, outs, dlses, strict=True)]
        dqs = [torch.zeros_like(q) for q in qs]
        param_grads = [torch.zeros_like(p) for p in params]
        parcels = [_keys_parcel(Keys(k, v, *m, t)) for k, v, m, t in zip(ks, vs, meta, terms, strict=True)]
        d_gates = _cope_gate_gradients(ring, rule, queries, parcels, documents, (douts, deltas, lses), params)
        # what travels with each shard and comes home: its dK, dV (and the gradient of its key terms)
        travelling = [
            (torch.zeros_like(k), torch.zeros_like(v), *(() if t is None else (torch.zeros_like(t),)))
            for k, v, t in zip(ks, vs, terms, strict=True)
        ]
        dterms = [None if t is None else torch.zeros_like(t) for t in terms]
        for step in range(ring.world_size):
            pending = ring.start_shift(parcels) if step < ring.world_size - 1 else None
            for j, query in enumerate(queries):
                dk, dv = travelling[j][:2]
                block_backward(
                    rule,
                    query,
                    _keys_from(parcels[j], documents, rule.decay),
                    douts[j],
                    deltas[j],
                    lses[j],
                    dqs[j],
                    dk,
                    dv,
                    params,
                    param_grads,
                    out=None if grads[n + j] is not None else outs[j],  # dlse = 0: flash may run it
                    terms=None if dterms[j] is None else (dterms[j], travelling[j][2]),
                    rels=None if d_rels[j] is None else (d_rels[j],),
                    gates=d_gates[j],
                )
            travelling = ring.start_shift(travelling).wait() if ring.world_size > 1 else travelling
            if pending is not None:
                parcels = pending.wait()
        dks = [t[0] for t in travelling]
        dvs = [t[1] for t in travelling]
        d_terms = [dt + t[2] for dt, t in zip(dterms, travelling, strict=True)] if rule.decay else []
        d_rels = d_rels if rule.table is not None else []
        return (None, None, None, None, None, *dqs, *dks, *dvs, *d_terms, *d_rels, *param_grads)


def _walk(ring, parcels: list, documents: bool, decay: bool, visit) -> None:
    """One pass of the keys round the ring: ``visit(j, keys)`` for each local rank j and every shard in
    turn, the next shard in flight meanwhile."""
    for step in range(ring.world_size):
        pending = ring.start_shift(parcels) if step < ring.world_size - 1 else None
        for j, parcel in enumerate(parcels):
            visit(j, _keys_from(parcel, documents, decay))
        if pending is not None:
            parcels = pending.wait()


def _cope_counts(ring, rule: Rule, queries: list, parcels: list, documents: bool) -> list:
    """Each local rank's CoPE counts (B, H, m, runs), the gates of the runs after each run, from a first
    pass of the keys; None each without CoPE."""
    if rule.relative is None or rule.shaw:
        return [None] * len(queries)
    totals = [query.q.new_zeros(*query.q.shape[:3], rule.runs.shape[0]) for query in queries]
    _walk(
        ring,
        parcels,
        documents,
        rule.decay,
        lambda j, keys: block_gate_totals(rule, queries[j], keys, totals[j]),
    )
    return [later_runs(t) for t in totals]


def _cope_gate_gradients(ring, rule: Rule, queries: list, parcels: list, documents: bool, final, params):
    """Each local rank's gradients of its queries' gate totals per run (B, H, m, runs), from a first
    backward pass of the keys taking the counts' gradients; None each without CoPE. ``final``: the
    (douts, deltas, lses) of every local rank."""
    if rule.relative is None or rule.shaw:
        return [None] * len(queries)
    douts, deltas, lses = final
    d_counts = [torch.zeros_like(query.counts) for query in queries]

    def visit(j, keys):
        block_count_gradients(rule, queries[j], keys, douts[j], deltas[j], lses[j], params, d_counts[j])

    _walk(ring, parcels, documents, rule.decay, visit)
    return [earlier_runs(d) for d in d_counts]


def _check_shards(q, k, v, indices, name=""):
    for label, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_floating_point():
            raise ValueError(
                f"{label}{name} must be a floating tensor (batch, heads, shard_len, dim), got "
                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}"
            )
    if (
        k.shape[:3] != v.shape[:3]
        or q.shape[0] != k.shape[0]
        or q.shape[-1] != k.shape[-1]
        or q.shape[2] != k.shape[2]
    ):
        raise ValueError(
            f"q{name}, k{name}, v{name} must hold the same tokens of one batch with one head_dim: got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q's head count {q.shape[1]} must be a multiple of k's {k.shape[1]}")
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1 or indices.is_floating_point():
        raise ValueError(
            f"indices{name} must be a 1-D integer tensor (shard_indices' output), got {indices!r}"
        )
    if indices.shape[0] != q.shape[2]:
        raise ValueError(
            f"indices{name} has {indices.shape[0]} entries, but the shard holds {q.shape[2]} tokens"
        )


def _check_terms(bias, remap, rotary, window, causal, positions_1d: bool):
    if remap is not None:
        from ..remap import Remap
        from ..rope import RotaryEmbedding, XPos

        if not isinstance(remap, Remap):
            raise ValueError(
                f"remap must be a posenc.remap.Remap (SelfExtend, ReRoPE, STRING) or None, got {remap!r}"
            )
        if not isinstance(rotary, RotaryEmbedding) or isinstance(rotary, XPos):
            raise ValueError(
                f"remap={remap!r} remaps RoPE distances: across ranks it needs "
                f"rotary=posenc.RotaryEmbedding(...), got {type(rotary).__name__}"
            )
        if bias is not None or not causal or not positions_1d:
            raise ValueError(
                f"remap={remap!r} is causal, without a bias, at 1-D positions (the global indices); got "
                f"causal={causal}, bias={type(bias).__name__}"
            )
    if isinstance(bias, (ForgetBias, BandedBias, CoPE)):
        if not causal:
            raise ValueError(f"a {type(bias).__name__} works with causal attention only, got causal=False")
    elif bias is not None and not isinstance(bias, (ScoreBias, ShawRelative)):
        raise ValueError(
            "ring attention takes a score bias (ALiBi, T5Bias, KerpleBias, SandwichBias, FireBias), FoX's "
            "ForgetBias, the banded bias (BandedBias), ShawRelative, CoPE or None; bias tensors are not "
            f"supported across ranks (a mask: document_ids=, window=), got {type(bias).__name__}"
        )
    if isinstance(bias, (ShawRelative, CoPE)) and window is not None:
        raise ValueError(
            f"a {type(bias).__name__} takes no window across ranks (posenc.attention has no windowed form "
            f"of it to agree with), got window={window!r}"
        )
    if isinstance(bias, (ScoreBias, ShawRelative)) and not positions_1d:
        raise ValueError("a score bias needs 1-D positions (its distances); got multi-axis positions")
    if window is not None:
        window = _checks.positive_int("window", window)
    return window, _checks.boolean("causal", causal)


def _rotated(ring, rotary, qs, ks, positions):
    """Every local rank's q and k rotated at its global positions, with the schedule and centre of the whole
    sequence."""
    if not is_rotary(rotary):
        raise ValueError(f"rotary must be a posenc rotary embedding or None, got {type(rotary).__name__}")
    options = {}
    if length_dependent(rotary):
        # each rank's own last position would give each its own schedule: all take the sequence's
        options["context_len"] = 1 + ring.largest(max(int(p.max()) if p.numel() else 0 for p in positions))
    if _centred(rotary):
        # xPos scales q and k about a centre that cancels only when every rank uses the same one: the
        # middle of the whole sequence's positions, as a single call's default
        low = -ring.largest(max(-int(p.min()) if p.numel() else 0 for p in positions))
        high = ring.largest(max(int(p.max()) if p.numel() else 0 for p in positions))
        options["centre"] = (low + high + 1) // 2
    rotated = [rotary(q, k, positions=p, **options) for q, k, p in zip(qs, ks, positions, strict=True)]
    return [r[0] for r in rotated], [r[1] for r in rotated]


def _remapped(ring, remap, rotary, qs, ks, positions):
    """Every local rank's q and k rotated once per view of ``remap`` at the view's positions of its tokens,
    the views side by side on the last axis, and the views' bands. A view's positions are a function of each
    token's own global position, so each rank computes its tokens' share."""
    from ..kernels.remap_blocked import Band

    context = 1 + ring.largest(max(int(p.max()) if p.numel() else 0 for p in positions))
    if rotary.scaling is None:
        remap.check_length(context, rotary.max_position_embeddings)
    out_q, out_k, bands = [], [], None
    for q, k, p in zip(qs, ks, positions, strict=True):
        views = remap.views(p, p)
        factor = remap.query_scale(p)
        parts_q, parts_k = [], []
        for view in views:
            qv = rotary.rotate_as(q, view.q, "q", context_len=context)
            if factor is not None:
                qv = qv * factor.to(qv.dtype)[:, None]
            parts_q.append(qv)
            parts_k.append(rotary.rotate_as(k, view.k, "k", context_len=context))
        out_q.append(torch.cat(parts_q, dim=-1))
        out_k.append(torch.cat(parts_k, dim=-1))
        bands = tuple(Band(w.lo, w.hi, w.unit) for w in views)
    return out_q, out_k, bands


def _run(ring, qs, ks, vs, indices, positions, documents, rotary, bias, causal, window, scale, sinks, remap):
    biases = list(bias) if isinstance(bias, (list, tuple)) else [bias] * len(qs)
    if len(biases) != len(qs) or len({type(b) for b in biases}) > 1:
        raise ValueError(f"bias must be one bias, or one per rank ({len(qs)}) of one kind, got {bias!r}")
    if isinstance(bias, (list, tuple)) and not isinstance(biases[0], (ForgetBias, BandedBias)):
        raise ValueError(
            "one bias per rank is for the biases made from each rank's tokens (ForgetBias, BandedBias); "
            "give a score bias once"
        )
    bias = biases[0]
    positions = [ix.clamp(min=0) if p is None else p for ix, p in zip(indices, positions, strict=True)]
    window, causal = _check_terms(bias, remap, rotary, window, causal, all(p.dim() == 1 for p in positions))
    for j, (q, k, v, ix) in enumerate(zip(qs, ks, vs, indices, strict=True)):
        _check_shards(q, k, v, ix, name="" if len(qs) == 1 else f"[{j}]")
    if documents[0] is not None:
        for d, ix in zip(documents, indices, strict=True):
            if not isinstance(d, torch.Tensor) or d.shape != ix.shape or d.is_floating_point():
                raise ValueError(
                    f"document_ids must be an integer tensor shaped like indices {tuple(ix.shape)}"
                )
    bands = None
    if remap is not None:
        head_dim = qs[0].shape[-1]
        qs, ks, bands = _remapped(ring, remap, rotary, qs, ks, positions)
    elif rotary is not None:
        qs, ks = _rotated(ring, rotary, qs, ks, positions)
    dtype = qs[0].dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    if bands is None:
        head_dim = qs[0].shape[-1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else _checks.scale(scale)
    decay, banded = isinstance(bias, ForgetBias), isinstance(bias, BandedBias)
    terms = _decay_terms(ring, [b.log_forget for b in biases], qs, indices) if decay else []
    rels = _banded_states(biases, qs) if banded else []
    rule = _rule(ring, bias, causal, window, scale, bands, indices, qs, vs)
    bias_positions = [
        p if p.dim() == 1 else ix.clamp(min=0) for p, ix in zip(positions, indices, strict=True)
    ]
    meta = [
        (ix.to(qs[0].device), bp.to(qs[0].device), None if d is None else d.to(qs[0].device))
        for ix, bp, d in zip(indices, bias_positions, documents, strict=True)
    ]
    params = [] if rule.bias is None else [p for p in rule.bias.parameters() if p.requires_grad]
    params = [rule.table] if banded else params
    params = list(rule.relative.parameters_for_block()) if rule.relative is not None else params
    n = len(qs)
    results = _RingFunction.apply(
        ring, rule, meta, n, len(params), *[t.to(work) for t in (*qs, *ks, *vs)], *terms, *rels, *params
    )
    outs, lses = results[:n], results[n:]
    if sinks is not None:
        outs = [_with_sinks(o, lse, sinks) for o, lse in zip(outs, lses, strict=True)]
    return [o.to(dtype) for o in outs]


def _rule(ring, bias, causal, window, scale, bands, indices, qs, vs) -> Rule:
    """The pairs that meet and the terms they add; Shaw's and CoPE's tables checked against the shards,
    and CoPE given the runs of keys of the whole ring (one all-gather of the indices)."""
    decay, banded = isinstance(bias, ForgetBias), isinstance(bias, BandedBias)
    relative = bias if isinstance(bias, (ShawRelative, CoPE)) else None
    runs = None
    if relative is not None:
        name = type(relative).__name__
        want = (("q", qs[0], relative.head_dim), ("v", vs[0], getattr(relative, "v_dim", None)))
        for arg, t, dim in want:
            if dim is not None and t.shape[-1] != dim:
                raise ValueError(f"{arg} has last dimension {t.shape[-1]}, but {name} was built for {dim}")
    if isinstance(bias, CoPE):
        runs = run_starts(ring.gather([ix.to(qs[0].device) for ix in indices]))
    table = bias.rel_table if banded else None
    plain = None if decay or banded or relative is not None else bias
    return Rule(causal, window, plain, scale, bands, decay, table, relative, runs)


def _banded_states(biases: list, qs: list) -> list:
    """Each local rank's r (B, H, n, d_rel) of the banded bias, checked; every rank shares one table P."""
    table = biases[0].rel_table
    for b, q in zip(biases, qs, strict=True):
        if b.rel_table is not table:
            raise ValueError("every rank's BandedBias must share one rel_table (the layer's P)")
        want = (*q.shape[:3], table.shape[0])
        if not isinstance(b.rel_states, torch.Tensor) or tuple(b.rel_states.shape) != want:
            raise ValueError(
                f"a rank's BandedBias must hold r of its own tokens, (batch, heads, shard_len, d_rel) = "
                f"{want}, got {tuple(getattr(b.rel_states, 'shape', ()))}"
            )
    return [b.rel_states for b in biases]


def _decay_terms(ring, log_forgets: list, qs: list, indices: list) -> list:
    """FoX's c_t = sum_{l <= t} log f_l (float64) at each local rank's tokens, from every rank's gates in
    global order: query i and key j then add c_i - c_j = sum_{l = j+1 .. i} log f_l. Differentiable."""
    for lf, q, ix in zip(log_forgets, qs, indices, strict=True):
        want = (q.shape[0], q.shape[1], ix.shape[0])
        if not isinstance(lf, torch.Tensor) or tuple(lf.shape) != want:
            raise ValueError(
                f"a rank's ForgetBias must hold the log gates of its own tokens, (batch, heads, shard_len) = "
                f"{want}, got {tuple(lf.shape) if isinstance(lf, torch.Tensor) else lf!r}"
            )
    every_gate = ring.gather(log_forgets)
    every_index = ring.gather([ix.to(qs[0].device) for ix in indices])
    length = 1 + max(int(ix.max()) for ix in every_index)
    full = torch.zeros(*qs[0].shape[:2], length, dtype=torch.float64, device=qs[0].device)
    for lf, ix in zip(every_gate, every_index, strict=True):
        keep = ix >= 0
        full = full.index_copy(-1, ix[keep], lf[..., keep].to(torch.float64))
    c = full.cumsum(-1)
    return [c.index_select(-1, ix.clamp(min=0).to(c.device)) for ix in indices]


def _centred(rotary) -> bool:
    """Whether the rotary scales about a per-call centre (xPos without a fixed one)."""
    return hasattr(rotary, "centre") and rotary.centre is None


def _with_sinks(out, lse, sinks):
    """One more softmax entry per row with logit sinks[h] and no value: the output scaled by the share of
    the row the keys keep."""
    if not isinstance(sinks, torch.Tensor) or sinks.shape != (out.shape[1],):
        raise ValueError(f"sinks must be a tensor of shape (heads,) = ({out.shape[1]},), got {sinks!r}")
    s = sinks.to(lse.dtype)[None, :, None]
    return out * torch.exp(lse - torch.logaddexp(lse, s))[..., None]


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    indices: torch.Tensor,
    group=None,
    positions: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    rotary=None,
    bias: ScoreBias | None = None,
    causal: bool = True,
    window: int | None = None,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
    remap=None,
) -> torch.Tensor:
    """Attention over the whole sequence, sharded over the ranks of ``group`` (default: the world).

    Every rank calls it with its own shard; the result equals :func:`posenc.attention` on the gathered
    sequence at this rank's tokens.

    Args:
        q: (batch, heads, n, head_dim), this rank's queries; k, v: (batch, kv_heads, n, .) its keys and
            values (kv_heads dividing heads), unrotated. Every rank holds n tokens (the layouts of
            :func:`~posenc.parallel.shard_indices` guarantee it).
        indices: (n,) the global token indices this rank holds (:func:`~posenc.parallel.shard_indices`;
            -1 marks a pad slot: no key sees it and its output is zero).
        group: the torch.distributed process group of the context-parallel ranks.
        positions: the rotary positions of this rank's tokens, any shape ``rotary`` takes ((n,), (batch, n),
            M-RoPE's (3, batch, n)); default the indices. A score bias takes its distances from 1-D
            positions. Packed documents: :func:`~posenc.parallel.shard_positions` with ``cu_seqlens``.
        document_ids: (n,) a document id per token; a query sees keys of its own document only.
        rotary: a posenc rotary embedding applied at ``positions`` (RoPE, xPos, M-RoPE, axial).
        bias: a :class:`~posenc.bias.base.ScoreBias` (ALiBi, T5, KERPLE, Sandwich, FIRE) at each pair's global
            positions: its parameters' gradients are this rank's share, sum them over the group (as
            data-parallel training sums every parameter's over its data x context mesh). Or FoX's
            :class:`~posenc.ForgetBias` of this rank's tokens (its gate applied to the shard's hidden state,
            (batch, heads, n)): the gates are gathered, summed in global order (float64), and query i and
            key j add sum_{l = j+1 .. i} log f_l; causal. Or Inkling's :class:`~posenc.BandedBias` of this
            rank's r (batch, heads, n, d_rel) with the layer's table P: r_i . P[:, i - j] in the band;
            causal; P's gradient is this rank's share. Or Shaw et al.'s :class:`~posenc.ShawRelative` (a^K and
            a^V at each pair's clipped global distance) or a :class:`~posenc.CoPE` (causal; its positions
            count gates over keys on every rank: extra passes of the ring, :mod:`posenc.parallel.relative`),
            one module shared by the ranks, its tables' gradients this rank's share; no window with either.
        causal: a query sees keys at indices <= its own.
        window: a query sees keys at index distance < window (both sides when not causal).
        scale: score scale, default 1/sqrt(head_dim).
        sinks: (heads,) learned logits, one more softmax entry per row with no value (GPT-OSS).
        remap: a :class:`~posenc.remap.Remap` (SelfExtend, ReRoPE, STRING, DualChunk) with a
            :class:`~posenc.RotaryEmbedding`, causal, no bias: each rank rotates its q and k once per view at
            its tokens' view positions, and each pair is scored by the view whose band holds its global
            distance.
    Returns:
        (batch, heads, n, v_dim) in q's dtype.
    """
    ring = ProcessRing(group)
    (out,) = _run(
        ring,
        [q],
        [k],
        [v],
        [indices],
        [positions],
        [document_ids],
        rotary,
        bias,
        causal,
        window,
        scale,
        sinks,
        remap,
    )
    return out


def virtual_ring_attention(
    qs,
    ks,
    vs,
    *,
    indices,
    positions=None,
    document_ids=None,
    rotary=None,
    bias=None,
    causal=True,
    window=None,
    scale=None,
    sinks=None,
    remap=None,
) -> list[torch.Tensor]:
    """:func:`ring_attention` with every rank in this process: ``qs[r]``, ``ks[r]``, ``vs[r]``,
    ``indices[r]`` (and ``positions[r]``, ``document_ids[r]`` when given; a ForgetBias per rank as
    ``bias=[...]``) are rank r's; returns each rank's output. The same ring, step by step, with the
    point-to-point transfers replaced by handing a list on."""
    if not isinstance(indices, (list, tuple)) or len(indices) == 0:
        raise ValueError("indices must be a list with one rank's indices per rank")
    world = len(indices)
    positions = [None] * world if positions is None else list(positions)
    document_ids = [None] * world if document_ids is None else list(document_ids)
    for name, xs in (
        ("qs", qs),
        ("ks", ks),
        ("vs", vs),
        ("positions", positions),
        ("document_ids", document_ids),
    ):
        if len(xs) != world:
            raise ValueError(f"{name} must hold one entry per rank ({world}), got {len(xs)}")
    return _run(
        VirtualRing(world),
        list(qs),
        list(ks),
        list(vs),
        list(indices),
        positions,
        document_ids,
        rotary,
        bias,
        causal,
        window,
        scale,
        sinks,
        remap,
    )
