"""posenc.real.tasks with SmolLM2's own tokenizer (skipped without it, as the other real-model tests):
exact lengths in its tokens, the decoded text holding what each trial expects where it says, the minimum
length, and haystacks tokenized as their whole decoded text would be."""

import pytest

from posenc.real.tasks import TASKS, make_trials, min_length

from .task_checks import check_trial

ITEMS = {
    "niah_multikey": 60,
    "niah_multikey_2": 60,
    "niah_multikey_3": 90,  # less than one UUID needle line
    "kv": 60,
    "cwe": 8,
    "fwe": 8,
}  # tokens of whitespace a haystack of units may end with


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return smollm2.tokenizer


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("chat", [True, False])
def test_every_task_fills_smollm2s_length_and_holds_what_it_expects(tokenizer, task, chat):
    for trial in make_trials(task, tokenizer, 3000, 2, seed=11, chat=chat):
        check_trial(trial, tokenizer.decode)
        if chat:
            assert tokenizer.decode(trial.prefix).startswith("<|im_start|>system")
            assert all("<|im_start|>assistant\n" in tokenizer.decode(q.ids) for q in trial.questions)


def _common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("task", list(TASKS))
def test_a_haystack_is_the_tokens_of_its_own_text(tokenizer, task):
    """Needles and units tokenized alone are the tokens the decoded haystack has, but for the whitespace
    that fills a haystack of units to its length."""
    (trial,) = make_trials(task, tokenizer, 4000, 1, seed=2)
    ids = list(trial.prefix[trial.haystack_at :])
    again = tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"]
    same = _common(ids, again) + _common(ids[::-1], again[::-1])
    assert same >= len(ids) - ITEMS.get(task, 0)


def test_the_common_words_take_rulers_counts_where_the_length_allows(tokenizer):
    (trial,) = make_trials("cwe", tokenizer, 8192, 1, seed=0)
    assert check_trial(trial, tokenizer.decode) == ({30}, {3})
    (short,) = make_trials("cwe", tokenizer, 2048, 1, seed=0)
    common, uncommon = check_trial(short, tokenizer.decode)
    assert len(common) == len(uncommon) == 1 and common.pop() > uncommon.pop()


@pytest.mark.parametrize("task", list(TASKS))
def test_smollm2s_minimum_length_is_taken_and_one_less_refused(tokenizer, task):
    least = min_length(task, tokenizer)
    for seed in range(3):
        (trial,) = make_trials(task, tokenizer, least, 1, seed=seed)
        assert len(trial.prefix) + max(len(q.ids) + q.max_new_tokens for q in trial.questions) == least
    with pytest.raises(ValueError, match=rf"{task}: length {least - 1} is too short"):
        make_trials(task, tokenizer, least - 1, 1, seed=0)
