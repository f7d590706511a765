"""Argument checks shared by the rotary modules (:mod:`.base`, :mod:`.embedding`, :mod:`.xpos`, :mod:`.fope`,
:mod:`.cache`).

They live here so that no rotary module reaches into another's private helpers: each check names the
argument, the value and what is allowed.
"""

from __future__ import annotations

import torch

from .. import _checks

__all__ = [
    "check_distinct",
    "check_fits",
    "check_pair",
    "check_positions",
    "check_x",
    "key_positions",
    "seq_and_positions",
]


def key_positions(q_len: int, k_len: int, positions, k_positions):
    """The keys' positions: ``k_positions``, else the queries' ``positions`` when q and k have one length."""
    if positions is not None and k_positions is None:
        if q_len != k_len:
            raise ValueError(
                f"positions give q's {q_len} positions; k has {k_len}: pass k_positions for the keys"
            )
        return positions
    return k_positions


def check_x(rope, name: str, x) -> None:
    """x is a tensor (..., seq, head_dim) for ``rope`` (anything with a ``head_dim``)."""
    _checks.tensor_rank(name, x, 2)
    if x.shape[-1] != rope.head_dim:
        raise ValueError(
            f"{name} must have last dimension head_dim={rope.head_dim}, got shape {tuple(x.shape)}"
        )


def check_pair(rope, q, k, inplace: bool) -> None:
    """q and k as :meth:`RotaryEmbedding.forward` takes them: each (..., seq, head_dim), one batch shape,
    and two distinct tensors when rotated in place."""
    check_x(rope, "q", q)
    check_x(rope, "k", k)
    if q.shape[:-3] != k.shape[:-3]:
        raise ValueError(
            f"q and k must share their batch dimensions, got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if inplace:
        check_distinct(q, k, inplace)


def check_distinct(q, k, inplace: bool) -> None:
    """q and k are two tensors when rotated in place."""
    if inplace and q.data_ptr() == k.data_ptr() and q.numel():
        raise ValueError("inplace=True with q and k the same tensor would rotate it twice; pass two tensors")


def check_positions(x: torch.Tensor, positions) -> None:
    """1-D positions (seq,) or (batch, seq) for x (..., seq, head_dim): x's length, x's batch (or 1), and
    a batch dimension in x for batched positions."""
    if positions is None:
        return
    _checks.positions(positions, x.shape[-2], x.shape[0] if x.dim() >= 3 else None)
    if positions.dim() == 2 and x.dim() < 3:
        raise ValueError(
            f"batched positions of shape {tuple(positions.shape)} need x with a batch dimension, "
            f"got x of shape {tuple(x.shape)}"
        )


def check_fits(dtype: torch.dtype, table_dtype: torch.dtype, scale: torch.Tensor, why: str) -> None:
    """Refuse xPos factors the output dtype cannot hold: they would come back as inf and give NaN scores.
    ``why``: what makes them so large and what to do, for the message."""
    limit = min(torch.finfo(dtype).max, torch.finfo(table_dtype).max)
    worst = float(torch.maximum(scale.amax(), 1.0 / scale.amin()))
    if worst > limit:
        raise ValueError(f"xPos factors reach {worst:.3g}, past {dtype}'s largest {limit:.3g}: {why}")


def seq_and_positions(seq_len, positions):
    """``cos_sin``'s (seq_len, positions) checked: a tensor given as ``seq_len`` is the positions (the
    protocol's ``cos_sin(positions)``), and ``seq_len`` defaults to their length."""
    if isinstance(seq_len, torch.Tensor):
        if positions is not None:
            raise ValueError("positions given twice: pass cos_sin(positions) or cos_sin(seq_len, positions)")
        seq_len, positions = None, seq_len
    if seq_len is None:
        if not isinstance(positions, torch.Tensor):
            raise ValueError(
                f"cos_sin needs positions (a tensor (seq,) or (batch, seq)) or seq_len, got positions="
                f"{type(positions).__name__} and no seq_len"
            )
        seq_len = positions.shape[-1] if positions.dim() else 0
    if positions is not None:
        positions = _checks.positions(positions, seq_len)
    return seq_len, positions
