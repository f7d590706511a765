"""Checkpoints that survive a kill at any moment, and loading a trained model from one.

Layout of a run directory::

    <out>/checkpoints/step-000200/   model.safetensors, optimizer.pt, state.json, manifest.json
    <out>/checkpoints/latest         the name of the newest complete checkpoint directory

A checkpoint is written into a temporary directory, each file fsynced, the directory renamed into
place (``os.replace``), and only then is ``latest`` replaced (write a temporary file, fsync,
``os.replace``). A kill before the rename leaves a stray ``*.tmp`` directory that is ignored and
cleaned up; a kill after it leaves a complete checkpoint. ``manifest.json`` holds the SHA-256 of
every other file, so a checkpoint damaged later (disk, copy, hand edit) is reported, never loaded.

``state.json`` holds the run state (:func:`run_state`: model config, optimisation settings, corpus) and
the step; a run is resumed only from a checkpoint whose run state matches (:func:`check_resumable`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, fields
from pathlib import Path

import torch

from posenc.lab.config import GPTConfig, TrainConfig
from posenc.lab.errors import CheckpointError
from posenc.lab.model import GPT
from posenc.lab.runtime import check_device
from posenc.runs.files import file_sha256, fsync_dir, write_text_atomic

_FILES = ("model.safetensors", "optimizer.pt", "state.json")


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def checkpoint_root(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / "checkpoints"


def save_checkpoint(
    out_dir: str | os.PathLike,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    state: dict,
    keep: int = 1,
) -> Path:
    """Write a complete checkpoint for ``step`` atomically and point ``latest`` at it.

    Args:
        state: JSON-able run state (step, configs); ``step`` is added.
        keep: how many complete checkpoints to keep (older ones are deleted after ``latest`` moves).

    Returns:
        The checkpoint directory.
    """
    root = checkpoint_root(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:07d}"
    final = root / name
    from safetensors.torch import save_file  # the lab's optional dependency, imported when used

    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f"{name}.", suffix=".tmp"))
    try:
        tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
        save_file(tensors, tmp / "model.safetensors")
        torch.save(optimizer.state_dict() if optimizer is not None else {}, tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=2, sort_keys=True))
        manifest = {f: file_sha256(tmp / f) for f in _FILES}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        for f in (*_FILES, "manifest.json"):
            _fsync_file(tmp / f)
        if final.exists():  # the same step saved twice (e.g. a resumed run's final save)
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(root / "latest", name + "\n")
    complete = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in complete[:-keep] if keep > 0 else []:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    for stray in root.glob("step-*.tmp"):
        shutil.rmtree(stray, ignore_errors=True)
    return final


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint directory of a run, or None when there is none.

    ``latest`` names it; without that pointer (lost, or deleted by hand) the step directories themselves
    tell: each is renamed into place only once complete, so the highest step is the newest checkpoint.
    """
    root = checkpoint_root(out_dir)
    pointer = root / "latest"
    if pointer.exists():
        path = root / pointer.read_text().strip()
        if not path.is_dir():
            raise CheckpointError(
                f"checkpoint pointer {str(pointer)!r} names {str(path)!r}, which does not exist"
            )
        return path
    steps = [p for p in root.glob("step-*") if p.is_dir() and p.name[5:].isdigit()] if root.is_dir() else []
    return max(steps, key=lambda p: int(p.name[5:]), default=None)


def read_checkpoint(
    path: str | os.PathLike, *, with_optimizer: bool = True
) -> tuple[dict, dict, dict | None]:
    """Verify and read a checkpoint directory: ``(tensors, state, optimizer_state)``.

    Raises:
        CheckpointError: a file is missing or its hash does not match the manifest, or it does not parse.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not exist (expected a directory with model.safetensors)"
        )
    remedy = (
        f"; delete {str(path)!r} to go back to the run's previous checkpoint, or the run directory to "
        "train it again"
    )
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt or incomplete: manifest.json unreadable ({e}){remedy}"
        ) from e
    for f in _FILES:
        if not (path / f).exists():
            raise CheckpointError(f"checkpoint {str(path)!r} is incomplete: {f} is missing{remedy}")
        if file_sha256(path / f) != manifest.get(f):
            raise CheckpointError(
                f"checkpoint {str(path)!r} is corrupt: {f} does not match its SHA-256 in manifest.json"
                + remedy
            )
    try:
        tensors = load_file(path / "model.safetensors")
        state = json.loads((path / "state.json").read_text())
        opt = torch.load(path / "optimizer.pt", weights_only=True) if with_optimizer else None
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {e}{remedy}") from e
    return tensors, state, opt


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """Accept a run directory (uses its latest checkpoint) or a checkpoint directory."""
    path = Path(path)
    if (path / "manifest.json").exists():
        return path
    latest = latest_checkpoint(path) if path.is_dir() else None
    if latest is None:
        raise CheckpointError(
            f"no checkpoint at {str(path)!r}: expected a run directory written by `posenc train` "
            f"(with checkpoints/latest) or a checkpoint directory (with manifest.json)"
        )
    return latest


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


# TrainConfig's fields added after the first checkpoints were written: left out of the run state at their
# defaults, so that those checkpoints still resume
_LATER_FIELDS = (
    "copy_fraction",
    "passkey_fraction",
    "mix",
    "answer_weight",
    "seq_len",
    "init_from",
    "first_batch",
)
_DEFAULTS = {f.name: f.default for f in fields(TrainConfig)}


def run_state(model_cfg: GPTConfig, train_cfg: TrainConfig, corpus: str) -> dict:
    """What a checkpoint must match to be resumed: model, optimisation and data."""
    train = asdict(train_cfg)
    for optional in _LATER_FIELDS:
        if train[optional] == _DEFAULTS[optional]:
            del train[optional]  # the default: checkpoints written before the field existed still match
    return {"model": model_cfg.to_dict(), "train": train, "corpus": corpus}


def check_resumable(saved: dict, wanted: dict, path: Path) -> None:
    """Refuse to resume from checkpoint ``path`` when its run state differs from ``wanted``, naming each
    difference."""
    diffs = []
    for section in ("model", "train", "corpus"):
        a, b = saved.get(section), wanted[section]
        if isinstance(b, dict):
            a = a or {}
            keys = [*b, *(k for k in a if k not in b)]  # a setting only the checkpoint has counts too
            diffs += [
                f"{section}.{k}: checkpoint has {a.get(k)!r}, requested {b.get(k)!r}"
                for k in keys
                if a.get(k) != b.get(k)
            ]
        elif a != b:
            diffs.append(f"{section}: checkpoint has {a!r}, requested {b!r}")
    if diffs:
        raise CheckpointError(
            f"checkpoint {str(path)!r} was written for a different configuration; resuming would not "
            f"continue the same run: " + "; ".join(diffs)
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
            f"checkpoint {str(ckpt)!r} does not fit its own config: "
            f"missing {missing}, unexpected {unexpected}"
        )
    return model.to(device).eval(), state
