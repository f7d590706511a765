"""Context parallelism: a sequence sharded over ranks along its length, with every position term exact.

:func:`shard_indices` says which global tokens each rank holds (contiguous, head-tail, striped, packed
documents per document); :func:`ring_attention` attends each rank's shard to the whole sequence on
torch.distributed (gloo on CPU, NCCL on GPU) with RoPE at global positions, score biases at global
distances, causal, window and document masks, and sinks; :func:`virtual_ring_attention` runs the same ring
with every rank in one process.
"""

from .ring import ProcessRing, VirtualRing, ring_attention, virtual_ring_attention
from .sharding import LAYOUTS, shard, shard_indices, shard_positions, unit, unshard

__all__ = [
    "LAYOUTS",
    "ProcessRing",
    "VirtualRing",
    "ring_attention",
    "shard",
    "shard_indices",
    "shard_positions",
    "unit",
    "unshard",
    "virtual_ring_attention",
]
