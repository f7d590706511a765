"""The trials runner (posenc.real.trials): each gold answer's teacher-forced log-likelihood, with and without
the needle, equals a direct forward of the whole prompt (float64), whether the trials share their needle-free
haystack's forward or not; the greedy answers equal those of a trial run alone."""

import math

import pytest
import torch

from posenc.real.continuation import Continuation
from posenc.real.tasks.prompt import Question, Trial
from posenc.real.trials import common_prefix, run_trial, run_trials

from .fake_tokenizer import CharTokenizer

pytest.importorskip("transformers")

VOCAB = 64


class _Tokenizer(CharTokenizer):
    def decode(self, ids, skip_special_tokens=False):
        return super().decode(ids)


def _model(kind: str):
    import transformers

    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    if kind == "llama":
        config = transformers.LlamaConfig(num_hidden_layers=2, **common)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "dynamic":
        rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
        config = transformers.LlamaConfig(num_hidden_layers=2, rope_parameters=rope, **common)
        model = transformers.LlamaForCausalLM(config)
    else:  # sliding-window layers beside global ones, as Gemma 3
        config = transformers.Gemma3TextConfig(
            num_hidden_layers=2,
            head_dim=8,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            **common,
        )
        model = transformers.Gemma3ForCausalLM(config)
    config._attn_implementation = "sdpa"
    return model.double().eval()


def _trials(length: int = 60) -> list[Trial]:
    """Three trials over one haystack, their needles at three depths (the last two needles of the first
    trial), their controls of slightly different lengths, as make_trial lays them out."""
    g = torch.Generator().manual_seed(1)
    haystack = torch.randint(2, VOCAB, (length,), generator=g).tolist()
    out = []
    for index, (cuts, room) in enumerate((([10, 40], length), ([25], length - 3), ([5], length - 1))):
        prefix, spans, at = [], [], 0
        for cut in cuts:
            prefix += haystack[at:cut]
            needle = [(7 * index + 3 * len(spans) + k) % (VOCAB - 2) + 2 for k in range(4)]
            spans.append((len(prefix), len(prefix) + len(needle)))
            prefix += needle
            at = cut
        prefix += haystack[at:room]
        questions = tuple(
            Question(
                ids=(5, 6 + q, 7),
                expected=("x",),
                depth=0.5,
                needle_at=spans[0][0],
                max_new_tokens=3,
                gold=(9 + q, 11, 13),
            )
            for q in range(2)
        )
        out.append(Trial("t", index, length + 16, tuple(prefix), questions, 0, tuple(spans)))
    return out


def _direct(model, ids, gold) -> float:
    """log p(gold | ids) from one forward of the whole sequence."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([[*ids, *gold]])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    return math.fsum(float(logp[len(ids) - 1 + k, t]) for k, t in enumerate(gold))


def _run(model, trials):
    found = {}
    run_trials(
        Continuation(model, _Tokenizer()),
        trials,
        torch.device("cpu"),
        lambda t, r: found.setdefault(t.index, r),
    )
    return [found[t.index] for t in trials]


@pytest.mark.parametrize("kind", ["llama", "gemma", "dynamic"])
def test_scores_equal_a_direct_forward_of_the_whole_prompt(kind):
    model, trials = _model(kind), _trials()
    results = _run(model, trials)
    for trial, result in zip(trials, results, strict=True):
        for q, got in zip(trial.questions, result["questions"], strict=True):
            want = _direct(model, [*trial.prefix, *q.ids], q.gold)
            prior = _direct(model, [*trial.control, *q.ids], q.gold)
            assert got["logprob"] == pytest.approx(want, abs=1e-5)
            assert got["control_logprob"] == pytest.approx(prior, abs=1e-5)
            assert got["gain"] == pytest.approx((want - prior) / len(q.gold), abs=1e-5)
            assert got["gold_tokens"] == len(q.gold)


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_trials_share_the_control_up_to_their_first_needle(kind):
    model, trials = _model(kind), _trials()
    results = _run(model, trials)
    assert [r["shared_tokens"] for r in results] == [t.needle_spans[0][0] for t in trials]
    alone = [run_trial(Continuation(model, _Tokenizer()), t, torch.device("cpu")) for t in trials]
    for shared, single in zip(results, alone, strict=True):
        assert single["shared_tokens"] == 0 or single["shared_tokens"] == shared["shared_tokens"]
        assert [q["answer"] for q in shared["questions"]] == [q["answer"] for q in single["questions"]]


@pytest.mark.parametrize("method", ["selfextend", "rerope"])
def test_a_remapped_model_continues_from_a_point_as_one_forward_would(method):
    """posenc's remapped attention over a cache (a trial continued from its needle, a gold answer after its
    question) scores as the whole prompt does in one forward."""
    from posenc.hf import patch_model
    from posenc.real.methods import method_remap

    model, trials = _model("llama"), _trials()
    patch_model(model, remap=method_remap(method, train_len=32, longest=80))
    results = _run(model, trials)
    for trial, result in zip(trials, results, strict=True):
        assert result["shared_tokens"] == trial.needle_spans[0][0]
        for q, got in zip(trial.questions, result["questions"], strict=True):
            assert got["logprob"] == pytest.approx(_direct(model, [*trial.prefix, *q.ids], q.gold), abs=1e-5)
            prior = _direct(model, [*trial.control, *q.ids], q.gold)
            assert got["control_logprob"] == pytest.approx(prior, abs=1e-5)


def test_a_length_dependent_rotary_runs_every_prompt_whole():
    results = _run(_model("dynamic"), _trials())
    assert [r["shared_tokens"] for r in results] == [0, 0, 0]


def test_the_control_differs_from_its_trial_only_by_the_needles():
    for trial in _trials():
        kept = [t for i, t in enumerate(trial.prefix) if not any(a <= i < b for a, b in trial.needle_spans)]
        assert list(trial.control) == kept
        assert len(trial.prefix) - len(trial.control) == sum(b - a for a, b in trial.needle_spans)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
