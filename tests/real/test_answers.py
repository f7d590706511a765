"""Answer budgets (posenc.real.tasks.answers): never below what the expected strings take; a cap that
cannot hold them is refused by name; a slack bounds a budget by the expected answer."""

import pytest

from posenc.real.tasks import make_trials
from posenc.real.tasks.answers import answer_need, budgeted

from .fake_tokenizer import CharTokenizer

TOK = CharTokenizer()


def test_the_need_is_every_expected_string_after_a_space():
    assert answer_need(TOK, ("ab", "cde")) == len(" ab") + len(" cde")


@pytest.mark.parametrize("task", ["kv", "niah_multivalue", "vt"])
def test_budgets_hold_every_expected_answer(task):
    trial = make_trials(task, TOK, 6000, 1, seed=3, questions=3)[0]
    needs = [answer_need(TOK, q.expected) for q in trial.questions]
    tight = budgeted(trial, TOK, slack=2)
    assert [q.max_new_tokens for q in tight.questions] == [
        min(q.max_new_tokens, n + 2) for q, n in zip(trial.questions, needs, strict=True)
    ]
    capped = budgeted(trial, TOK, most=max(needs))
    assert all(n <= q.max_new_tokens <= max(needs) for q, n in zip(capped.questions, needs, strict=True))
    with pytest.raises(ValueError, match=f"--answer-tokens {max(needs) - 1} cannot hold an answer of {task}"):
        budgeted(trial, TOK, most=max(needs) - 1)
