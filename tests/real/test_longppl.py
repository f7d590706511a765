"""LongPPL (posenc.real.longppl) against the longppl package (Fang et al. 2024, arXiv:2410.23771), the paper's
own code, on one window of real text read by SmolLM2; and its selection rule on hand-made losses."""

from pathlib import Path

import pytest
import torch

from posenc.real.longppl import key_tokens, longppl, short_context_ids, truncation, window_keys
from posenc.real.scoring import Scorer, window_stats

TRUNC, SCORED = 192, 96


def _window(tokenizer) -> tuple[str, list[int], list]:
    """A text of a standard-library module cut to TRUNC + 2 * SCORED tokens, its ids and their offsets."""
    import json.decoder

    text = Path(json.decoder.__file__).read_text()
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    n = TRUNC + 2 * SCORED
    return text[: enc["offset_mapping"][n - 1][1]], enc["input_ids"][:n], enc["offset_mapping"][:n]


def test_the_key_tokens_are_the_longppl_packages_on_one_window(smollm2):
    find_key_token = pytest.importorskip("longppl.longppl").find_key_token
    model, tokenizer = smollm2.model, smollm2.tokenizer
    text, ids, offsets = _window(tokenizer)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids  # the cut keeps the tokens
    # the package scores the window in two chunks of SCORED tokens, each after at least TRUNC of context; the
    # second is posenc's: the window's last SCORED tokens, read after the TRUNC tokens before them
    alpha, beta = 0.5, -4.0  # looser than the paper's, so that a short window holds several key tokens
    spans = find_key_token(text, model, tokenizer, TRUNC, SCORED, alpha=alpha, beta=beta)
    theirs = sorted(
        i
        for i, (a, b) in enumerate(offsets)
        if i >= TRUNC + SCORED and any(s <= a and b <= e for s, e in spans.tolist())
    )
    scorer = Scorer(model)
    full = window_stats(scorer.nll(ids), SCORED, 16)["tail_nll"]
    short = scorer.nll(short_context_ids(ids, SCORED, TRUNC))[-SCORED:].tolist()
    ours = [len(ids) - SCORED + i for i in key_tokens(full, short, alpha=alpha, beta=beta)]
    assert len(ours) >= 3 and ours == theirs


def test_a_key_token_needs_both_a_long_context_gain_and_a_likely_token():
    full = [0.5, 0.5, 2.5, 1.9, 0.1]
    short = [3.0, 2.4, 5.0, 4.0, 2.0]
    assert key_tokens(full, short) == [0, 3]  # 1: gain 1.9 <= 2; 2: loss 2.5 >= 2; 4: gain 1.9
    assert longppl([1.0, 2.0, 3.0, 4.0, 5.0], [0, 3]) == pytest.approx(torch.tensor(2.5).exp().item())
    assert longppl([1.0], []) is None
    assert window_keys([{"tail_nll": full}], [{"short_nll": short}]) == [[0, 3]]
    assert window_keys([{"tail_nll": full}], [None]) is None


def test_the_short_context_is_the_window_tail():
    window = list(range(100))
    assert short_context_ids(window, 10, 25) == list(range(65, 100))
    assert truncation(8192) == 2048
    with pytest.raises(ValueError, match="cannot score its last 10 with 95 tokens"):
        short_context_ids(window, 10, 95)
    with pytest.raises(ValueError, match="train_len must be an integer >= 4, not 2"):
        truncation(2)
