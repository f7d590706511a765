"""Side-by-side timing helpers."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_times(cases: dict[str, Callable[[], object]], repeat: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each case, ``repeat`` times, run round-robin so that load from other processes
    hits all cases alike."""
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def interleaved_medians(cases: dict[str, Callable[[], object]], repeat: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each case (see :func:`interleaved_times`)."""
    return {name: statistics.median(ts) for name, ts in interleaved_times(cases, repeat, warmup).items()}
