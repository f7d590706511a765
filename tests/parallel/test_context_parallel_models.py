"""A transformers model's forward under context parallelism on 2 gloo ranks equals its own forward on the
whole sequence: a Llama, a Gemma 3 with sliding and full layers, a GPT-OSS with sinks and sliding layers."""

import json

import pytest
import torch
import torch.multiprocessing as mp
import transformers

import posenc.hf
from posenc.hf import context_parallel

from .model_worker import MODELS, run_models


@pytest.mark.parametrize("layout", ["headtail", "striped"])
def test_models_under_context_parallelism_give_their_own_logits(layout, tmp_path):
    names = sorted(MODELS)
    mp.spawn(run_models, args=(2, str(tmp_path / "store"), str(tmp_path), names, 23, layout), nprocs=2)
    for rank in range(2):
        errors = json.loads((tmp_path / f"{rank}.json").read_text())
        for name in names:
            relative = 1e-9 if errors[name + " dtype"] == "torch.float64" else 2e-5
            assert errors[name] <= relative * max(1.0, errors[name + " scale"]), (rank, name, errors)


def test_a_patched_model_runs_only_through_its_handle_and_close_restores_it():
    model = MODELS["llama"]()
    cp = context_parallel(model)
    with pytest.raises(ValueError, match="runs through its ContextParallel handle"):
        model(torch.randint(1, 128, (1, 8)))
    with pytest.raises(ValueError, match="takes no attention_mask"):
        cp(torch.ones(1, 4, dtype=torch.long), torch.arange(4), attention_mask=torch.ones(1, 4))
    cp.close()
    assert model.config._attn_implementation == "sdpa"


def test_soft_capped_attention_is_refused_before_any_work():
    torch.manual_seed(0)
    config = transformers.Gemma2Config(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        attn_logit_softcapping=50.0,
    )
    with pytest.raises(ValueError, match="soft-caps its attention logits"):
        posenc.hf.context_parallel(transformers.Gemma2ForCausalLM(config))


def test_a_length_dependent_rope_is_refused():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
        max_position_embeddings=16,
    )
    with pytest.raises(ValueError, match="depends on the sequence length"):
        posenc.hf.context_parallel(transformers.LlamaForCausalLM(config))
