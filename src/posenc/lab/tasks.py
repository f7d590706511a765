"""A comparison's units of work (:mod:`posenc.lab.compare` schedules them): each :class:`Task` trains or
follows up one model, and every task of a comparison shares one :class:`Comparison`. Both are frozen records
that a worker process receives whole."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from posenc.lab.config import Settings
from posenc.lab.errors import LabError

__all__ = ["Comparison", "Task"]


def _folder_name(scheme: str) -> str:
    """A folder name for ``scheme``: a user's ``path/to/file.py:fn`` would otherwise leave ``--out``."""
    return re.sub(r"[^A-Za-z0-9_.:+-]", "_", scheme)


@dataclass(frozen=True)
class Task:
    """One task of a comparison; its result is one seed's row of the report.

    Train ``scheme`` with ``seed`` and evaluate it; or, a follow-up of that task, evaluate the trained model
    with the eval-time ``extension``, or continue it by the extension ``recipe`` (posenc.lab.recipes) and
    evaluate that. At most one of ``extension`` and ``recipe``.
    """

    scheme: str
    seed: int
    extension: str | None = None
    recipe: str | None = None

    def __post_init__(self):
        if self.extension is not None and self.recipe is not None:
            raise LabError(
                f"Task(extension={self.extension!r}, recipe={self.recipe!r}): a task evaluates a trained "
                "model with an eval-time extension or continues it by a recipe, not both"
            )

    @property
    def name(self) -> str:
        """The row's name: ``<scheme>``, ``<scheme>+<extension>`` or ``<scheme>~<recipe>``."""
        return (
            self.scheme
            + (f"+{self.extension}" if self.extension else "")
            + (f"~{self.recipe}" if self.recipe else "")
        )

    def label(self, s: Settings) -> str:
        """What the progress display calls the task: the row's name, and its seed when there are several."""
        return self.name if s.seeds == 1 else f"{self.name}/s{self.seed}"

    def base_run(self, out: str | os.PathLike) -> Path:
        """The run directory of the model of ``scheme`` and ``seed``: ``models/<scheme>/seed-<seed>/``."""
        return Path(out) / "models" / _folder_name(self.scheme) / f"seed-{self.seed}"

    def run_dir(self, out: str | os.PathLike, s: Settings) -> Path:
        """The run directory of this task's model: a recipe's has one per target and steps inside the base
        run's, so that other recipe settings train another model and never resume this one."""
        base = self.base_run(out)
        return base / f"recipe-{self.recipe}-x{s.extend_to}-{s.extend_steps}steps" if self.recipe else base


@dataclass(frozen=True)
class Comparison:
    """What every task of one comparison shares: its settings, output folder, corpus, device, compile, and
    the processes that share each sequence while training (``context_parallel``)."""

    settings: Settings
    out: str
    corpus: str | None
    cache_dir: str | None
    device: str
    compile: bool | str
    context_parallel: int = 1
