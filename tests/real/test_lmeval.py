"""posenc.real.lmeval: lm-evaluation-harness runs tiny tasks on a tiny posenc-patched Llama, offline, and
scores what the patched model computes (checked against the model's own logits, independently of lm-eval).

Nothing is downloaded: the tokenizer is built here (a word-level vocabulary), the model is random, the
tasks' documents are a JSONL file under tmp_path, and the Hub and datasets are switched offline.
"""

import json
import math
import random
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from posenc.hf import unpatch_model  # noqa: E402
from posenc.real.lmeval import INSTALL_EXTRA, posenc_lm  # noqa: E402

WORDS = "the a cat dog sat on mat ran far away big small red blue green one two three four five".split()
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0-3: LlamaConfig's bos 1 and eos 2
TRAIN_LEN = 16  # the tiny model's max_position_embeddings; the documents run past it
CONTEXT_WORDS, CONTINUATION_WORDS, GEN_TOKENS = 24, 3, 3


@pytest.fixture
def offline(monkeypatch):
    """The Hub and datasets switched offline, in the environment and in the constants read at import."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def _model(vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    # initializer_range well above the default 0.02, so that attention scores (hence positions) move logits
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TRAIN_LEN,
        initializer_range=0.3,
    )
    return LlamaForCausalLM(config).eval()


def _documents(tmp_path) -> tuple[list[dict], str]:
    rng = random.Random(0)
    docs = [
        {
            "context": " ".join(rng.choice(WORDS) for _ in range(CONTEXT_WORDS)),
            "continuation": " " + " ".join(rng.choice(WORDS) for _ in range(CONTINUATION_WORDS)),
        }
        for _ in range(3)
    ]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return docs, str(path)


def _tasks(path: str, cache: str) -> list[dict]:
    """A loglikelihood task and a generation task (RULER's kind) over the same local JSONL file."""
    common = {
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": path}, "cache_dir": cache},
        "test_split": "test",
        "doc_to_text": "{{context}}",
        "doc_to_target": "{{continuation}}",
        "metadata": {"version": 1},
    }
    loglikelihood = {
        **common,
        "task": "posenc_tiny_ll",
        "output_type": "loglikelihood",
        "target_delimiter": "",
    }
    generation = {
        **common,
        "task": "posenc_tiny_gen",
        "output_type": "generate_until",
        "generation_kwargs": {"until": ["</s>"], "max_gen_toks": GEN_TOKENS, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    }
    return [loglikelihood, generation]


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def _scores(model, tokenizer, docs) -> list[tuple[float, bool]]:
    """(log P(continuation | context), whether it is the greedy continuation) of each document, from one
    forward of the model over context + continuation."""
    out = []
    for doc in docs:
        context, continuation = _ids(tokenizer, doc["context"]), _ids(tokenizer, doc["continuation"])
        assert len(context) == CONTEXT_WORDS and len(continuation) == CONTINUATION_WORDS
        logp = model(torch.tensor([context + continuation])).logits[0].float().log_softmax(-1)
        rows = logp[len(context) - 1 : -1]
        target = torch.tensor(continuation)
        ll = rows.gather(1, target[:, None]).sum().item()
        out.append((ll, bool((rows.argmax(-1) == target).all())))
    return out


@torch.no_grad()
def _greedy(model, tokenizer, text: str) -> str:
    """The greedy continuation of ``text``, every step a full forward (no cache), up to the end token."""
    ids = _ids(tokenizer, text)
    new = []
    for _ in range(GEN_TOKENS):
        token = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
        if token == tokenizer.eos_token_id:
            break
        new.append(token)
    return tokenizer.decode(new, skip_special_tokens=True)


@pytest.mark.parametrize("method", ["yarn", "selfextend"])  # a frequency method and a remap
def test_lm_eval_scores_the_patched_model(method, offline, tmp_path):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    tokenizer = _tokenizer()
    model = _model(len(tokenizer))
    docs, path = _documents(tmp_path)
    unpatched = _scores(model, tokenizer, docs)

    lm = posenc_lm(model, tokenizer, method=method, factor=2)
    assert lm.max_length == 2 * TRAIN_LEN and lm.posenc_treatment is not None
    out = lm_eval.simple_evaluate(
        model=lm,
        tasks=_tasks(path, str(tmp_path / "datasets")),
        task_manager=TaskManager(include_defaults=False),
        bootstrap_iters=0,
        log_samples=True,
    )
    patched = _scores(model, tokenizer, docs)
    samples = sorted(out["samples"]["posenc_tiny_ll"], key=lambda s: s["doc_id"])
    assert [s["doc"] for s in samples] == docs
    through_lm_eval = [float(s["resps"][0][0][0]) for s in samples]
    assert through_lm_eval == pytest.approx([ll for ll, _ in patched], abs=1e-4)
    assert min(abs(a - b) for a, (b, _) in zip(through_lm_eval, unpatched, strict=True)) > 1e-2

    scores = out["results"]["posenc_tiny_ll"]
    mean_ll = sum(ll for ll, _ in patched) / len(patched)
    assert scores["perplexity,none"] == pytest.approx(math.exp(-mean_ll), rel=1e-4)
    assert scores["acc,none"] == pytest.approx(sum(g for _, g in patched) / len(patched))

    generated = sorted(out["samples"]["posenc_tiny_gen"], key=lambda s: s["doc_id"])
    assert [s["resps"][0][0] for s in generated] == [_greedy(model, tokenizer, d["context"]) for d in docs]
    assert "exact_match,none" in out["results"]["posenc_tiny_gen"]

    unpatch_model(model)  # the documented undo: the model's own positions again
    assert [ll for ll, _ in _scores(model, tokenizer, docs)] == pytest.approx([ll for ll, _ in unpatched])


def test_a_missing_lm_eval_names_the_extra(monkeypatch):
    tokenizer = _tokenizer()
    model = _model(len(tokenizer))
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # what `import lm_eval` meets when it is not installed
    with pytest.raises(ValueError, match=r"pip install posenc\[lmeval\]") as err:
        posenc_lm(model, tokenizer, method="yarn", factor=2)
    assert INSTALL_EXTRA in str(err.value)
    assert not hasattr(model.model.rotary_emb, "posenc_rotary")  # refused before anything was patched


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"method": "yarn"}, r"method='yarn' needs factor= .* or max_length="),
        ({"method": "yarn", "factor": 0.5}, r"factor must be a finite number >= 1 or None; got 0.5"),
        ({"method": "yarn", "factor": float("inf")}, r"factor must be a finite number >= 1 or None; got inf"),
        ({"method": "yarn", "factor": 2, "train_len": 0}, r"train_len must be an int >= 2 or None; got 0"),
        ({"method": "yarn", "max_length": 3.5}, r"max_length must be an int >= 1 or None; got 3.5"),
        ({"method": "yarn", "factor": 2, "batch_size": 0}, r"batch_size must be an int >= 1, 'auto'"),
        ({"method": "yarn", "factor": 2, "batch_size": "big"}, r"batch_size must be .*; got 'big'"),
        ({"method": "selfextend", "factor": 2, "batch_size": 4}, r"batch_size must be 1 with method='selfex"),
        ({"method": "warp", "factor": 2}, r"method='warp' cannot run on this LlamaForCausalLM: .*unknown"),
        ({"method": 3}, r"method must be a method spec \(str\) such as 'yarn' or None; got 3"),
        ({"factor": 2}, r"factor=2 and train_len=None go with method="),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, match):
    pytest.importorskip("lm_eval")
    tokenizer = _tokenizer()
    model = _model(len(tokenizer))
    with pytest.raises(ValueError, match=match):
        posenc_lm(model, tokenizer, **kwargs)
    assert not hasattr(model.model.rotary_emb, "posenc_rotary")  # a refusal leaves the model as it was


def test_model_and_tokenizer_are_checked():
    pytest.importorskip("lm_eval")
    tokenizer = _tokenizer()
    with pytest.raises(ValueError, match=r"model must be a transformers causal LM .*; got str"):
        posenc_lm("smollm2-135m", tokenizer, method="yarn", factor=2)
    with pytest.raises(ValueError, match=r"tokenizer is required"):
        posenc_lm(_model(len(tokenizer)), method="yarn", factor=2)
    with pytest.raises(ValueError, match=r"tokenizer must be a transformers .*; got dict"):
        posenc_lm(_model(len(tokenizer)), {}, method="yarn", factor=2)


def test_a_model_the_caller_patched_runs_as_it_is():
    pytest.importorskip("lm_eval")
    from posenc.hf import patch_model
    from posenc.real import method_rotary

    tokenizer = _tokenizer()
    model = _model(len(tokenizer))
    rotary = method_rotary(model.config, "pi", factor=2)
    patch_model(model, rotary=rotary)
    lm = posenc_lm(model, tokenizer, max_length=2 * TRAIN_LEN)
    assert lm.posenc_treatment is None and lm.max_length == 2 * TRAIN_LEN
    assert model.model.rotary_emb.posenc_rotary is rotary  # kept, not replaced
    with pytest.raises(ValueError, match=r"already patched: call posenc.hf.unpatch_model"):
        posenc_lm(model, tokenizer, method="yarn", factor=2)
    assert model.model.rotary_emb.posenc_rotary is rotary


def test_importing_posenc_real_does_not_import_lm_eval():
    code = "import sys, posenc.real, posenc.real.lmeval; print('lm_eval' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
