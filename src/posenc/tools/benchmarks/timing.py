"""Timing shared by every benchmark: cases run round-robin, synchronised on CUDA; a busy neighbour for the
load-robustness rows."""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch


def interleaved_times(
    cases: dict[str, Callable[[], object]],
    repeat: int,
    warmup: int = 1,
    device: torch.device | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of each case, ``repeat`` times each, after ``warmup`` untimed rounds.

    The cases run round-robin so that load from other processes hits all of them alike. On a CUDA
    ``device`` every call is followed by a synchronisation, so a time covers the kernels it launched.
    """
    cuda = device is not None and device.type == "cuda"

    def sync() -> None:
        if cuda:  # kernels run asynchronously: wait, or the time is only the launch
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        for fn in cases.values():
            fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """The median of each case's times (seconds)."""
    return {name: statistics.median(ts) for name, ts in times.items()}


def bests(times: dict[str, list[float]]) -> dict[str, float]:
    """Each case's fastest call (seconds): how much of the median is other processes' load."""
    return {name: min(ts) for name, ts in times.items()}


@contextlib.contextmanager
def busy_neighbour():
    """Inside, a second process spins on one core (the first the scheduler lets it have): what a machine
    with a dataloader worker or another job looks like to a kernel. Ended on the way out, whatever happens."""
    spin = "import os\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\nwhile True:\n    pass\n"
    child = subprocess.Popen(
        [sys.executable, "-c", spin], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(0.2)  # let it reach its loop
        yield child
    finally:
        child.kill()
        child.wait()
