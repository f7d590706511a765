"""What ``posenc extend`` measures, declared once: :class:`ExtendSettings`, each field with its default, its
flag's type and its help (:func:`posenc.runs.flags.option`), so that the command line is generated from the
fields (:mod:`posenc.real.commands`) and the library and the command take and check the same settings
(:func:`check_settings`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from posenc import cli
from posenc.real.layers import DEFAULT_LAYERS, LAYER_SETS
from posenc.runs.flags import flag_of, option

__all__ = ["NO_TASKS", "ExtendSettings", "check_settings", "ladder_list"]

NO_TASKS = ("none",)  # --tasks none: perplexity (and the passkey prompts) only


def ladder_list(text: str) -> list[int]:
    """An argparse ``type``: ``none`` (no ladder), or lengths as :func:`posenc.cli.int_list` takes them."""
    return [] if text.strip() == "none" else cli.int_list(text)


def _budgets() -> str:
    from posenc.real.budgets import BUDGETS

    return (
        "the protocol that sizes what no flag gives: "
        + "; ".join(f"{b.name}: {b.summary}" for b in BUDGETS.values())
        + " (default: every method the model can run, the trained length and 2x (4x too on CUDA), 4 "
        "windows, one haystack per task)"
    )


def _budget_names() -> list[str]:
    from posenc.real.budgets import BUDGETS

    return list(BUDGETS)


def _tasks() -> str:
    from posenc.real.tasks import TASKS

    return (
        "comma-separated long-context tasks, or none: "
        + "; ".join(f"{name}: {t.title}" for name, t in TASKS.items())
        + " (default: every task but the many-needle variants niah_noise, niah_essay, niah_multikey)"
    )


@dataclass(frozen=True)
class ExtendSettings:
    """What ``posenc extend`` measures. None means: the budget's, or derived from the model
    (:func:`posenc.real.extend.resolve`). Each field's meaning is its flag's help (``posenc extend
    --help``); ``chat``: ask in the model's chat template when it has one (the flag ``--no-chat-template``
    clears it)."""

    budget: str | None = option(None, help=_budgets, choices=_budget_names)
    methods: tuple[str, ...] | None = option(
        None,
        type=cli.name_list,
        help="comma-separated methods to compare; an entry may name its layers (yarn@global, yarn@all, "
        "yarn@every:4, yarn@5/11) or mix methods on disjoint layers (pi+nope-global) (default: the budget's)",
    )
    layers: str = option(
        DEFAULT_LAYERS,
        help=f"the layers a frequency method changes unless its entry names some: {LAYER_SETS} (default: "
        "global, the full-attention layers: every layer of a model without sliding windows)",
    )
    lengths: tuple[int, ...] | None = option(
        None,
        type=cli.int_list,
        help="lengths in tokens, comma-separated (default: the budget's multiples of the trained length)",
    )
    windows: int | None = option(
        None, type=cli.positive_int, help="perplexity windows per length (default: the budget's)"
    )
    ladder: tuple[int, ...] | None = option(
        None,
        type=ladder_list,
        help="shorter lengths in tokens, comma-separated, where the model as trained (method none) answers "
        "the tasks alone: its own baseline for the effective length; none for no ladder (default: the "
        "budget's, N/8, N/4 and N/2 for cpu and gpu)",
    )
    tasks: tuple[str, ...] | None = option(None, type=cli.name_list, help=_tasks)
    trials: int | None = option(
        None, type=cli.positive_int, help="haystacks per task and length (default: the budget's)"
    )
    questions: int | None = option(
        None,
        type=cli.positive_int,
        help="questions per haystack, each a short continuation of its one forward (default: each task's)",
    )
    answer_tokens: int | None = option(
        None,
        type=cli.positive_int,
        help="the most tokens an answer may take, refused below what a task's expected answer takes; an "
        "answer that holds every expected string stops there anyway (default: the budget's bound, else "
        "each task's, RULER's)",
    )
    passkey_trials: int = option(
        0,
        type=cli.count,
        help="teacher-forced passkey prompts per length, one forward each (default 0: the passkey task of "
        "--tasks asks the same)",
    )
    corpus: str | None = option(
        None,
        help="a text file, or a folder whose text files are the documents (default: this Python's standard "
        "library, whose longest files hold 16K- and 32K-token windows)",
    )
    train_len: int | None = option(
        None,
        type=cli.positive_int,
        help="the trained length the factor is counted from (default: the config's "
        "original_max_position_embeddings, else max_position_embeddings)",
    )
    factor: float | None = option(
        None, type=float, help="the extension factor (default: the longest length / the trained length)"
    )
    score_tokens: int | None = option(
        None,
        type=cli.positive_int,
        help="final tokens of each window that every length scores (default: min(1024, shortest length / 8))",
    )
    short_tokens: int | None = option(
        None,
        type=cli.positive_int,
        help="first tokens of the windows at the trained length scored as a short prompt (default: 1024)",
    )
    seed: int = option(0, type=cli.seed, help="the tasks' haystacks, keys and depths")
    chat: bool = True


# the least value of each integer setting (a list's least entry for a list); the flag names the setting
_LEAST = {
    "lengths": 16,
    "ladder": 16,
    "windows": 1,
    "trials": 1,
    "questions": 1,
    "answer_tokens": 1,
    "passkey_trials": 0,
    "train_len": 1,
    "score_tokens": 1,
    "short_tokens": 1,
    "seed": 0,
}


def _flag(name: str) -> str:
    return flag_of(ExtendSettings, name).option_string(name)


def _check_int(name: str, value) -> None:
    """``value`` (or each of a list's values) an integer at least ``_LEAST[name]``; a ValueError naming the
    flag, the value and what is allowed."""
    for v in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(v, bool) or not isinstance(v, int) or v < _LEAST[name]:
            raise ValueError(f"{_flag(name)} must be an integer >= {_LEAST[name]}, got {v!r}")


def check_settings(settings: ExtendSettings) -> None:
    """The checks that need no model, so that a bad flag is refused before the model loads."""
    from posenc.real.budgets import check_budget
    from posenc.real.layers import parse_method
    from posenc.real.methods import EXTEND_METHODS
    from posenc.real.tasks import check_tasks

    check_budget(settings.budget)
    methods = settings.methods
    if methods is not None:
        if not methods:
            raise ValueError(f"--methods is empty; choose from {', '.join(EXTEND_METHODS)}")
        if len(set(methods)) != len(methods):
            raise ValueError(f"--methods names a method twice: {list(methods)}")
        for m in methods:  # the one reader of an entry's grammar
            parse_method(m)
    if settings.lengths is not None and not settings.lengths:
        raise ValueError("--lengths is empty; give token counts like 8192,16384")
    for name in _LEAST:
        value = getattr(settings, name)
        if value is not None:
            _check_int(name, value)
    if settings.tasks is not None and tuple(settings.tasks) != NO_TASKS:
        check_tasks(settings.tasks)
    f = settings.factor
    if f is not None and not (isinstance(f, (int, float)) and math.isfinite(f) and f >= 1):
        raise ValueError(f"--factor must be a finite number >= 1, got {f!r}")
