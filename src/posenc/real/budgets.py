"""``posenc extend --budget``: protocols sized for the machine that runs them.

A budget is the settings a flag does not give: the lengths (as multiples of the trained length N), the
perplexity windows, the tasks and how many haystacks (trials) each gets per length, the methods. Every one
of them is replaced by its flag when given. Without ``--budget`` (:func:`default_budget`): N and 2N (on
CUDA 4N too), every method the model can run, four perplexity windows, one haystack per task and length.

- ``quick``: minutes; a smoke test that still runs every task once, at 2048 and 4096 tokens with N taken as
  2048 (the numbers show that everything runs, not how a method extends the model).
- ``cpu``: N and 2N, the six methods most users pick (none, YaRN, dynamic NTK, Llama 3.1, SelfExtend,
  ReRoPE; a model with a per-layer plan takes the methods it can run), one perplexity window and one
  haystack per task and length, each shared by up to 12 questions: on SmolLM2-135M 100 scored questions per
  length from 11 long forwards. An answer may take 48 tokens (RULER gives needle tasks 128; an answer
  that holds every expected string stops early anyway, so the cap only cuts a wrong answer short).
- ``gpu``: N, 2N and 4N, every method, three haystacks per task and length.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUDGETS", "Budget", "check_budget", "default_budget"]

CPU_METHODS = ("none", "yarn", "dynamic", "llama3", "selfextend", "rerope")
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
            answer_tokens=32,
            train_len=2048,
            methods=("none", "yarn"),
            planned=("none", "yarn"),
        ),
        Budget(
            "cpu",
            "N and 2N, the six methods most users pick, one haystack per task and length",
            (1, 2),
            windows=1,
            trials=1,
            questions=12,
            answer_tokens=48,
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
