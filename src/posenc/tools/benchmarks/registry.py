"""The benchmarks ``posenc bench`` runs: one :class:`Benchmark` record each, from which its ``--only``
choices and help are made. A new benchmark is a module of :mod:`posenc.tools.benchmarks` with a
``run`` and a table, and one record here (or, outside posenc, a module of one's own and a record added to
:data:`BENCHMARKS` before the command line is built).

A record names its module rather than importing it, so that building the command line imports no torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BENCHMARKS", "Benchmark", "Context"]


@dataclass(frozen=True)
class Context:
    """What every benchmark may read: the device's sizes (:mod:`.presets`), the device, ``--quick``,
    ``--repeat`` and the score-bias lengths of this run."""

    preset: object
    device: object
    quick: bool
    repeat: int | None
    bias_lengths: tuple


@dataclass(frozen=True)
class Benchmark:
    """One part of ``posenc bench``.

    Args:
        name: its ``--only`` choice and its key in the JSON.
        help: what it measures (the ``--only`` help).
        module: its module: a name in :mod:`posenc.tools.benchmarks`, or a dotted import path (a user's own).
        run: ``(module, context) -> rows``.
        table: the module's function that prints the rows.
        by_default: part of a plain ``posenc bench`` (else only with ``--only``: minutes each).
        full_lengths: with ``--only`` it runs the preset's full score-bias lengths.
    """

    name: str
    help: str
    module: str
    run: Callable
    table: str
    by_default: bool = True
    full_lengths: bool = False

    def rows(self, context: Context) -> list:
        return self.run(self._module(), context)

    def format(self, rows: list) -> str:
        return getattr(self._module(), self.table)(rows)

    def _module(self):
        return importlib.import_module(self.module if "." in self.module else f"{__package__}.{self.module}")


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "rope",
            "RoPE against copy bandwidth and transformers' eager code",
            "rope",
            lambda m, c: m.run(c.preset, c.device, c.repeat),
            "rope_table",
        ),
        Benchmark(
            "serving",
            "decode and short-prefill steps",
            "serving",
            lambda m, c: m.run(c.device, c.quick, c.repeat),
            "serving_table",
        ),
        Benchmark(
            "attention",
            "ALiBi attention at long L, time and peak memory",
            "attention",
            lambda m, c: m.run(c.preset, c.device, c.repeat),
            "attention_table",
        ),
        Benchmark(
            "bias",
            "every score bias at L = 2048, 8192 and 16384, forward and forward+backward, with its targets (a "
            "plain CPU run does L = 2048 only)",
            "biases",
            lambda m, c: m.run(c.preset, c.device, c.repeat, c.bias_lengths),
            "bias_table",
            full_lengths=True,
        ),
        Benchmark(
            "remap",
            "SelfExtend, ReRoPE, leaky ReRoPE and STRING at the same lengths against RoPE attention",
            "remaps",
            lambda m, c: m.run(c.preset, c.device, c.repeat, c.bias_lengths),
            "remap_table",
            full_lengths=True,
        ),
        Benchmark(
            "window",
            "sliding-window attention (Gemma 3's shape, window 512) at 4K, 16K and 64K: posenc's windowed "
            "kernel against transformers' SDPA with its mask",
            "windows",
            lambda m, c: m.run(c.device, c.repeat),
            "window_table",
            by_default=False,  # a minute, and the 64K row alone holds gigabytes
        ),
        Benchmark(
            "overhead",
            "a shipped real model's forward through posenc (none) against the unpatched model's own",
            "overhead",
            lambda m, c: m.run(c.device, c.repeat),
            "overhead_table",
            by_default=False,  # minutes: whole-model forwards at 8192 tokens
        ),
        Benchmark(
            "questions",
            "questions over one shared haystack of a shipped real model: one at a time against batched by "
            "length over the shared prefix",
            "questions",
            lambda m, c: m.run(c.device, c.quick),
            "questions_table",
            by_default=False,  # minutes: haystacks of 8K and 16K tokens, forty questions each way
        ),
        Benchmark(
            "ring",
            "context parallelism: causal RoPE attention forward+backward at 4K and 16K on 2 gloo ranks of 1 "
            "thread against one process of 2 threads",
            "ring",
            lambda m, c: m.run(c.repeat),
            "ring_table",
            by_default=False,  # minutes: 16K forward and backward, three ways
        ),
        Benchmark(
            "peers",
            "RoPE against transformers eager and compiled and the other RoPE libraries installed, every "
            "layout and dtype, forward and forward+backward, CPU only",
            "peers",
            lambda m, c: m.run(c.quick, c.repeat),
            "peers_table",
            by_default=False,  # it compiles transformers for every shape and dtype
        ),
        Benchmark(
            "crossover",
            "every table and tile bias materialised against its blocked kernel at short and middle lengths, "
            "the lab's shape and a model's",
            "crossover",
            lambda m, c: m.run(c.quick, c.repeat),
            "crossover_table",
            by_default=False,  # it times every bias at many shapes
        ),
    )
}
