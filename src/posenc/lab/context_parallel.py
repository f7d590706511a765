"""Context parallelism in the laboratory: which share of every sequence a rank holds, and which encodings
can be split along the sequence (``posenc train --context-parallel N``, :mod:`posenc.lab.train`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc.lab.checks import check_int
from posenc.lab.config import GPTConfig, TrainConfig
from posenc.lab.encoding import Encoding
from posenc.lab.encodings import build
from posenc.lab.errors import LabError

__all__ = ["ContextShard", "check_context_parallel", "check_context_run"]


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


def check_context_run(model_cfg: GPTConfig, train_cfg: TrainConfig, size: int, world: int) -> None:
    """Refuse, before any work, a training run that ``world`` processes cannot share as replicas of
    ``size`` context ranks: ``size`` must divide the processes, the replicas the batch, and 2 x ``size``
    the sequence (each rank a head and a tail chunk), and the encoding must split along the sequence."""
    check_int("context_parallel", size)
    if world % size:
        raise LabError(
            f"--context-parallel {size} must divide the number of processes ({world}); "
            "launch with torchrun --nproc_per_node N"
        )
    replicas = world // size
    if train_cfg.batch_size % replicas:
        raise LabError(
            f"batch_size={train_cfg.batch_size} must be divisible by the number of data-parallel replicas "
            f"({replicas} = {world} processes / --context-parallel {size})"
        )
    seq = train_cfg.seq_len or model_cfg.max_len
    if seq % (2 * size):
        raise LabError(
            f"the sequence length {seq} must be a multiple of 2 x --context-parallel = "
            f"{2 * size} (each rank holds a head and a tail chunk of every sequence)"
        )
    if size > 1:
        check_context_parallel(build(model_cfg), model_cfg.encoding)
