"""``posenc extend`` under a new user's attack, on tiny models: every method remaps what it says at every
trained length, memory is the work's own, the figure takes missing data, and what cannot run (a method on
this model, a flag past int64, a path that is no model or corpus) is refused in one line before any work."""

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from posenc import reference
from posenc.cli import main
from posenc.real import extend, loader, report
from posenc.real.extend import ExtendSettings, check_methods, resolve
from posenc.real.methods import EXTEND_METHODS, Treatment, method_remap, method_rotary
from posenc.real.scoring import Scorer
from posenc.runs.memory import measured_peak

from .conftest import save_tiny_model

CPU = torch.device("cpu")
LLAMA = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "rope_theta": 1e4}


# ---------------------------------------------------------------------------------------------- STRING


@pytest.mark.parametrize("train_len", [7, 16, 100, 128, 387, 388, 1000, 2047, 2048, 8192, 131072])
def test_string_remaps_some_distance_at_every_trained_length(train_len):
    """At the documented quick run (--train-len 128) STRING was the identity: its window equalled its
    shift below 388 tokens. Its distances, from the numpy reference, now move at every trained length."""
    remap = method_remap("string", train_len=train_len, longest=2 * train_len)
    assert remap.shift == int(0.33 * train_len)
    assert remap.local_window == (128 if train_len >= 2048 else max(1, train_len // 16))
    d = reference.string_distance(1, train_len, remap.shift, remap.local_window, offset=train_len - 1)
    assert (d != np.arange(train_len)[::-1]).any()
    assert [remap.distance(x) for x in range(train_len)] == d[0, ::-1].tolist()


def test_string_is_refused_by_name_where_it_would_remap_nothing():
    for train_len in range(1, 7):
        with pytest.raises(ValueError, match=f"--methods string: at --train-len {train_len} .* at least 7"):
            method_remap("string", train_len=train_len, longest=64)


# ---------------------------------------------------------------------------------------------- memory


def _two_buffers(n: int) -> float:
    x = torch.ones(n)
    y = x * 2  # both alive: the peak is 2 n floats
    del x
    return float(y[0])


def test_cpu_peak_is_the_bytes_the_work_keeps_alive_at_once():
    n = 1 << 20
    _two_buffers(n)  # freed memory the allocator may hand out again: the old resident-set meter saw 0
    with measured_peak(CPU) as peak:
        _two_buffers(n)
    assert 2 * 4 * n <= peak() < 2 * 4 * n + 1024  # two float32 buffers and a scalar or two


def test_the_same_work_measures_the_same_whatever_ran_before():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    scorer = Scorer(LlamaForCausalLM(config).eval())
    ids = list(range(1, 129))
    scorer.nll(ids)  # the first call may build what later calls reuse
    figures = []
    for big in (0, 1 << 22, 0):
        junk = torch.ones(big)  # memory the allocator holds or returns, between two measurements
        del junk
        with measured_peak(CPU) as peak:
            scorer.nll(ids)
        figures.append(peak())
    assert figures[0] == figures[1] == figures[2] > 128 * 256 * 4  # at least the (128, vocab) logits


# ---------------------------------------------------------------------------------------------- the figure


def _payload(ppl, curve):
    row = {
        "method": "string",
        "ppl": {"128": ppl[0], "256": ppl[1]},
        "passkey": {"128": None, "256": None},
        "ppl_by_context": {"256": curve},
    }
    return {
        "model": {"name": "tiny"},
        "train_len": 128,
        "factor": 2.0,
        "lengths": [128, 256],
        "score_tokens": 16,
        "passkey": {"trials": 0},
        "results": [row],
    }


@pytest.mark.parametrize("ppl, curve", [((None, None), None), ((5.0, None), None)])
def test_the_figure_draws_with_no_or_partial_data(ppl, curve):
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = report.extend_figure(_payload(ppl, curve))
    FigureCanvasAgg(fig).draw()  # was: "Data cannot be log-scaled because all values are <= 0"
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts.count("not measured") == (3 if ppl[0] is None else 2)


def test_nothing_that_can_apply_is_refused_before_any_work(tiny_llama_folder, tmp_path, capsys):
    out = tmp_path / "o"
    args = ["extend", "--model", str(tiny_llama_folder), "--out", str(out), "--no-progress"]
    args += ["--methods", "string", "--lengths", "256", "--train-len", "128", "--passkey-trials", "0"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "nothing to measure: none of --methods string applies at --lengths 256" in err
    assert err.count("\n") == 1 and not (out / "cells").exists()


# ---------------------------------------------------------------------------------------------- applicability


def _mistral(**extra):
    from transformers import MistralConfig

    return MistralConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, **extra,
    )  # fmt: skip


def test_a_method_the_model_cannot_run_is_named_with_its_window_before_any_work():
    plan = resolve(ExtendSettings(lengths=(128, 256)), _mistral(sliding_window=64), CPU)
    with pytest.raises(ValueError) as info:
        check_methods(plan, _mistral(sliding_window=64))
    message = str(info.value)
    assert message.startswith("--methods dca: DualChunk(") and "sliding window of 64 tokens" in message
    for config in (_mistral(sliding_window=None), {**LLAMA, "max_position_embeddings": 128}):
        check_methods(resolve(ExtendSettings(lengths=(128, 256)), config, CPU), config)  # every method runs
    plan = resolve(ExtendSettings(methods=("none", "selfextend"), lengths=(128, 256)), _mistral(), CPU)
    check_methods(plan, _mistral(sliding_window=64))  # token-distance remaps take a window


def test_a_sliding_window_model_is_refused_before_it_loads(tmp_path, capsys, monkeypatch):
    folder = save_tiny_model(tmp_path / "mistral", _mistral(sliding_window=64))
    monkeypatch.setattr(loader, "load_real_model", _never)
    capsys.readouterr()  # the progress of saving the model
    out = tmp_path / "o"
    assert main(["extend", "--model", str(folder), "--out", str(out), "--lengths", "128,256"]) == 2
    err = capsys.readouterr().err
    assert "--methods dca:" in err and "64 tokens" in err and err.count("\n") == 1
    assert not out.exists()


# ---------------------------------------------------------------------------------------------- sharing cells


@pytest.mark.parametrize("method", ["pi", "ntk", "yarn", "llama3"])
@pytest.mark.parametrize("head_dim, base, train_len", [(128, 1e4, 4096), (64, 1e5, 128), (64, 1e5, 8192)])
def test_a_method_that_is_the_identity_at_its_factor_shares_nones_cell(method, head_dim, base, train_len):
    """YaRN at factor 1 (temperature 1, every frequency kept) computed its frequencies one bit off the
    plain schedule, so it was measured again. Its schedule is now the plain one, as the reference's."""
    config = {**LLAMA, "hidden_size": 4 * head_dim, "rope_theta": base, "max_position_embeddings": train_len}
    none = method_rotary(config, "none", factor=1.0)
    same = method_rotary(config, method, factor=1.0, train_len=train_len)
    inv, attention = same.frequencies(2 * train_len)
    np.testing.assert_allclose(
        inv.double().numpy(), reference.inverse_frequencies(head_dim, base), rtol=1e-14
    )
    assert torch.equal(inv, none.frequencies(2 * train_len)[0])  # bit for bit: one cell
    assert attention == 1.0

    def digest(rotary):
        return Treatment(method, rotary).digest(2 * train_len)

    assert digest(same) == digest(none)
    dynamic = method_rotary(config, "dynamic", factor=1.0, train_len=train_len)  # still grows its base
    assert digest(dynamic) != digest(none)


def test_frequency_methods_replace_a_configs_scaling_and_remaps_stack_on_it():
    llama3 = {
        **LLAMA,
        "max_position_embeddings": 131072,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    kept = method_rotary(llama3, "none", factor=2.0).scaling
    for m in EXTEND_METHODS:
        rotary = method_rotary(llama3, m, factor=2.0)
        assert (rotary.scaling == kept) == (
            m == "none" or method_remap(m, train_len=8192, longest=16384) is not None or "nope" in m
        )  # a layer conversion keeps the RoPE of the layers it leaves
    assert method_rotary(llama3, "yarn", factor=1.0).scaling is None  # the identity replaces it too


def test_the_help_and_the_doc_say_which_methods_replace_and_which_stack(capsys):
    with pytest.raises(SystemExit):
        main(["extend", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "replaces the RoPE scaling the model's config may have" in help_text
    doc = " ".join((Path(__file__).parents[2] / "docs" / "real-models.md").read_text().split())
    assert "each method replaces that scaling" not in doc
    assert "stack" in doc


# ---------------------------------------------------------------------------------------------- bad input


def _never(*args, **kwargs):
    raise AssertionError("the model was loaded before the arguments were checked")


@pytest.mark.parametrize(
    "flag",
    [
        "--seed",
        "--windows",
        "--passkey-trials",
        "--train-len",
        "--score-tokens",
        "--short-tokens",
        "--trials",
        "--questions",
        "--answer-tokens",
    ],
)
def test_integers_past_int64_are_refused_by_name(flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["extend", flag, "99999999999999999999", "--out", str(tmp_path / "o")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: expected" in err and "2**63 - 1" in err


def test_lengths_and_threads_past_what_torch_takes_are_refused_by_name(tmp_path, capsys):
    for flags in (["--lengths", "128,99999999999999999999"], ["--threads", str(2**31)]):
        with pytest.raises(SystemExit) as info:
            main(["extend", *flags, "--out", str(tmp_path / "o")])
        assert info.value.code == 2 and f"argument {flags[0]}:" in capsys.readouterr().err


def _model_cases(tmp: Path, good: Path):
    """(path, what the line says) for --model paths that are no model."""
    cases = [(tmp / "missing", "does not exist")]
    fake = tmp / "fake.gguf"
    fake.write_text("not a gguf")
    cases.append((fake, "is named .gguf but is not a GGUF file"))
    (tmp / "dir.gguf").mkdir()
    cases.append((tmp / "dir.gguf", "is a folder without config.json"))
    for name, breaks, message in (
        ("config-dir", lambda f: ((f / "config.json").unlink(), (f / "config.json").mkdir()), "is a folder"),
        ("bad-json", lambda f: (f / "config.json").write_text("{"), "is not readable JSON"),
        ("no-type", lambda f: (f / "config.json").write_text("{}"), "no model_type"),
        ("no-weights", lambda f: (f / "model.safetensors").unlink(), "has config.json but no weights"),
        ("no-tokenizer", lambda f: (f / "tokenizer.json").unlink(), "has no tokenizer files"),
    ):
        folder = tmp / name
        shutil.copytree(good, folder)
        breaks(folder)
        cases.append((folder, message))
    return cases


def test_a_model_path_that_is_no_model_is_refused_in_one_line_before_loading(
    tiny_llama_folder, tmp_path, capsys, monkeypatch
):
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", _never)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", _never)
    for path, message in _model_cases(tmp_path, tiny_llama_folder):
        assert main(["extend", "--model", str(path), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"--model {str(path)!r}" in err and message in err, (path, err)
        assert err.count("\n") == 1 and "Traceback" not in err and "huggingface" not in err.lower()


def test_an_unreadable_model_or_corpus_is_refused_by_name(tiny_llama_folder, tmp_path, capsys, monkeypatch):
    """(chmod cannot take read access from root, so the permission check is told the answer.)"""
    import os

    real_access = os.access
    for blocked in (tiny_llama_folder, tiny_llama_folder / "config.json"):
        monkeypatch.setattr(os, "access", lambda p, mode, b=blocked: Path(p) != b and real_access(p, mode))
        assert main(["extend", "--model", str(tiny_llama_folder), "--out", str(tmp_path / "o")]) == 2
        assert "not readable (permission denied)" in capsys.readouterr().err
    corpus = tmp_path / "c.txt"
    corpus.write_text("text " * 100)
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != corpus and real_access(p, mode))
    args = [
        "extend",
        "--model",
        str(tiny_llama_folder),
        "--corpus",
        str(corpus),
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(args) == 2
    assert f"--corpus {str(corpus)!r} is not readable" in capsys.readouterr().err


def test_a_corpus_that_holds_no_text_is_refused_before_loading(
    tiny_llama_folder, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(loader, "load_real_model", _never)
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x00\x01" * 100)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "x.bin").write_bytes(b"\x00" * 10)
    for path, message in (
        (tmp_path / "missing.txt", "does not exist"),
        (binary, "is a binary file"),
        (empty, "is a folder without text files"),
    ):
        args = [
            "extend",
            "--model",
            str(tiny_llama_folder),
            "--corpus",
            str(path),
            "--out",
            str(tmp_path / "o"),
        ]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"--corpus {str(path)!r} {message}" in err and err.count("\n") == 1


def test_the_quick_run_measures_every_method_on_a_tiny_model(tiny_llama_folder, tmp_path):
    """The documented quick run's settings, every method, on a tiny model: STRING and YaRN's cells are
    their own, the peaks are the work's, and the figure is drawn."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(Path(json.__file__).read_text())
    out = tmp_path / "o"
    args = ["extend", "--model", str(tiny_llama_folder), "--corpus", str(corpus), "--out", str(out)]
    args += ["--lengths", "128,256", "--train-len", "128", "--windows", "1", "--passkey-trials", "0"]
    assert main([*args, "--no-progress"]) == 0
    rows = {r["method"]: r for r in json.loads((out / "results.json").read_text())["results"]}
    assert rows["string"]["remap"].startswith("STRING(shift=42, local_window=8")
    assert rows["string"]["ppl"]["128"] != rows["none"]["ppl"]["128"]  # distances past 42 moved
    assert all(r["peak_mib"] > 0 for r in rows.values())
    assert (out / "extend.png").stat().st_size > 10_000
    assert math.isfinite(rows["yarn"]["ppl"]["256"]) and sys.modules["posenc.real.extend"] is extend
