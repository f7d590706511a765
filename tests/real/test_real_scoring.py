"""The scorer of posenc extend against the real model's own forward pass and transformers' loss."""

import torch
import torch.nn.functional as F

from posenc.real.scoring import Scorer


def test_scorer_losses_are_the_models_own_next_token_losses(smollm2, real_text):
    scorer = Scorer(smollm2.model)
    assert scorer.split  # Llama's head is a plain linear map: scored without (length, vocab) logits
    ids = real_text[0, :200]
    with torch.inference_mode():
        out = smollm2.model(input_ids=ids[None], labels=ids[None])
    want = F.cross_entropy(out.logits[0, :-1].double(), ids[1:], reduction="none")
    got = scorer.nll(ids)
    assert got.shape == (199,) and got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert abs(got.mean().item() - out.loss.item()) < 1e-4  # transformers' own mean loss


def test_scorer_answers_are_the_greedy_choices(smollm2, real_text):
    ids = real_text[0, :120]
    with torch.inference_mode():
        want = smollm2.model(input_ids=ids[None]).logits[0, -6:-1].argmax(-1).tolist()
    assert Scorer(smollm2.model).answers(ids, 5) == want


def test_a_head_that_is_not_a_linear_map_is_scored_through_the_full_forward(smollm2, real_text):
    """Soft-capped logits (as Gemma 2 has) fail the split check: the scorer runs the model as it is."""
    model = smollm2.model
    original = model.forward

    def capped(*args, **kwargs):
        out = original(*args, **kwargs)
        out.logits = 30 * torch.tanh(out.logits / 30)
        return out

    model.forward = capped
    try:
        scorer = Scorer(model)
        ids = real_text[0, :64]
        with torch.inference_mode():
            logits = model(input_ids=ids[None]).logits[0, :-1].double()
        want = F.cross_entropy(logits, ids[1:], reduction="none")
        assert not scorer.split
        torch.testing.assert_close(scorer.nll(ids), want, rtol=1e-5, atol=1e-5)
    finally:
        del model.forward
