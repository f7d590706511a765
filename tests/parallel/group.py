"""A spawned test process joining its gloo group: one thread, a file rendezvous, a timeout that ends a
rank whose peers died instead of hanging the suite, and the group destroyed however the work ends."""

from __future__ import annotations

import contextlib
import datetime

import torch
import torch.distributed as dist


@contextlib.contextmanager
def gloo_rank(rank: int, world: int, store: str):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        yield
    finally:
        dist.destroy_process_group()
