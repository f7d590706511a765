"""What software and machine a run used: versions, the git revision, platform, device, CPUs, command."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

import posenc

__all__ = ["environment", "git_revision"]


def git_revision(path: str | Path | None = None) -> dict | None:
    """``{"commit", "dirty"}`` of the git checkout holding ``path`` (default: posenc's own source), or None
    when it is not in a checkout (an installed wheel) or git is not available."""
    where = Path(path) if path is not None else Path(posenc.__file__).resolve().parent

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10, check=True
        )
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        # Uncommitted changes to tracked files mean the commit alone does not reproduce the run.
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def _device_name(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    return platform.processor() or platform.machine()


def environment(device: str) -> dict:
    """The software and machine a run used: versions, git revision, platform, device, CPU count, command."""
    return {
        "posenc": posenc.__version__,
        "git": git_revision(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "device": device,
        "device_name": _device_name(device),
        "cpu_count": os.cpu_count(),
        "command": sys.argv,
    }
