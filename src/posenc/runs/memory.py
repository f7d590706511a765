"""Memory a benchmark may use, and the peak that work added, on the CPU or a CUDA device.

:func:`peak_meter` (the benchmarks): CUDA: ``torch.cuda.max_memory_allocated`` after a reset of the peak
statistics, exact per allocation. CPU: the allocator keeps no per-call peak, so the process's resident-set
high-water mark is used: reset it (``VmHWM``, by writing 5 to ``/proc/self/clear_refs``, Linux >= 4.0) and
read ``VmHWM`` minus the resident set at the reset. Where the reset is not allowed it falls back to the rise
of ``ru_maxrss``, which cannot see below the high-water mark reached before (imports, inputs).

:func:`measured_peak` (``posenc extend``'s cells): on the CPU, the peak of the bytes of the tensor storages
the work creates and keeps alive at once, counted as operators return them, so the same work measures the
same whatever the allocator kept from earlier work; on CUDA, as :func:`peak_meter`.
"""

from __future__ import annotations

import contextlib
import resource
import weakref
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["available_bytes", "measured_peak", "peak_meter"]

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


class _LiveTensorBytes(TorchDispatchMode):
    """Every tensor storage that an operator creates while active, counted until it is freed: the peak of
    the bytes alive at once (``peak``). Storages made before (weights, inputs) are not counted."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def _freed(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            key, nbytes = id(storage), storage.nbytes()
            if key not in self.live:
                self.live[key] = 0
                weakref.finalize(storage, self._freed, key)  # torch keeps one Python object per storage
            if nbytes > self.live[key]:  # new, or resized in place (an out= argument grown)
                self.now += nbytes - self.live[key]
                self.live[key] = nbytes
        self.peak = max(self.peak, self.now)
        return out


@contextlib.contextmanager
def measured_peak(device: torch.device) -> Iterator[Callable[[], int]]:
    """The peak bytes the work inside the block added, read from the function yielded once it is done.

    CUDA: ``torch.cuda.max_memory_allocated`` above what was allocated at the start. CPU: the peak of the
    bytes of the tensor storages created in the block and alive at once, each operator's outputs counted
    as it returns them and freed when torch frees them; the same work gives the same figure whatever the
    allocator kept from earlier work (the resident set's growth does not: freed memory the allocator
    reuses never shows). Scratch memory a kernel takes and returns inside one operator is not seen.
    """
    if device.type == "cuda":
        meter = peak_meter(device)
        yield meter
        return
    with _LiveTensorBytes() as counter:
        yield lambda: counter.peak
