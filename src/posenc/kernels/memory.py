"""Output buffers for the CPU kernels: large ones are advised onto transparent huge pages.

A fresh multi-MiB CPU tensor is backed by new pages that fault in one 4 KiB page at a time on first
write, which can cost more than the rotation itself; ``madvise(MADV_HUGEPAGE)`` on the untouched
buffer lets Linux back it with 2 MiB pages instead (measurements: docs/fast-paths.md). It only
affects that buffer, and is skipped where unavailable.
"""

from __future__ import annotations

import ctypes
import functools
import sys

import torch

__all__ = ["empty_output"]

_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # Linux
_HUGE_MIN_BYTES = 4 << 20


@functools.cache
def _madvise():
    """libc's madvise, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def empty_output(x: torch.Tensor) -> torch.Tensor:
    """``torch.empty_like(x)``; on the CPU, outputs of 4 MiB and more are advised onto huge pages."""
    out = torch.empty_like(x)
    if out.device.type != "cpu" or out.nbytes < _HUGE_MIN_BYTES:
        return out
    madvise = _madvise()
    if madvise is not None:
        start = -(-out.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
        end = (out.data_ptr() + out.nbytes) // _HUGE_PAGE * _HUGE_PAGE
        if end > start:
            madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: a failure changes nothing
    return out
