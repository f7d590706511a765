"""How many tokens an answer may take: never fewer than its expected strings need.

A question's own budget is its task's (RULER's: 128 for a needle, 30 for variable tracking). A protocol may
give less, to decode less where answers go wrong (a right answer stops as soon as it holds every expected
string, so only a wrong one runs to its budget), in one of two ways: an absolute cap for every question
(``--answer-tokens``), refused when some question's expected answer does not fit under it, since its score
would be 0 whatever the model wrote (a UUID is 32 tokens with SmolLM2's tokenizer); or a slack, the tokens
its expected strings take plus ``slack`` for what a model writes around them.
"""

from __future__ import annotations

from dataclasses import replace

__all__ = ["answer_need", "budgeted"]


def answer_need(tokenizer, expected) -> int:
    """The tokens an answer holding every string of ``expected`` takes at least: each after a space."""
    return sum(len(tokenizer(" " + text, add_special_tokens=False)["input_ids"]) for text in expected)


def budgeted(trial, tokenizer, most: int | None = None, slack: int | None = None):
    """``trial`` with each question's answer budget: its task's, at most ``most`` (a ValueError naming
    ``--answer-tokens`` when an expected answer needs more), at most its expected strings' tokens plus
    ``slack`` (None: no such bound)."""
    questions = []
    for q in trial.questions:
        need = answer_need(tokenizer, q.expected)
        budget = q.max_new_tokens
        if most is not None:
            if need > most:
                raise ValueError(
                    f"--answer-tokens {most} cannot hold an answer of {trial.task}: its expected strings "
                    f"take {need} tokens with this tokenizer, so it would score 0 whatever the model wrote; "
                    f"give at least {need}, or leave --answer-tokens out"
                )
            budget = min(budget, most)
        if slack is not None:
            budget = min(budget, need + slack)
        questions.append(replace(q, max_new_tokens=budget))
    return replace(trial, questions=tuple(questions))
