"""posenc.real.passkey: prompts of exactly the asked length, the needle where its depth says, at a sentence
start, the answer the key's own tokens."""

import pytest

from posenc.lab.passkey import REPEAT_FILLER
from posenc.real.passkey import passkey_prompts, start_tokens

from .fake_tokenizer import CharTokenizer


@pytest.mark.parametrize("chat", [True, False])
def test_prompts_hide_the_key_at_evenly_spaced_depths_and_end_with_it(chat):
    tok = CharTokenizer(bos=True, chat=chat)
    prompts = passkey_prompts(tok, 1200, 5, seed=3)
    assert [p.depth for p in prompts] == [0.0, 0.25, 0.5, 0.75, 1.0]
    needles = []
    for p in prompts:
        text = tok.decode(p.ids)
        assert len(p.ids) == 1200
        assert text.endswith("The pass key is " + p.key)
        assert p.answer_len == len(p.key)  # the space before the key ends the question
        assert tok.decode(p.ids[p.needle_at :]).startswith(f" The pass key is {p.key}. Remember it.")
        before = tok.decode(p.ids[: p.needle_at])
        assert before.endswith(("\n\n", "."))  # after the instruction, or after a filler sentence's end
        needles.append(p.needle_at)
        if chat:
            assert text.startswith("<user>There is an important piece") and "</user><bot>The pass key" in text
        else:
            assert p.ids[0] == 1 and "What is the pass key? The pass key is" in text
    assert needles == sorted(needles) and needles[-1] - needles[0] > 900  # from the start to the end
    assert len({p.key for p in prompts}) == 5 and all(len(p.key) == 5 for p in prompts)


def test_the_filler_is_the_landmark_attention_sentences():
    p = passkey_prompts(CharTokenizer(), 600, 1)[0]
    assert REPEAT_FILLER.strip() in CharTokenizer().decode(p.ids)


def test_keys_do_not_depend_on_the_number_of_trials_or_the_length():
    few = [p.key for p in passkey_prompts(CharTokenizer(), 400, 2, seed=1)]
    many = [p.key for p in passkey_prompts(CharTokenizer(), 900, 6, seed=1)]
    other = [p.key for p in passkey_prompts(CharTokenizer(), 400, 2, seed=2)]
    assert many[:2] == few and other != few


def test_a_length_too_short_for_the_prompt_is_refused_with_what_it_needs():
    with pytest.raises(ValueError, match=r"passkey length 100 is too short: .* take 2\d\d tokens"):
        passkey_prompts(CharTokenizer(), 100, 1)


def test_start_tokens_are_the_ones_the_tokenizer_adds():
    assert start_tokens(CharTokenizer(bos=True)) == [1]
    assert start_tokens(CharTokenizer(bos=False)) == []
