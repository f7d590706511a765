"""Questions that share one long prefix (posenc.real.continuation): each answer is what greedy decoding of the
whole prompt writes, whatever question ran before it, on both real models (one with sliding-window layers)."""

import pytest
import torch

from posenc.real.continuation import Continuation, Request


def _generate(model, ids: list[int], max_new_tokens: int, stop) -> list[int]:
    """transformers' own greedy decoding of the whole prompt, cut at the first stop token."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)
    written = []
    for token in out[0, len(ids) :].tolist():
        if token in stop:
            break
        written.append(token)
    return written


def _prompt(tokenizer, real_text, n: int) -> tuple[list[int], list[list[int]]]:
    ids = real_text[0].tolist() * 8
    return ids[:n], [ids[n : n + 7], ids[n + 40 : n + 52], ids[n + 90 : n + 93]]


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_each_answer_is_greedy_decoding_of_the_whole_prompt(name, request, real_text):
    real = request.getfixturevalue(name)
    model, tokenizer = real.model, real.tokenizer
    # Gemma's sliding layers keep the last 511 keys: a prefix past its window tests their restore too
    prefix, questions = _prompt(tokenizer, real_text, 560)
    # two of each length but one: batches of two, a row alone, rows that stop at different tokens
    questions = questions + [q[::-1] for q in questions[:2]]
    expected = [_generate(model, prefix + q, 8, Continuation(model, tokenizer).stop) for q in questions]
    runner = Continuation(model, tokenizer)
    cache, snapshot = runner.prefill(prefix)
    for question, wanted in zip(questions + questions[:1], expected + expected[:1], strict=True):
        answer = runner.answer(cache, snapshot, question, 8)  # the first again, after the others ran
        assert list(answer.tokens) == wanted
        assert answer.text == tokenizer.decode(list(answer.tokens), skip_special_tokens=True)
    batched = runner.answers(cache, snapshot, [Request(tuple(q), 8) for q in questions], rows=2)
    assert [list(a.tokens) for a in batched] == expected
    assert model.config._attn_implementation == "sdpa"  # put back after the batches


def test_an_answer_stops_as_soon_as_it_is_done(smollm2, real_text):
    runner = Continuation(smollm2.model, smollm2.tokenizer)
    prefix, questions = _prompt(smollm2.tokenizer, real_text, 200)
    cache, snapshot = runner.prefill(prefix)
    full = runner.answer(cache, snapshot, questions[0], 6)
    seen = []
    short = runner.answer(
        cache, snapshot, questions[0], 6, done=lambda text: seen.append(text) or len(seen) == 2
    )
    assert len(full.tokens) == 6 and short.tokens == full.tokens[:2]  # done after the second token
    assert seen == [smollm2.tokenizer.decode(list(full.tokens[:n])) for n in (1, 2)]


def test_what_it_cannot_run_is_refused(smollm2):
    runner = Continuation(smollm2.model, smollm2.tokenizer)
    with pytest.raises(ValueError, match="prefix is empty"):
        runner.prefill([])
    cache, snapshot = runner.prefill([1, 2, 3])
    with pytest.raises(ValueError, match="needs tokens and max_new_tokens >= 1"):
        runner.answer(cache, snapshot, [4], 0)
    with pytest.raises(ValueError, match="reserve must be >= 0"):
        runner.prefill([1, 2, 3], reserve=-1)


def test_a_question_past_the_reserve_grows_the_buffer_and_the_prefix_stays(smollm2, real_text):
    """With no room reserved every question outgrows the full-attention layers' buffers; the answers are
    still greedy decoding of the whole prompt, and a later question still sees the prefix alone."""
    from posenc.hf.cache import reserved_layer_class

    model, tokenizer = smollm2.model, smollm2.tokenizer
    prefix, questions = _prompt(tokenizer, real_text, 300)
    runner = Continuation(model, tokenizer)
    cache, snapshot = runner.prefill(prefix, reserve=0)
    assert all(type(layer) is reserved_layer_class() for layer in cache.layers)
    assert {layer.key_buffer.shape[-2] for layer in cache.layers} == {len(prefix)}
    for question in (questions[1], questions[0]):
        answer = runner.answer(cache, snapshot, question, 5)
        assert list(answer.tokens) == _generate(model, prefix + question, 5, runner.stop)
    assert min(layer.key_buffer.shape[-2] for layer in cache.layers) >= 2 * len(prefix)
    with pytest.raises(NotImplementedError, match="one sequence"):
        cache.layers[0].batch_repeat_interleave(2)


def test_batched_answers_on_a_remapped_model_equal_one_at_a_time(fresh_smollm2, real_text):
    from posenc.hf import patch_model
    from posenc.remap import ReRoPE

    model, tokenizer = fresh_smollm2.model, fresh_smollm2.tokenizer
    patch_model(model, remap=ReRoPE(window=128))
    prefix, questions = _prompt(tokenizer, real_text, 300)
    runner = Continuation(model, tokenizer)
    cache, snapshot = runner.prefill(prefix)
    alone = [runner.answer(cache, snapshot, q, 6) for q in questions]
    batched = runner.answers(cache, snapshot, [Request(tuple(q), 6) for q in questions])
    assert [a.tokens for a in batched] == [a.tokens for a in alone]


def test_a_batched_row_stops_when_done_and_the_others_go_on(smollm2, real_text):
    runner = Continuation(smollm2.model, smollm2.tokenizer)
    prefix, questions = _prompt(smollm2.tokenizer, real_text, 200)
    cache, snapshot = runner.prefill(prefix)
    first, second = questions[0], questions[0][::-1]  # the same length: one batch
    full = runner.answers(cache, snapshot, [Request(tuple(first), 5), Request(tuple(second), 5)])
    seen = []
    short = runner.answers(
        cache,
        snapshot,
        [
            Request(tuple(first), 5, lambda text: seen.append(text) or len(seen) == 2),
            Request(tuple(second), 5),
        ],
    )
    assert short[0].tokens == full[0].tokens[:2] and short[1].tokens == full[1].tokens


def test_batched_questions_refuse_what_they_cannot_run(smollm2):
    runner = Continuation(smollm2.model, smollm2.tokenizer)
    cache, snapshot = runner.prefill([1, 2, 3])
    with pytest.raises(ValueError, match="needs tokens and max_new_tokens >= 1"):
        runner.answers(cache, snapshot, [Request((4,), 2), Request((), 2)])
    with pytest.raises(ValueError, match="rows must be >= 1"):
        runner.answers(cache, snapshot, [Request((4,), 2)], rows=0)


def test_a_length_dependent_schedule_batches_only_questions_of_one_length(fresh_smollm2, real_text):
    from posenc.hf import patch_model, unpatch_model
    from posenc.hf.shared_prefix import length_dependent_positions
    from posenc.real.methods import method_rotary

    model, tokenizer = fresh_smollm2.model, fresh_smollm2.tokenizer
    assert not length_dependent_positions(model)
    patch_model(model, rotary=method_rotary(model.config, "yarn", factor=4.0, train_len=256))
    assert not length_dependent_positions(model)
    unpatch_model(model)
    # dynamic NTK takes the schedule of a call at its longest row: a shorter row batched with a longer one
    # would see another schedule than alone
    patch_model(model, rotary=method_rotary(model.config, "dynamic", factor=4.0, train_len=64))
    assert length_dependent_positions(model)
    ids = real_text[0].tolist() * 8
    prefix, questions = ids[:300], [ids[300:303], ids[400:700], ids[500:503]]  # a long row beside short
    runner = Continuation(model, tokenizer)
    cache, snapshot = runner.prefill(prefix)
    alone = [runner.answer(cache, snapshot, q, 8) for q in questions]
    batched = runner.answers(cache, snapshot, [Request(tuple(q), 8) for q in questions])
    assert [a.tokens for a in batched] == [a.tokens for a in alone]
