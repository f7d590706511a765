"""Training loop: AdamW, linear warmup then cosine decay, gradient clipping, atomic checkpoints, DDP.

Determinism: the model is initialised from ``seed``; the batch at step s is a pure function of
``(seed, s)`` (:func:`posenc.lab.data.batch_at`); there is no dropout. So a run resumed from the
checkpoint at step s reproduces an uninterrupted run bit for bit on the same machine and thread count.

Data parallel: launched with ``torchrun`` (:mod:`posenc.lab.runtime`), every rank builds the same
global batch and takes its slice of rows, so DDP's averaged gradient is the gradient of the global
batch: a 2-process run follows the same trajectory as a 1-process run up to float summation order.
Rank 0 alone writes checkpoints.

Context parallel (``context_parallel=N``, ``posenc train --context-parallel N`` under torchrun): the
processes form a data x context grid, N consecutive ranks sharing each data-parallel slice of rows, each
holding a head-tail share of every sequence (:func:`posenc.parallel.shard_indices`) and attending on
:func:`posenc.parallel.ring_attention`. Every rank's loss is the mean over as many tokens as any other's,
so DDP's average over all ranks is again the gradient of the global batch.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from posenc.lab import defaults as D
from posenc.lab.checkpoint import (
    check_resumable,
    latest_checkpoint,
    read_checkpoint,
    resolve_checkpoint,
    run_state,
    save_checkpoint,
)
from posenc.lab.checks import check_int
from posenc.lab.config import GPTConfig, TrainConfig
from posenc.lab.context_parallel import ContextShard, check_context_run
from posenc.lab.data import Corpus, batch_at, load_corpus, loss_weights
from posenc.lab.errors import LabError
from posenc.lab.layers import plan_of
from posenc.lab.model import GPT, byte_losses, next_byte_loss
from posenc.lab.runtime import Processes
from posenc.parallel import shard_indices

__all__ = ["TrainResult", "lr_at", "make_optimizer", "train"]

# Steps between loss records, progress reports and throughput measurements.
_LOG_EVERY = 10


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warmup, then cosine to ``min_lr_ratio*lr``.

    The cosine schedule of SGDR (Loshchilov & Hutter 2017) without restarts, as in GPT-3 and Llama.
    """
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) with GPT-3's betas (0.9, 0.95)."""
    # Weight decay on matrices only; norms' gains and 1-D parameters are left alone (as in GPT-2 / nanoGPT).
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


@dataclass
class TrainResult:
    model: GPT
    step: int
    losses: list[tuple[int, float]]
    tokens_per_s: float
    out_dir: Path


def train(
    model_cfg: GPTConfig,
    train_cfg: TrainConfig,
    out_dir: str | os.PathLike,
    *,
    corpus: Corpus | str | None = None,
    cache_dir: str | os.PathLike | None = None,
    resume: bool = False,
    ckpt_every: int = D.CKPT_EVERY,
    device: str = "cpu",
    progress: bool = True,
    stop_after: int | None = None,
    callback=None,
    compile: bool | str = False,
    context_parallel: int = 1,
) -> TrainResult:
    """Train a GPT on a corpus, checkpointing to ``out_dir`` every ``ckpt_every`` steps and at the end.

    Args:
        corpus: a loaded :class:`Corpus`, a path, or None for the standard library.
        resume: continue from ``out_dir``'s latest checkpoint (must match both configs and the corpus).
            Without it, a run directory that already holds a checkpoint is an error.
        stop_after: stop (after checkpointing) once this step is reached, as if killed there;
            the schedule still targets ``train_cfg.steps``. For interruption tests and time-boxing.
        callback: optional ``fn(step, loss, tokens_per_s)``, called every 10 steps on rank 0 (progress).
        device: "cpu", "cuda" or "cuda:N"; under torchrun with CUDA each rank uses ``cuda:LOCAL_RANK``.
        compile: run the forward and backward through ``torch.compile`` (True: the default inductor
            backend; a string names another backend, e.g. ``"aot_eager"`` in tests). Checkpoints hold
            the plain module's weights either way, so eager and compiled runs resume each other.
        context_parallel: ranks that share each sequence (module docstring); it must divide the number of
            processes, and 2 x it the sequence length.

    Returns:
        The trained model (unwrapped), the step reached, logged losses and throughput.
    """
    check_int("ckpt_every", ckpt_every)
    backend = compile_backend(compile)
    procs = Processes.from_env()
    check_context_run(model_cfg, train_cfg, context_parallel, procs.world)
    dev = procs.start(device)
    if not isinstance(corpus, Corpus):
        corpus = load_corpus(
            corpus,
            cache_dir=cache_dir,
            min_train_tokens=(train_cfg.seq_len or model_cfg.max_len) + 2,
            min_val_tokens=1,
        )
    run = _Run(model_cfg, train_cfg, Path(out_dir), corpus, procs, dev, ckpt_every, backend, context_parallel)
    start = run.restore(resume)
    end = train_cfg.steps if stop_after is None else min(train_cfg.steps, stop_after)
    bar = _progress_bar(start, end, f"train {model_cfg.encoding}") if progress and procs.rank == 0 else None
    losses, tps = run.loop(start, end, bar, callback if procs.rank == 0 else None)
    run.model.eval()
    return TrainResult(
        model=run.model, step=max(start, end), losses=losses, tokens_per_s=tps, out_dir=run.out
    )


def compile_backend(compile: bool | str) -> str | None:
    """The ``torch.compile`` backend that ``compile`` asks for (None: eager), or a LabError naming it."""
    if compile is False or compile is None:
        return None
    if compile is True:
        return "inductor"
    import torch._dynamo

    backends = torch._dynamo.list_backends(exclude_tags=())
    if not isinstance(compile, str) or compile not in backends:
        raise LabError(
            f"compile={compile!r} is not a torch.compile backend; allowed: True, False, {backends}"
        )
    return compile


def _context_shard(procs: Processes, size: int, seq: int, dev):
    """(this rank's data-parallel replica, its :class:`~posenc.lab.model.ContextShard`): ranks
    r * size .. (r + 1) * size - 1 share replica r's rows, each a head-tail share of every sequence. Every
    rank creates every group (torch.distributed's rule), and each is its own communicator, apart from the
    one DDP all-reduces on."""
    replica = procs.rank // size
    groups = [dist.new_group(list(range(r * size, (r + 1) * size))) for r in range(procs.world // size)]
    indices = shard_indices(seq, size, procs.rank % size, "headtail").to(dev)
    return replica, ContextShard(indices, groups[replica])


def _mean_over(value: torch.Tensor, group) -> float:
    """The mean of a scalar over a group's ranks: the loss of the replica's rows, not of one rank's share."""
    total = value.clone()
    dist.all_reduce(total, group=group)
    return total.item() / dist.get_world_size(group)


def _progress_bar(start: int, end: int, desc: str):
    """A tqdm bar over steps ``start`` .. ``end``, or None when there is nothing to do."""
    if end <= start:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=end, initial=start, desc=desc, unit="step", leave=True)


class _Run:
    """One training run's model, optimizer and data; :meth:`restore`, then :meth:`loop`."""

    def __init__(
        self,
        model_cfg: GPTConfig,
        train_cfg: TrainConfig,
        out: Path,
        corpus: Corpus,
        procs: Processes,
        dev: torch.device,
        ckpt_every: int,
        backend: str | None = None,
        context_parallel: int = 1,
    ):
        self.cfg, self.out, self.corpus = train_cfg, out, corpus
        self.procs, self.dev, self.ckpt_every = procs, dev, ckpt_every
        self.backend = backend
        self.seq = train_cfg.seq_len or model_cfg.max_len
        self.state = run_state(model_cfg, train_cfg, corpus.path)
        torch.manual_seed(train_cfg.seed % 2**64)  # what torch reads of it; --seed + i may pass int64
        self.model = GPT(model_cfg).to(dev)
        self.optimizer = make_optimizer(self.model, train_cfg)
        # What the steps call: the model, wrapped in DDP and/or compiled by loop(). Checkpoints and the
        # optimizer use self.model, so saved keys never carry DDP's "module." or compile's "_orig_mod.".
        self.net: torch.nn.Module = self.model
        self.replica, self.shard = procs.rank, None
        if context_parallel > 1:
            self.replica, self.shard = _context_shard(procs, context_parallel, self.seq, dev)
        self.replicas = procs.world // context_parallel

    def restore(self, resume: bool) -> int:
        """Load the latest checkpoint when resuming, record the run state; returns the step to start at."""
        start = 0
        latest = latest_checkpoint(self.out)
        if latest is not None and not resume:
            raise LabError(
                f"run directory {str(self.out)!r} already holds a checkpoint ({latest.name}); "
                f"pass --resume to continue it or choose another --out"
            )
        if resume and latest is not None:
            tensors, state, opt_state = read_checkpoint(latest)
            check_resumable(state, self.state, latest)
            self.model.load_state_dict(tensors, strict=True)
            self.optimizer.load_state_dict(opt_state)
            start = int(state["step"])
        elif self.cfg.init_from is not None:  # a continued model starts from another run's weights
            tensors, _, _ = read_checkpoint(resolve_checkpoint(self.cfg.init_from), with_optimizer=False)
            self.model.load_state_dict(tensors, strict=True)
        if self.procs.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            record = {**self.state, "layers": plan_of(self.model.encoding)}  # each block's kind, as it ran
            (self.out / "run.json").write_text(json.dumps(record, indent=2))
        return start

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """This rank's rows of the global batch of ``step``: ``(x, y, weights)``, each ``(batch / world,
        seq)``; ``weights`` (None at answer weight 1) are each target's loss weight, scaled so that they
        average 1 over the global batch: the mean over ranks of mean(weights * loss) is then the weighted
        mean of the whole batch, as DDP's averaged gradient needs."""
        x, y, answers = batch_at(
            self.corpus.train,
            self.cfg.first_batch + step,
            batch_size=self.cfg.batch_size,
            seq_len=self.seq,
            seed=self.cfg.seed,
            copy_fraction=self.cfg.copy_fraction,
            passkey_fraction=self.cfg.passkey_fraction,
            mix=self.cfg.mix,
        )
        weights = loss_weights(answers, self.cfg.answer_weight)
        per_rank = self.cfg.batch_size // self.replicas
        rows = slice(self.replica * per_rank, (self.replica + 1) * per_rank)
        x, y = x[rows], y[rows]
        weights = None if weights is None else weights[rows]
        if self.shard is not None:
            x, y = x[:, self.shard.indices], y[:, self.shard.indices]
            weights = None if weights is None else weights[:, self.shard.indices]
        return x.to(self.dev), y.to(self.dev), None if weights is None else weights.to(self.dev)

    def step(self, step: int) -> float:
        """One optimizer step on the batch of ``step``; returns its loss (nats per byte, every byte alike
        whatever the answer weight, so that runs compare)."""
        x, y, weights = self.batch(step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr_at(step, self.cfg)
        logits = self.net(x) if self.shard is None else self.net(x, shard=self.shard)
        if weights is None:
            loss = objective = next_byte_loss(logits, y)
        else:
            losses = byte_losses(logits, y)
            loss, objective = losses.mean(), (losses * weights).mean()
        self.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        value = loss.item() if self.shard is None else _mean_over(loss.detach(), self.shard.group)
        if not math.isfinite(value):
            raise LabError(
                f"training diverged at step {step + 1}: loss is {value}; lower --lr (was {self.cfg.lr})"
            )
        return value

    def save(self, done: int) -> None:
        if self.procs.rank == 0:
            save_checkpoint(self.out, done, self.model, self.optimizer, self.state)
        if self.procs.distributed:
            dist.barrier()

    def loop(self, start: int, end: int, bar, callback) -> tuple[list[tuple[int, float]], float]:
        """Steps ``start`` .. ``end``: returns ``[(step, loss)]`` every few steps and the last tokens/s."""
        if self.procs.distributed:
            self.net = torch.nn.parallel.DistributedDataParallel(self.model)
        if self.backend is not None:
            # Dynamo's recompile limit (8) counts every model compiled in this process against the one
            # code object GPT.forward; a process that trains models one after another (compare with
            # --jobs 1) would silently fall back to eager at the ninth. Each run starts afresh.
            torch._dynamo.reset()
            self.net = torch.compile(self.net, backend=self.backend)
        self.model.train()
        losses: list[tuple[int, float]] = []
        t0, tokens, tps = time.perf_counter(), 0, 0.0
        for step in range(start, end):
            loss = self.step(step)
            tokens += self.cfg.batch_size * self.seq
            done = step + 1
            if done % _LOG_EVERY == 0 or done == end:
                tps = tokens / max(1e-9, time.perf_counter() - t0)
                losses.append((done, loss))
                if bar is not None:
                    bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tps:,.0f}")
                if callback is not None:
                    callback(done, loss, tps)
            if bar is not None:
                bar.update(1)
            if done % self.ckpt_every == 0 or done == end:
                self.save(done)
        if bar is not None:
            bar.close()
        return losses, tps
