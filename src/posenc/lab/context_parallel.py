"""Context parallelism in the laboratory: which share of every sequence a rank holds, and which encodings
can be split along the sequence (``posenc train --context-parallel N``, :mod:`posenc.lab.train`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc.lab.encoding import Encoding
from posenc.lab.errors import LabError

__all__ = ["ContextShard", "check_context_parallel"]


@dataclass(frozen=True)
class ContextShard:
    """This rank's share of every sequence under context parallelism: the global token ``indices`` (n,) it
    holds (:func:`posenc.parallel.shard_indices`) and the torch.distributed ``group`` of the ranks that hold
    the rest; its layers attend on :func:`posenc.parallel.ring_attention`."""

    indices: torch.Tensor
    group: object


def check_context_parallel(enc: Encoding, scheme: str) -> None:
    """Refuse, before any work, an encoding whose terms cannot be split along the sequence here."""
    why = None
    if enc.hidden_terms is not None or enc.layer_bias is not None:
        why = "its position terms read the hidden state of every earlier token (a content bias)"
    elif enc.window is not None or enc.sliding is not None:
        why = "its window is materialised over the whole sequence"
    elif enc.layers is not None:
        why = "its layers attend differently (a per-layer plan), which the ring does not take yet"
    elif enc.random_positions is not None or enc.train_positions is not None:
        why = "its training positions are drawn per forward pass over the whole sequence"
    if why is not None:
        raise LabError(f"--context-parallel does not support the {scheme!r} scheme yet: {why}")
