"""Which tokens each rank holds under context parallelism, as data: global token indices per rank.

A sequence of ``length`` tokens is split over ``world_size`` ranks along the sequence. Causal attention
gives a later token more keys, so the split decides the balance of work; the layouts here are the ones
engines use:

* ``contiguous``: rank r holds tokens [r L/W, (r+1) L/W) (unit W). The last rank does most causal work.
* ``headtail``: 2W equal chunks, rank r holds chunk r and chunk 2W-1-r (unit 2W): every rank the same
  causal work. Llama 3's context parallelism (Dubey et al. 2024, arXiv:2407.21783, sec. 3.3.2) and torch's
  ``_HeadTailLoadBalancer``.
* ``striped``: token t on rank t mod W (unit W): Striped Attention (Brandon et al. 2023, arXiv:2311.09431).
* ``headtail`` with ``cu_seqlens``: packed documents, each split head-tail on its own (each document's
  length a multiple of 2W): Megatron-LM / TransformerEngine's THD layout. Rank r holds chunk r and chunk
  2W-1-r of every document, in document order.

Positions follow from the indices: a token's position is its global index (one sequence), or its position
in its own document (:func:`posenc.packed_positions` indexed by the rank's indices). A length that is not a
multiple of the layout's unit is refused, or with ``pad=True`` padded at the end to the next multiple: the
pad slots get index -1, which :func:`posenc.parallel.ring_attention` masks (no key sees them, their
outputs are zero).
"""

from __future__ import annotations

from itertools import pairwise

import torch

from .. import _checks

__all__ = ["LAYOUTS", "shard", "shard_indices", "shard_positions", "unshard", "unit"]

LAYOUTS = ("contiguous", "headtail", "striped")


def unit(layout: str, world_size: int) -> int:
    """The number a length must be a multiple of for ``layout`` over ``world_size`` ranks (W or 2W)."""
    layout = _checks.one_of("layout", layout, LAYOUTS)
    world_size = _checks.positive_int("world_size", world_size, size=True)
    return 2 * world_size if layout == "headtail" else world_size


def _fit(length: int, step: int, pad: bool, what: str) -> int:
    if length % step == 0:
        return length
    if not pad:
        raise ValueError(
            f"{what} must be a multiple of {step} for this layout and world_size, got {length}; pad it "
            f"(pad=True pads at the end, the pad slots masked) or choose a length that is"
        )
    return length + step - length % step


def _headtail(length: int, world_size: int, rank: int) -> torch.Tensor:
    chunk = length // (2 * world_size)
    head = torch.arange(rank * chunk, (rank + 1) * chunk)
    tail = torch.arange((2 * world_size - 1 - rank) * chunk, (2 * world_size - rank) * chunk)
    return torch.cat((head, tail))


def _document_lengths(cu_seqlens) -> list[int]:
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
        raise ValueError(
            "cu_seqlens must be a 1-D integer tensor of cumulative document lengths (0, n1, n1 + n2, ...), "
            f"got {cu_seqlens!r}"
        )
    cu = cu_seqlens.long().tolist()
    if not cu or cu[0] != 0 or any(b < a for a, b in pairwise(cu)):
        raise ValueError(f"cu_seqlens must start at 0 and not decrease, got {cu[:8]}")
    return [b - a for a, b in pairwise(cu)]


def shard_indices(
    length: int,
    world_size: int,
    rank: int,
    layout: str = "headtail",
    *,
    cu_seqlens: torch.Tensor | None = None,
    pad: bool = False,
) -> torch.Tensor:
    """The global token indices rank ``rank`` holds, int64 of shape (length_padded / world_size,).

    Args:
        length: tokens in the sequence (with ``cu_seqlens``: its last entry).
        world_size, rank: the context-parallel group's size and this rank (0 <= rank < world_size).
        layout: "contiguous", "headtail" or "striped" (module docstring); with ``cu_seqlens`` "headtail"
            only, per document.
        cu_seqlens: cumulative document lengths (0, n1, n1 + n2, ..., length) of packed documents.
        pad: a length that is not a multiple of the layout's unit is padded at the end (per document with
            ``cu_seqlens``) and the pad slots get index -1; without it such a length is refused.
    """
    length = _checks.positive_int("length", length, position=True)
    world_size = _checks.positive_int("world_size", world_size, size=True)
    rank = _checks.non_negative_int("rank", rank)
    if rank >= world_size:
        raise ValueError(f"rank must be in [0, world_size = {world_size}), got {rank}")
    step = unit(layout, world_size)
    pad = _checks.boolean("pad", pad)
    if cu_seqlens is not None:
        return _document_shard(length, world_size, rank, layout, cu_seqlens, pad)
    padded = _fit(length, step, pad, "length")
    if layout == "contiguous":
        size = padded // world_size
        indices = torch.arange(rank * size, (rank + 1) * size)
    elif layout == "striped":
        indices = torch.arange(rank, padded, world_size)
    else:
        indices = _headtail(padded, world_size, rank)
    return indices.masked_fill(indices >= length, -1)


def _document_shard(length, world_size, rank, layout, cu_seqlens, pad) -> torch.Tensor:
    if layout != "headtail":
        raise ValueError(
            f"cu_seqlens (packed documents) are sharded per document head-tail: layout must be 'headtail', "
            f"got {layout!r}"
        )
    lengths = _document_lengths(cu_seqlens)
    if sum(lengths) != length:
        raise ValueError(f"cu_seqlens must end at length = {length}, got {int(cu_seqlens[-1])}")
    parts, start = [], 0
    for i, n in enumerate(lengths):
        padded = _fit(n, 2 * world_size, pad, f"document {i}'s length")
        local = _headtail(padded, world_size, rank)
        parts.append(torch.where(local < n, local + start, -1))
        start += n
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)


def shard(x: torch.Tensor, indices: torch.Tensor, dim: int = -1, fill=0) -> torch.Tensor:
    """The entries of ``x`` at ``indices`` along ``dim`` (a rank's shard of a sequence tensor: tokens,
    positions, document ids, or M-RoPE's (3, batch, seq) positions with dim=-1); pad slots (-1) get
    ``fill``."""
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1 or indices.is_floating_point():
        raise ValueError(f"indices must be a 1-D integer tensor (shard_indices' output), got {indices!r}")
    n = x.shape[dim]
    if indices.numel() and int(indices.max()) >= n:
        raise ValueError(f"indices reach {int(indices.max())}, but x has {n} entries along dim {dim}")
    pads = indices < 0
    out = x.index_select(dim, indices.clamp(min=0).to(x.device))
    if bool(pads.any()):
        shape = [1] * x.dim()
        shape[dim] = -1
        out = out.masked_fill(pads.to(x.device).view(shape), fill)
    return out


def shard_positions(
    indices: torch.Tensor, *, cu_seqlens: torch.Tensor | None = None, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """A rank's positions: its global indices (one sequence), each token's position in its own document
    (``cu_seqlens``), or the entries of given ``positions`` (..., seq) at its indices (M-RoPE's (3, batch,
    seq)); pad slots get position 0 (they are masked)."""
    if positions is not None:
        return shard(positions, indices, dim=-1)
    if cu_seqlens is not None:
        from ..rope.packing import packed_positions

        return shard(packed_positions(cu_seqlens=cu_seqlens), indices)
    return indices.clamp(min=0)


def unshard(shards, indices, length: int, dim: int = -1) -> torch.Tensor:
    """The whole sequence from every rank's shard: ``shards[r]`` holds the tokens at ``indices[r]`` along
    ``dim``; pad slots are dropped. The inverse of :func:`shard` over all ranks (after an all-gather)."""
    if len(shards) != len(indices):
        raise ValueError(f"one shard per rank's indices: got {len(shards)} shards and {len(indices)} indices")
    x = torch.cat(list(shards), dim=dim)
    idx = torch.cat(list(indices)).to(x.device)
    keep = idx >= 0
    covered = torch.sort(idx[keep]).values
    if not torch.equal(covered, torch.arange(length, device=x.device)):
        raise ValueError(f"the indices do not cover 0 .. {length - 1} exactly once")
    order = torch.empty(length, dtype=torch.long, device=x.device)
    order[idx[keep]] = torch.nonzero(keep).squeeze(1)
    return x.index_select(dim, order)
