"""One training run on ``size`` spawned CPU processes that share every sequence (``posenc compare
--context-parallel N``): each process joins a gloo group of its own (a file rendezvous in a temporary
folder, so runs side by side never meet) and trains as ``posenc train --context-parallel N`` under torchrun
would (:func:`posenc.lab.train.train`: a head-tail share of every sequence, attention on
:func:`posenc.parallel.ring_attention`, rank 0 writing the checkpoints), so a comparison's models are the
ones one process trains, up to float summation order."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from posenc.lab.config import GPTConfig, TrainConfig
from posenc.lab.context_parallel import check_context_run
from posenc.lab.runtime import exit_with_parent
from posenc.lab.train import train

__all__ = ["train_on_ranks"]


def train_on_ranks(
    size: int, threads: int, model_cfg: GPTConfig, train_cfg: TrainConfig, run_dir, **options
) -> list[tuple[int, float, float]]:
    """Train (resuming) ``run_dir`` on ``size`` gloo processes of ``threads`` torch threads each, sharing
    every sequence; ``options`` are :func:`~posenc.lab.train.train`'s (corpus, cache_dir, ckpt_every,
    compile). Returns rank 0's logged ``(step, loss, tokens_per_s)``. Waits for every rank; if one fails,
    the others are ended and its error raised here."""
    check_context_run(model_cfg, train_cfg, size, size)  # refused here, before any process starts
    with tempfile.TemporaryDirectory(prefix="posenc-cp-") as folder:
        args = (size, threads, folder, os.getpid(), (model_cfg, train_cfg, str(run_dir)), options)
        mp.spawn(_rank, args=args, nprocs=size, join=True)
        return [tuple(row) for row in json.loads((Path(folder) / "losses.json").read_text())]


def _rank(rank: int, size: int, threads: int, folder: str, parent: int, run: tuple, options: dict) -> None:
    """One spawned rank: joins the group, trains, and rank 0 writes what it logged to ``losses.json``."""
    exit_with_parent(parent)  # a killed compare ends its ranks too
    os.environ.update(WORLD_SIZE=str(size), RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=size)
    logged = []
    try:
        train(
            *run,
            resume=True,
            progress=False,
            context_parallel=size,
            callback=lambda step, loss, tps: logged.append((step, loss, tps)),
            **options,
        )
    finally:
        dist.destroy_process_group()
    if rank == 0:
        (Path(folder) / "losses.json").write_text(json.dumps(logged))
