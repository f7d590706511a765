"""Training loop: AdamW, linear warmup then cosine decay, gradient clipping, atomic checkpoints, DDP.

Determinism: the model is initialised from ``seed``; the batch at step s is a pure function of
``(seed, s)`` (:func:`posenc.lab.data.batch_at`); there is no dropout. So a run resumed from the
checkpoint at step s reproduces an uninterrupted run bit for bit on the same machine and thread count.

Data parallel: launched with ``torchrun`` (``WORLD_SIZE`` > 1), every rank builds the same global
batch and takes its slice of rows, so DDP's averaged gradient is the gradient of the global batch:
a 2-process run follows the same trajectory as a 1-process run up to float summation order.
Backend gloo on CPU, nccl on CUDA. Rank 0 alone writes checkpoints.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.distributed as dist

from posenc.lab.checkpoint import latest_checkpoint, read_checkpoint, resolve_checkpoint, save_checkpoint
from posenc.lab.data import Corpus, batch_at, load_corpus
from posenc.lab.errors import CheckpointError, LabError
from posenc.lab.model import GPT, GPTConfig


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. ``batch_size`` is the global batch (split across DDP ranks)."""

    steps: int = 1000
    batch_size: int = 32
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LabError(f"{name}={v!r} must be a positive integer")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise LabError(f"warmup={self.warmup!r} must be an integer >= 0")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise LabError(f"lr={self.lr!r} must be a finite number > 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise LabError(f"min_lr_ratio={self.min_lr_ratio!r} must be in [0, 1]")
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise LabError(
                f"grad_clip={self.grad_clip!r} and weight_decay={self.weight_decay!r} must be >= 0"
            )

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
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


def check_device(device: str) -> torch.device:
    """A torch device from its name, or a clear error when it is malformed or not present."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise LabError(f"device={device!r} is not a device; allowed: cpu, cuda, cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise LabError(f"device={device!r} is not supported; allowed: cpu, cuda, cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LabError(
            f"device={device!r} was requested but CUDA is not available on this machine; use --device cpu"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise LabError(f"device={device!r}: this machine has {torch.cuda.device_count()} cuda device(s)")
    return dev


def _dist_info() -> tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return world, rank, local


def run_state(model_cfg: GPTConfig, train_cfg: TrainConfig, corpus: str) -> dict:
    """What a checkpoint must match to be resumed: model, optimisation and data."""
    return {"model": model_cfg.to_dict(), "train": asdict(train_cfg), "corpus": corpus}


def _check_matches(saved: dict, wanted: dict, path: Path) -> None:
    diffs = []
    for section in ("model", "train", "corpus"):
        a, b = saved.get(section), wanted[section]
        if isinstance(b, dict):
            a = a or {}
            diffs += [
                f"{section}.{k}: checkpoint has {a.get(k)!r}, requested {b[k]!r}"
                for k in b
                if a.get(k) != b[k]
            ]
        elif a != b:
            diffs.append(f"{section}: checkpoint has {a!r}, requested {b!r}")
    if diffs:
        raise CheckpointError(
            f"checkpoint {str(path)!r} was written for a different configuration; resuming would not continue "
            f"the same run: " + "; ".join(diffs)
        )


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[GPT, dict]:
    """A trained model from a run directory or checkpoint directory, in eval mode, and its saved state."""
    device = check_device(str(device))
    ckpt = resolve_checkpoint(path)
    tensors, state, _ = read_checkpoint(ckpt, with_optimizer=False)
    if "model" not in state:
        raise CheckpointError(f"checkpoint {str(ckpt)!r} has no model config in state.json")
    model = GPT(GPTConfig.from_dict(state["model"]))
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {str(ckpt)!r} does not fit its own config: missing {missing}, unexpected {unexpected}"
        )
    return model.to(device).eval(), state


def train(
    model_cfg: GPTConfig,
    train_cfg: TrainConfig,
    out_dir: str | os.PathLike,
    *,
    corpus: Corpus | str | None = None,
    cache_dir: str | os.PathLike | None = None,
    resume: bool = False,
    ckpt_every: int = 100,
    device: str = "cpu",
    progress: bool = True,
    desc: str | None = None,
    stop_after: int | None = None,
    callback=None,
) -> TrainResult:
    """Train a GPT on a corpus, checkpointing to ``out_dir`` every ``ckpt_every`` steps and at the end.

    Args:
        corpus: a loaded :class:`Corpus`, a path, or None for the standard library.
        resume: continue from ``out_dir``'s latest checkpoint (must match both configs and the corpus).
            Without it, a run directory that already holds a checkpoint is an error.
        stop_after: stop (after checkpointing) once this step is reached, as if killed there;
            the schedule still targets ``train_cfg.steps``. For interruption tests and time-boxing.
        callback: optional ``fn(step, loss, tokens_per_s)`` called every 10 steps on rank 0 (progress reports).
        device: "cpu", "cuda" or "cuda:N"; under torchrun with CUDA each rank uses ``cuda:LOCAL_RANK``.

    Returns:
        The trained model (unwrapped), the step reached, logged losses and throughput.
    """
    if isinstance(ckpt_every, bool) or not isinstance(ckpt_every, int) or ckpt_every < 1:
        raise LabError(f"ckpt_every={ckpt_every!r} must be a positive integer")
    world, rank, local = _dist_info()
    if train_cfg.batch_size % world:
        raise LabError(
            f"batch_size={train_cfg.batch_size} must be divisible by the number of processes ({world})"
        )
    dev = check_device(device)
    if dev.type == "cuda" and world > 1:
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    ddp = world > 1
    if ddp and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        # Two processes on a few cores: each gets its share of threads rather than oversubscribing.
        if dev.type == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    if not isinstance(corpus, Corpus):
        corpus = load_corpus(
            corpus, cache_dir=cache_dir, min_train_tokens=model_cfg.max_len + 2, min_val_tokens=1
        )
    out = Path(out_dir)
    wanted = run_state(model_cfg, train_cfg, corpus.path)

    torch.manual_seed(train_cfg.seed)
    model = GPT(model_cfg).to(dev)
    optimizer = make_optimizer(model, train_cfg)
    start = 0
    latest = latest_checkpoint(out)
    if latest is not None and not resume:
        raise LabError(
            f"run directory {str(out)!r} already holds a checkpoint ({latest.name}); pass --resume to continue it "
            f"or choose another --out"
        )
    if resume and latest is not None:
        tensors, state, opt_state = read_checkpoint(latest)
        _check_matches(state, wanted, latest)
        model.load_state_dict(tensors, strict=True)
        optimizer.load_state_dict(opt_state)
        start = int(state["step"])
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.json").write_text(json.dumps(wanted, indent=2))

    net = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    model.train()
    per_rank = train_cfg.batch_size // world
    seq = model_cfg.max_len
    end = train_cfg.steps if stop_after is None else min(train_cfg.steps, stop_after)
    losses: list[tuple[int, float]] = []
    bar = None
    if progress and rank == 0 and end > start:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=end, initial=start, desc=desc or f"train {model_cfg.encoding}", unit="step", leave=True
        )
    t0, tokens = time.perf_counter(), 0
    tps = 0.0
    for step in range(start, end):
        x, y = batch_at(corpus.train, step, batch_size=train_cfg.batch_size, seq_len=seq, seed=train_cfg.seed)
        x, y = (
            x[rank * per_rank : (rank + 1) * per_rank].to(dev),
            y[rank * per_rank : (rank + 1) * per_rank].to(dev),
        )
        for g in optimizer.param_groups:
            g["lr"] = lr_at(step, train_cfg)
        logits = net(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if train_cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        optimizer.step()
        tokens += train_cfg.batch_size * seq
        done = step + 1
        if not math.isfinite(loss.item()):
            raise LabError(
                f"training diverged at step {done}: loss is {loss.item()}; lower --lr (was {train_cfg.lr})"
            )
        if done % 10 == 0 or done == end:
            tps = tokens / max(1e-9, time.perf_counter() - t0)
            losses.append((done, loss.item()))
            if bar is not None:
                bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tps:,.0f}")
            if callback is not None and rank == 0:
                callback(done, loss.item(), tps)
        if bar is not None:
            bar.update(1)
        if done % ckpt_every == 0 or done == end:
            if rank == 0:
                save_checkpoint(out, done, model, optimizer, wanted)
            if ddp:
                dist.barrier()
    if bar is not None:
        bar.close()
    model.eval()
    return TrainResult(model=model, step=max(start, end), losses=losses, tokens_per_s=tps, out_dir=out)


def is_complete(out_dir: str | os.PathLike, steps: int) -> bool:
    """Whether a run directory holds a checkpoint at its final step."""
    latest = latest_checkpoint(out_dir)
    if latest is None:
        return False
    try:
        state = json.loads((latest / "state.json").read_text())
    except (OSError, ValueError):
        return False
    return int(state.get("step", -1)) >= steps


__all__ = ["TrainConfig", "TrainResult", "train", "lr_at", "load_model", "is_complete", "CheckpointError"]
