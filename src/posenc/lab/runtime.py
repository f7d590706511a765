"""Where the laboratory runs: the torch device, and this process's place in a ``torchrun`` launch.

Data parallel: launched with ``torchrun`` (``WORLD_SIZE`` > 1), every process joins one process group,
backend gloo on CPU and nccl on CUDA, and on CUDA each uses the GPU ``cuda:LOCAL_RANK``.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from posenc.lab.errors import LabError
from posenc.runs import devices as runs_devices


def check_device(device: str) -> torch.device:
    """A torch device from its name (:func:`posenc.runs.devices.check_device`), a LabError when it is
    malformed or not present."""
    try:
        return runs_devices.check_device(device)
    except ValueError as e:
        raise LabError(str(e)) from None


@dataclass(frozen=True)
class Processes:
    """This process in a launch: ``world`` processes, of which it is ``rank`` (``local_rank`` on its host).

    Without torchrun: one process, rank 0.
    """

    world: int = 1
    rank: int = 0
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Processes:
        """Read the variables torchrun sets (WORLD_SIZE, RANK, LOCAL_RANK)."""
        env = os.environ
        return cls(
            int(env.get("WORLD_SIZE", "1")), int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
        )

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def start(self, device: str) -> torch.device:
        """The device this process works on; under torchrun, first joins the process group."""
        dev = check_device(device)
        if dev.type == "cuda" and self.distributed:
            dev = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(dev)
        if self.distributed and not dist.is_initialized():
            dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
            # Several processes on a few cores: each gets its share of threads rather than oversubscribing.
            if dev.type == "cpu":
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.world))
        return dev


def worker_init(threads: int, parent: int) -> None:
    """A compare worker process: ``threads`` torch threads, and it ends when the compare process does."""
    torch.set_num_threads(threads)
    exit_with_parent(parent)


def exit_with_parent(parent: int, every: float = 0.5) -> None:
    """End this process once ``parent`` (the compare process) is gone, however it died (a background
    thread checks every ``every`` s).

    A killed compare would otherwise leave its workers training and writing into ``--out``, where a
    restarted compare would resume from their checkpoints, and its queue's manager waiting forever.
    Checkpoints are written atomically, so stopping at any moment loses at most one interval.
    """

    def watch():
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
