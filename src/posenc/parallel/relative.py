"""Shaw et al.'s relative representations and CoPE on one ring block: a rank's queries against one shard of
keys at their global positions, differentiable in q, k and the tables (the ring's backward takes their
gradients with ``torch.autograd.grad`` on a chunk, as the banded bias's).

Shaw et al. 2018 ("Self-Attention with Relative Position Representations", arxiv.org/abs/1803.02155, eq.
3-5): the score adds q_i . a^K_{c(j - i)} * scale and the value v_j + a^V_{c(j - i)}, c(d) = clip(d, -k, k).
Both depend on the pair alone, so a block adds its share and the log-sum-exp merge stays exact (the output
is linear in the probabilities: sum_j p_ij a^V_{c(j - i)} is the block's probabilities summed per clipped
distance, times a^V).

CoPE (Golovneva et al. 2024, "Contextual Position Encoding", arxiv.org/abs/2405.18719, eq. 3-5): query i's
position of key j is p_ij = sum_{t = j..i} sigmoid(q_i . k_t * scale) over the keys it sees, a sum that
crosses shards. The keys of a shard lie in *runs* of consecutive global indices (one per contiguous shard,
two per head-tail shard, one token each when striped), and every run is whole on one rank. So p_ij is the
gates of j's own run from j on (in the block) plus the gates of every later run: ``counts`` (B, H, rows,
runs), each query's gate totals of the runs after each run, summed on a first ring pass
(:func:`gate_totals` per block, :func:`later_runs` once). The backward needs the mirror image: the gate
g_it reaches every p_ij with j <= t, so its gradient is dp summed over the keys before t, the earlier runs'
part from a first backward pass of count gradients (:func:`earlier_runs`).
"""

from __future__ import annotations

import torch

from .heads import grouped_qk

__all__ = [
    "cope_gates",
    "cope_term",
    "earlier_runs",
    "gate_totals",
    "later_runs",
    "run_ids",
    "run_starts",
    "shaw_key_term",
    "shaw_value_term",
]


def shaw_key_term(q, key_table, rows, scale: float) -> torch.Tensor:
    """(B, H, m, cols): q_i . a^K_{rows_ij} * scale for queries q (B, H, m, D), the table a^K (2k + 1, D)
    and each pair's table row ``rows`` (m, cols) (:meth:`~posenc.bias.shaw.ShawRelative.rows`)."""
    rel = torch.matmul(q, key_table.to(q.dtype).T) * scale  # (B, H, m, 2k + 1): every row of the table
    return rel.gather(-1, rows.expand(*rel.shape[:2], *rows.shape))


def shaw_value_term(p, value_table, rows) -> torch.Tensor:
    """(B, H, m, Dv): sum_j p_ij a^V_{rows_ij}, the probabilities p (B, H, m, cols) summed per table row,
    times a^V (2k + 1, Dv); no (m, cols, Dv) tensor."""
    per_row = p.new_zeros(*p.shape[:-1], value_table.shape[0])
    per_row = per_row.scatter_add(-1, rows.expand(*p.shape[:2], *rows.shape), p)
    return torch.matmul(per_row, value_table.to(p.dtype))


def run_starts(indices: list[torch.Tensor]) -> torch.Tensor:
    """The sorted global index at which each run starts, over every rank's ``indices`` (n,) (-1: a pad,
    which ends a run): a run is a stretch of a shard whose indices go up by one."""
    starts = []
    for ix in indices:
        real = ix >= 0
        first = real.clone()
        first[1:] &= (ix[1:] != ix[:-1] + 1) | ~real[:-1]
        starts.append(ix[first])
    return torch.cat(starts).sort().values


def run_ids(starts: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(n,) the run (its rank in global order) of each key index; -1 for a pad."""
    ids = torch.searchsorted(starts, index.contiguous(), right=True) - 1
    return torch.where(index >= 0, ids, -1)


def cope_gates(q, k, ok, scale: float) -> torch.Tensor:
    """(B, H, m, cols) sigmoid(q_i . k_j * scale), 0 where the pair may not meet (``ok`` (m, cols))."""
    return torch.sigmoid(grouped_qk(q, k) * scale).masked_fill(~ok, 0.0)


def gate_totals(gates, ids, totals) -> None:
    """Adds each query's gates (B, H, m, cols) per run of their keys ``ids`` (cols,) into ``totals``
    (B, H, m, runs)."""
    real = ids >= 0
    totals.index_add_(-1, ids[real], gates[..., real].to(totals.dtype))


def later_runs(totals) -> torch.Tensor:
    """(B, H, m, runs): per run, the totals of the runs after it (an exclusive suffix sum)."""
    after = totals.flip(-1).cumsum(-1).flip(-1)
    return torch.cat((after[..., 1:], torch.zeros_like(after[..., :1])), dim=-1)


def earlier_runs(d_counts) -> torch.Tensor:
    """(B, H, m, runs): the gradient of each run's gate total, given the gradients of the counts
    (:func:`later_runs`' adjoint: run a's total enters the counts of every run before it)."""
    before = d_counts.cumsum(-1)
    return torch.cat((torch.zeros_like(before[..., :1]), before[..., :-1]), dim=-1)


def _within_runs(gates, ids) -> torch.Tensor:
    """(B, H, m, cols): per key, the gates of its run's keys from it on (a run's keys are consecutive
    columns: the reverse cumulative sum less the one at the column after the run)."""
    after = gates.flip(-1).cumsum(-1).flip(-1)
    n = ids.shape[0]
    new = torch.ones(n + 1, dtype=torch.bool, device=ids.device)
    new[1:-1] = ids[1:] != ids[:-1]
    firsts = new.nonzero().squeeze(1)  # each run's first column, then n
    end = firsts[torch.cumsum(new[:-1].long(), 0)]  # the column after each key's run
    padded = torch.cat((after, torch.zeros_like(after[..., :1])), dim=-1)
    return after - padded.index_select(-1, end)


def cope_term(q, k, pos_emb, counts, ok, ids, scale: float):
    """(the CoPE bias (B, H, m, cols), the gates) of queries q (B, H, m, D) against keys k (B, Hk, cols, D)
    in runs ``ids`` (cols,), with ``counts`` (B, H, m, runs) the gates of the later runs and pos_emb
    (D, npos_max): bias_ij = e[ceil p_ij] w + e[floor p_ij] (1 - w), w = p_ij - floor p_ij,
    e = q_i . pos_emb * scale, p_ij clamped to npos_max - 1 (as :class:`~posenc.bias.cope.CoPE`)."""
    gates = cope_gates(q, k, ok, scale)
    later = counts.to(gates.dtype).gather(-1, ids.clamp(min=0).expand(*gates.shape[:-1], ids.shape[0]))
    positions = (_within_runs(gates, ids) + later).clamp(max=pos_emb.shape[1] - 1)
    at_integers = torch.matmul(q * scale, pos_emb.to(q.dtype))  # (B, H, m, npos_max)
    floor = positions.detach().floor()
    w = positions - floor
    ceil = at_integers.gather(-1, positions.detach().ceil().long())
    return ceil * w + at_integers.gather(-1, floor.long()) * (1 - w), gates
