"""``posenc extend`` end to end on the real model, on a short setting: files, numbers against the unpatched
transformers model, resuming without recomputing, errors before any work."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from posenc.cli import main
from posenc.real import scoring
from posenc.real.corpus import load_documents

LENGTHS = (128, 256)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    import json.decoder

    path = tmp_path_factory.mktemp("corpus") / "decoder.py"
    shutil.copy(json.decoder.__file__, path)
    return path


def extend(folder, corpus, out, *extra) -> int:
    args = ["extend", "--model", str(folder), "--corpus", str(corpus), "--out", str(out), "--no-progress"]
    args += ["--lengths", ",".join(map(str, LENGTHS)), "--train-len", str(LENGTHS[0]), "--windows", "1"]
    return main(args + ["--methods", "none,pi,dynamic", "--passkey-trials", "1", "--tasks", "none", *extra])


@pytest.fixture(scope="module")
def run(smollm2_folder, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("extend")
    assert extend(smollm2_folder, corpus, out) == 0
    return out, json.loads((out / "results.json").read_text())


def test_extend_writes_the_report_of_every_method_and_length(run):
    out, payload = run
    assert (out / "results.md").read_text().startswith("# posenc extend")
    assert (out / "extend.png").stat().st_size > 10_000
    assert payload["train_len"] == 128 and payload["lengths"] == [128, 256] and payload["factor"] == 2.0
    assert [r["method"] for r in payload["results"]] == ["none", "pi", "dynamic"]
    for row in payload["results"]:
        for measure in ("ppl", "ppl_all", "passkey"):
            assert set(row[measure]) == {"128", "256"}
        assert all(v > 1 for v in row["ppl"].values()) and row["seconds"] > 0 and row["peak_mib"] >= 0
        assert all(row["passkey"][n] in (0.0, 1.0) for n in ("128", "256"))
    assert payload["provenance"]["transformers"] and payload["model"]["model_type"] == "llama"


def test_extend_scores_the_same_final_tokens_as_the_unpatched_model(run, smollm2, corpus):
    """ppl@L of "none" is the unpatched model's perplexity of the window's last tokens, for a window of L
    tokens ending at the document's end: recomputed here with transformers alone."""
    _, payload = run
    ids = torch.as_tensor(load_documents(corpus, smollm2.tokenizer, 1)[0].tokens)
    tail = payload["score_tokens"]
    none = payload["results"][0]
    for n in LENGTHS:
        window = ids[-n:][None]
        with torch.inference_mode():
            logits = smollm2.model(input_ids=window).logits[0, -tail - 1 : -1]
        want = F.cross_entropy(logits.double(), window[0, -tail:]).exp().item()
        assert none["ppl"][str(n)] == pytest.approx(want, rel=1e-4)


def test_methods_that_coincide_share_their_measurements(run):
    _, payload = run
    none, pi, dynamic = payload["results"]
    assert dynamic["same_as"] == {"128": "none"}  # dynamic NTK scales only past the trained length
    assert dynamic["ppl"]["128"] == none["ppl"]["128"]
    assert dynamic["ppl"]["256"] != none["ppl"]["256"]
    assert pi["ppl"]["128"] != none["ppl"]["128"]  # static interpolation changes short contexts too


def test_a_rerun_reuses_every_saved_measurement(run, smollm2_folder, corpus, monkeypatch):
    out, payload = run
    (out / "results.json").unlink()

    def refuse(*args, **kwargs):
        raise AssertionError("a saved measurement was computed again")

    monkeypatch.setattr(scoring.Scorer, "nll", refuse)
    monkeypatch.setattr(scoring.Scorer, "answers", refuse)
    assert extend(smollm2_folder, corpus, out, "--no-plot") == 0
    again = json.loads((out / "results.json").read_text())
    for a, b in zip(again["results"], payload["results"], strict=True):
        assert a["ppl"] == b["ppl"] and a["passkey"] == b["passkey"]


def test_more_windows_compute_only_the_new_ones(run, smollm2_folder, corpus, tmp_path, monkeypatch):
    out, _ = run
    copy = tmp_path / "more"
    shutil.copytree(out, copy)
    calls = []
    original = scoring.Scorer.nll
    monkeypatch.setattr(
        scoring.Scorer, "nll", lambda self, ids: calls.append(len(ids)) or original(self, ids)
    )
    assert extend(smollm2_folder, corpus, copy, "--no-plot", "--windows", "2", "--passkey-trials", "0") == 0
    # the second window: none and pi at both lengths, dynamic at 256 only (at 128 it is none's), and the
    # model as trained's truncated context for LongPPL at its trained length 128 (its 16 scored tokens and
    # the 32 before them)
    assert calls == [128, 48, 256, 128, 256, 256]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--methods", "none,chunked"], "--methods chunked: unknown method 'chunked'"),
        (["--lengths", "8,128"], "--lengths must be an integer >= 16, got 8"),
        (["--factor", "0.5"], "--factor must be a finite number >= 1, got 0.5"),
        (["--score-tokens", "128"], "--score-tokens must be below the shortest length 128"),
        (["--passkey-trials", "1", "--lengths", "64"], "passkey length 64 is too short"),
    ],
)
def test_bad_settings_are_refused_in_one_line(smollm2_folder, corpus, tmp_path, capsys, flags, message):
    args = ["extend", "--model", str(smollm2_folder), "--corpus", str(corpus), "--out", str(tmp_path / "o")]
    args += ["--lengths", "128", "--windows", "1", "--passkey-trials", "0", "--no-progress", *flags]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "o" / "cells").exists()  # refused before any forward pass


def test_a_model_path_that_is_no_model_is_refused_before_loading(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    for path, message in (
        (tmp_path / "missing", "does not exist"),
        (text, "is a file but not a .gguf file"),
        (tmp_path, "is a folder without config.json"),
    ):
        assert main(["extend", "--model", str(path), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
        assert message in capsys.readouterr().err


def test_training_free_methods_run_where_they_keep_distances_inside_the_trained_length(
    smollm2_folder, corpus, tmp_path
):
    out = tmp_path / "remaps"
    flags = ["--methods", "none,selfextend,string", "--passkey-trials", "0", "--no-plot"]
    args = ["extend", "--model", str(smollm2_folder), "--corpus", str(corpus), "--out", str(out)]
    args += ["--lengths", "128,256", "--train-len", "128", "--windows", "1", "--no-progress", *flags]
    assert main(args) == 0
    none, selfextend, string = json.loads((out / "results.json").read_text())["results"]
    assert selfextend["remap"] == "SelfExtend(group_size=3, window=32)"
    assert selfextend["ppl"]["128"] != none["ppl"]["128"] and selfextend["ppl"]["256"] is not None
    assert string["ppl"]["128"] is not None and string["ppl"]["256"] is None
    assert "maps 256 tokens to distances up to" in string["not_applicable"]["256"]
    assert "not applicable" in (out / "results.md").read_text()
