"""Positions of packed sequences: several documents concatenated into one row, each counted from 0.

Packing documents into fixed-length rows is how most pretraining runs fill their batches; each document's
tokens must then take the positions 0, 1, ... of their own document, not of the row, or the model trains
on positions no document at inference has (a bug packers have shipped: OLMo-core#503, torchtitan#2559).
The boundaries come either as ``cu_seqlens`` (flash-attention's varlen convention: the cumulative lengths,
starting at 0) or as a document id per token (a change of id starts a document). Either way the result is
what ``RotaryEmbedding(..., positions=)`` and ``MRotaryEmbedding``'s text axis take.
"""

from __future__ import annotations

import torch

__all__ = ["packed_positions"]

# Integer dtypes int64 holds: taken as int64 before any difference (uint8's 3 - 5 would wrap to 254); torch's
# wider unsigned dtypes lack most operations (and uint64 does not fit).
_INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _from_cu_seqlens(cu: torch.Tensor) -> torch.Tensor:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype not in _INTEGERS:
        raise ValueError(
            "cu_seqlens must be a 1-D integer tensor (int64, int32, int16, int8 or uint8) of cumulative "
            "lengths (0, n1, n1 + n2, ...), got "
            f"{cu if not isinstance(cu, torch.Tensor) else f'{cu.dtype} of shape {tuple(cu.shape)}'}"
        )
    cu = cu.long()
    if cu.numel() == 0 or int(cu[0]) != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu.tolist()[:4]}")
    lengths = cu.diff()
    if bool((lengths < 0).any()):
        raise ValueError(f"cu_seqlens must not decrease, got {cu.tolist()[:8]}")
    total = int(cu[-1])
    starts = torch.repeat_interleave(cu[:-1], lengths, output_size=total)
    return torch.arange(total, device=cu.device) - starts


def _from_document_ids(ids: torch.Tensor) -> torch.Tensor:
    if (
        not isinstance(ids, torch.Tensor)
        or ids.dim() not in (1, 2)
        or ids.dtype not in (*_INTEGERS, torch.bool)
    ):
        raise ValueError(
            "document_ids must be an integer tensor (int64, int32, int16, int8, uint8 or bool) of shape "
            "(total,) or (batch, total), one id per token, got "
            f"{ids if not isinstance(ids, torch.Tensor) else f'{ids.dtype} of shape {tuple(ids.shape)}'}"
        )
    index = torch.arange(ids.shape[-1], device=ids.device).expand_as(ids)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[..., 1:] = ids[..., 1:] != ids[..., :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    return index - first


def packed_positions(
    cu_seqlens: torch.Tensor | None = None, document_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Each token's position in its own document, int64.

    Args:
        cu_seqlens: (documents + 1,) integer, the cumulative lengths 0, n1, n1 + n2, ..., total: returns
            (total,).
        document_ids: (total,) or (batch, total) integer, a document id per token; a change of id starts a
            document (ids may repeat in later runs): returns the same shape.

    Exactly one of the two. Length-dependent RoPE schedules (dynamic NTK, LongRoPE) then see the longest
    document, 1 + the largest position, as transformers does for packed position ids.
    """
    if (cu_seqlens is None) == (document_ids is None):
        raise ValueError("packed_positions takes exactly one of cu_seqlens and document_ids")
    return _from_cu_seqlens(cu_seqlens) if cu_seqlens is not None else _from_document_ids(document_ids)
