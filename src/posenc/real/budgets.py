"""``posenc extend --budget``: protocols sized for the machine that runs them.

A budget is the settings a flag does not give: the lengths (as multiples of the trained length N), the
perplexity windows, the tasks and how many haystacks (trials) each gets per length, the methods, the
answers' budgets. Every one of them is replaced by its flag when given. Without ``--budget``
(:func:`default_budget`): N and 2N (on CUDA 4N too), every method the model can run, every task, four
perplexity windows, one haystack per task and length.

- ``quick``: minutes; a smoke test that still runs every task once, at 2048 and 4096 tokens with N taken as
  2048 (the numbers show that everything runs, not how a method extends the model).
- ``cpu``: N and 2N, the six methods most users pick (none, YaRN, dynamic NTK, Llama 3.1, SelfExtend,
  ReRoPE; a model with a per-layer plan takes the methods it can run), one perplexity window, and RULER's
  niah_single_1 as RULER defines it (one needle in the noise sentences, one question a haystack), 6
  haystacks per length, the trials of a length sharing their needle-free haystack's forward
  (:mod:`posenc.real.trials`). Up to N only the model as trained answers them, at N/8, N/4, N/2 and N: its
  own baseline (the other methods' cost inside N is their perplexity there); at 2N every method does. An
  answer may take the tokens its expected strings need plus 16 (at most the task's own budget, RULER's): a
  right answer stops as soon as it holds them, so the bound only cuts a wrong one short.
- ``gpu``: N, 2N and 4N, every method, four perplexity windows, RULER's niah_single_1/2/3 and
  niah_multikey_1 with 5 haystacks per task and length, the ladder below N (sized for a device check of
  minutes; ``--trials`` and ``--tasks`` take it further).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUDGETS", "Budget", "check_budget", "default_budget"]

CPU_METHODS = ("none", "yarn", "dynamic", "llama3", "selfextend", "rerope")
CPU_TASKS = ("niah_single_1",)
GPU_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1")
LADDER = (1 / 8, 1 / 4, 1 / 2)  # N/8, N/4, N/2: the model's own baseline below its trained length
# a model with a per-layer plan takes no remap: the frequency methods on its global layers and the layer
# conversions instead
CPU_TRIALS = 6  # haystacks (one question each) per task and length: what two hours hold on 2 cores
PLANNED_CPU_METHODS = ("none", "yarn", "dynamic", "llama3", "nope-global", "nope-global-temp")


@dataclass(frozen=True)
class Budget:
    """One protocol. mults: lengths as multiples of the trained length. train_len: the trained length it
    assumes instead of the model's (quick only). windows: perplexity windows per length. trials: haystacks
    per task and length. questions: questions per haystack (None: each task's own). answer_tokens: the most
    tokens an answer may take (None: each task's, RULER's). methods / planned: the
    default methods for a model with one RoPE and for one with a per-layer plan (None: all of them). ladder:
    shorter lengths, as fractions of the trained length, where the model as trained answers the tasks alone:
    its own baseline, against which its effective length is read. baseline_within: up to the trained
    length only the model as trained answers the tasks (the others' cost there is their perplexity)."""

    name: str
    summary: str
    mults: tuple[int, ...]
    windows: int
    trials: int
    questions: int | None = None
    answer_tokens: int | None = None
    answer_slack: int | None = None
    tasks: tuple[str, ...] | None = None
    train_len: int | None = None
    methods: tuple[str, ...] | None = None
    planned: tuple[str, ...] | None = None
    ladder: tuple[float, ...] = ()
    baseline_within: bool = False


BUDGETS = {
    b.name: b
    for b in (
        Budget(
            "quick",
            "minutes: every task once at 2048 and 4096 tokens, N taken as 2048 (a smoke test)",
            (1, 2),
            windows=1,
            trials=1,
            answer_slack=8,
            train_len=2048,
            methods=("none", "yarn"),
            planned=("none", "yarn"),
        ),
        Budget(
            "cpu",
            "N and 2N, the six methods most users pick, RULER's niah_single_1; the model alone at N/8..N",
            (1, 2),
            windows=1,
            trials=CPU_TRIALS,
            answer_slack=16,
            tasks=CPU_TASKS,
            methods=CPU_METHODS,
            planned=PLANNED_CPU_METHODS,
            ladder=LADDER,
            baseline_within=True,
        ),
        Budget(
            "gpu",
            "N, 2N and 4N, every method, RULER's four single-query NIAH tasks x 5; the model alone below N",
            (1, 2, 4),
            4,
            5,
            tasks=GPU_TASKS,
            ladder=LADDER,
        ),
    )
}
"""name -> :class:`Budget`."""


def check_budget(name: str | None) -> Budget | None:
    """The budget called ``name`` (None: none, the flags' own defaults); a ValueError naming ``--budget``
    otherwise."""
    if name is None:
        return None
    if name not in BUDGETS:
        raise ValueError(f"--budget {name!r} is not a budget; choose from {', '.join(BUDGETS)}")
    return BUDGETS[name]


def default_budget(cuda: bool) -> Budget:
    """What a run without ``--budget`` measures (module docstring)."""
    mults = (1, 2, 4) if cuda else (1, 2)
    return Budget("default", "every method the model can run, N to 2N (4N on CUDA)", mults, 4, 1)
