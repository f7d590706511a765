"""``posenc extend --budget``: protocols sized for the machine that runs them.

A budget is the settings a flag does not give: the lengths (as multiples of the trained length N), the
perplexity windows, the tasks and how many haystacks (trials) each gets per length, the methods, the
answers' budgets. Every one of them is replaced by its flag when given. Without ``--budget``
(:func:`default_budget`): N and 2N (on CUDA 4N too), every method the model can run, every task, four
perplexity windows, one haystack per task and length.

- ``quick``: minutes; a smoke test that still runs every task once, at 2048 and 4096 tokens with N taken as
  2048 (the numbers show that everything runs, not how a method extends the model).
- ``cpu``: N and 2N, the six methods most users pick (none, YaRN, dynamic NTK, Llama 3.1, SelfExtend,
  ReRoPE; a model with a per-layer plan takes the methods it can run) and the five tasks that ask many
  questions of one haystack (needles in noise and in real prose, UUID needles among distractors, key-value
  retrieval, variable tracking; the passkey, one question per long forward, is left to the other budgets),
  one perplexity window and one haystack per task and length, each shared by 20 questions: 100 scored
  questions per length from 5 long forwards. An answer may take the tokens its expected strings need plus
  16 (at most the task's own budget, RULER's): a right answer stops as soon as it holds them, so the bound
  only cuts a wrong one short.
- ``gpu``: N, 2N and 4N, every method, three haystacks per task and length.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUDGETS", "Budget", "check_budget", "default_budget"]

CPU_METHODS = ("none", "yarn", "dynamic", "llama3", "selfextend", "rerope")
CPU_TASKS = ("niah_noise", "niah_essay", "niah_multikey", "kv", "vt")
# a model with a per-layer plan takes no remap: the frequency methods on its global layers and the layer
# conversions instead
PLANNED_CPU_METHODS = ("none", "yarn", "dynamic", "llama3", "nope-global", "nope-global-temp")


@dataclass(frozen=True)
class Budget:
    """One protocol. mults: lengths as multiples of the trained length. train_len: the trained length it
    assumes instead of the model's (quick only). windows: perplexity windows per length. trials: haystacks
    per task and length. questions: questions per haystack (None: each task's own). answer_tokens: the most
    tokens an answer may take (None: each task's, RULER's). methods / planned: the
    default methods for a model with one RoPE and for one with a per-layer plan (None: all of them)."""

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


BUDGETS = {
    b.name: b
    for b in (
        Budget(
            "quick",
            "minutes: every task once at 2048 and 4096 tokens, N taken as 2048 (a smoke test)",
            (1, 2),
            windows=1,
            trials=1,
            questions=2,
            answer_slack=8,
            train_len=2048,
            methods=("none", "yarn"),
            planned=("none", "yarn"),
        ),
        Budget(
            "cpu",
            "N and 2N, the six methods most users pick, five tasks of 20 questions, one haystack each",
            (1, 2),
            windows=1,
            trials=1,
            questions=20,
            answer_slack=16,
            tasks=CPU_TASKS,
            methods=CPU_METHODS,
            planned=PLANNED_CPU_METHODS,
        ),
        Budget("gpu", "N, 2N and 4N, every method, three haystacks per task and length", (1, 2, 4), 4, 3),
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
