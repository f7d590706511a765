"""The device a run asks for, checked before any work."""

from __future__ import annotations

import torch

__all__ = ["check_device"]


def check_device(device: str) -> torch.device:
    """A torch device from its name; a ValueError naming it when it is malformed, not a CPU or CUDA device,
    or not present on this machine."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is not a device; allowed: cpu, cuda, cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not supported; allowed: cpu, cuda, cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r} was requested but CUDA is not available on this machine; use --device cpu"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: this machine has {torch.cuda.device_count()} cuda device(s)")
    return dev
