"""posenc.lab.passkey: the prompts (exact length, key hidden where asked) and the training mix's rows."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.lab.errors import LabError
from posenc.lab.passkey import (
    PASSKEY_STYLES,
    TRAIN_KEY_DIGITS,
    passkey_min_length,
    passkey_prompt,
    passkey_rows,
)
from posenc.lab.tokenizer import decode


def test_passkey_prompt_has_exact_length_and_hides_the_key():
    for depth in (0.0, 0.5, 1.0):
        ids, key = passkey_prompt(300, "73914", depth)
        text = decode(ids)
        assert len(ids) == 300
        assert text.count("73914") == 2 and text.endswith("What is the pass key? The pass key is ")
    first = decode(passkey_prompt(300, "11111", 0.0)[0]).index("11111")
    last = decode(passkey_prompt(300, "11111", 1.0)[0]).index("11111")
    assert first < last
    with pytest.raises(LabError, match="too short"):
        passkey_prompt(40, "12345", 0.5)
    with pytest.raises(LabError, match="passkey style='haiku' is not known; allowed: sentences, code"):
        passkey_prompt(100, "1", 0.5, style="haiku")


def test_code_prompt_with_corpus_filler_fits_inside_a_short_training_length():
    needle, question = PASSKEY_STYLES["code"]
    assert passkey_min_length(3, "code") == len(needle.format(key="123")) + len(question) + 3 == 40
    filler = np.frombuffer(b"x = 1\n" * 100, dtype=np.uint8)
    ids, key = passkey_prompt(61, "123", 0.0, style="code", filler=filler[10:])
    assert len(ids) == 61 and decode(ids).startswith('\nPASSKEY = "123"\n')
    assert decode(ids).endswith('\nassert PASSKEY == "') and "x = 1" in decode(ids)
    room = 61 - len(needle.format(key="123")) - len(question)
    with pytest.raises(LabError, match=f"passkey filler has 5 tokens; the prompt needs {room}"):
        passkey_prompt(61, "123", 0.0, style="code", filler=filler[:5])


def _parse(row: list[int]) -> tuple[str, str, list[int], int]:
    """(key in the needle, the bytes after the question, the filler with needle, question and answer
    removed, where the answer ends)."""
    text = bytes(row).decode("latin-1")
    needle_at = text.index('\nPASSKEY = "')
    close = text.index('"\n', needle_at + 12)
    key = text[needle_at + 12 : close]
    question = '\nassert PASSKEY == "'
    asked = text.rindex(question) + len(question)
    end = asked + len(key)
    filler = text[:needle_at] + text[close + 2 : asked - len(question)] + text[end:]
    return key, text[asked:end], list(filler.encode("latin-1")), end


@settings(max_examples=30, deadline=None)
@given(st.integers(37, 200), st.integers(0, 2**31 - 1), st.integers(0, 5))
def test_passkey_rows_hide_a_key_in_the_rows_own_bytes_and_end_with_it(length, seed, n):
    """Each row becomes its own bytes (in order, cut to fit) with the needle inside, then the question and
    the key; key lengths stay in TRAIN_KEY_DIGITS, fewer when the row is short."""
    rows = torch.randint(ord("a"), ord("z") + 1, (n, length), generator=torch.Generator().manual_seed(seed))
    out, answers = passkey_rows(rows, torch.Generator().manual_seed(seed))
    assert out.shape == answers.shape == rows.shape and out.dtype == rows.dtype
    for original, made, marked in zip(rows.tolist(), out.tolist(), answers.tolist(), strict=True):
        key, answer, filler, end = _parse(made)
        assert key == answer and key.isdigit()
        assert [i for i, m in enumerate(marked) if m] == list(range(end - len(key), end))  # the answer
        assert TRAIN_KEY_DIGITS[0] <= len(key) <= TRAIN_KEY_DIGITS[1]
        assert passkey_min_length(len(key), "code") <= length
        assert filler == original[: len(filler)]
    again, _ = passkey_rows(rows, torch.Generator().manual_seed(seed))
    assert torch.equal(out, again)


def test_passkey_rows_vary_key_length_depth_and_where_the_answer_ends():
    rows = torch.full((300, 64), ord("x"))
    out, _ = passkey_rows(rows, torch.Generator().manual_seed(0))
    parsed = [_parse(r) for r in out.tolist()]
    assert {len(k) for k, _, _, _ in parsed} == set(range(TRAIN_KEY_DIGITS[0], TRAIN_KEY_DIGITS[1] + 1))
    depths = {bytes(r).decode().index("PASSKEY") for r in out.tolist()}
    assert len(depths) > 10
    # the answer ends anywhere from the shortest prompt's end to the window's end, both included
    ends = {end for _, _, _, end in parsed}
    assert min(ends) == passkey_min_length(TRAIN_KEY_DIGITS[0], "code") and max(ends) == 64 and len(ends) > 20


def test_passkey_rows_refuse_windows_too_short_for_the_prompt():
    shortest = passkey_min_length(TRAIN_KEY_DIGITS[0], "code")
    with pytest.raises(LabError, match=f"needs windows of at least {shortest} bytes .*; these have 20"):
        passkey_rows(torch.zeros(2, 20, dtype=torch.int64), torch.Generator())
