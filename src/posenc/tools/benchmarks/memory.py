"""Memory a benchmark may use, and the peak that calls added, on the CPU or a CUDA device.

CUDA: ``torch.cuda.max_memory_allocated`` after a reset of the peak statistics, exact per allocation.
CPU: the allocator keeps no per-call peak, so the process's resident-set high-water mark is used: reset
it (``VmHWM``, by writing 5 to ``/proc/self/clear_refs``, Linux >= 4.0) and read ``VmHWM`` minus the
resident set at the reset. Where the reset is not allowed it falls back to the rise of ``ru_maxrss``,
which cannot see below the high-water mark reached before (imports, inputs).
"""

from __future__ import annotations

import resource
from collections.abc import Callable

import torch

_UNKNOWN_AVAILABLE = 8 << 30


def available_bytes(device: torch.device) -> int:
    """Memory free for a benchmark now: free device memory on CUDA, ``MemAvailable`` on the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return _UNKNOWN_AVAILABLE


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_resident_peak() -> bool:
    """Reset this process's peak resident set to the current one; False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _status_bytes("VmHWM")
        return True
    except (OSError, KeyError):
        return False


def _max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_meter(device: torch.device) -> Callable[[], int]:
    """Start measuring; the returned function gives the bytes that were added at the peak since then."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        return lambda: torch.cuda.max_memory_allocated(device) - base
    if _reset_resident_peak():
        base = _status_bytes("VmRSS")
        return lambda: max(0, _status_bytes("VmHWM") - base)
    base = _max_rss()
    return lambda: max(0, _max_rss() - base)
