"""posenc compare end to end (tiny preset), its files and schema; the CLI's train/eval/sample and its errors."""

import json
import math

import pytest
import torch

from posenc.cli import main
from posenc.lab.compare import PRESETS, Settings, markdown_table, ratio, settings_for
from posenc.lab.errors import LabError


def tiny_compare_args(out, corpus_dir, cache, jobs=1, schemes=None):
    """argv for a tiny-preset compare into ``out``."""
    args = ["compare", "--preset", "tiny", "--out", str(out), "--corpus", str(corpus_dir),
            "--cache-dir", str(cache), "--jobs", str(jobs), "--no-progress"]
    return args + (["--schemes", schemes] if schemes else [])


def ppl_by_scheme(out):
    """{scheme: {length: ppl}} from out/results.json."""
    return {r["scheme"]: r["ppl"] for r in json.loads((out / "results.json").read_text())["results"]}


@pytest.fixture(scope="module")
def compared(corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    cache = tmp_path_factory.mktemp("cache")
    args = tiny_compare_args(out, corpus_dir, cache)
    assert main(args) == 0
    return out, cache, args


def test_compare_writes_results_json_with_the_exact_schema(compared):
    out, _, _ = compared
    data = json.loads((out / "results.json").read_text())
    assert set(data) == {"train_len", "eval_lens", "corpus", "results"}
    tiny = PRESETS["tiny"]
    assert data["train_len"] == tiny.train_len
    assert data["eval_lens"] == [tiny.train_len * m for m in tiny.eval_mults]
    assert isinstance(data["corpus"], str) and data["corpus"].endswith("corpus0")
    schemes = [r["scheme"] for r in data["results"]]
    assert schemes == ["none", "sinusoidal", "learned", "rope", "rope+pi", "rope+ntk", "rope+yarn", "alibi"]
    for r in data["results"]:
        assert set(r) == {"scheme", "ppl", "note"}
        assert list(r["ppl"]) == [str(n) for n in data["eval_lens"]]
        for v in r["ppl"].values():
            assert v is None or (isinstance(v, float) and math.isfinite(v) and v > 1)
        assert r["note"] is None or isinstance(r["note"], str)
    learned = next(r for r in data["results"] if r["scheme"] == "learned")
    assert learned["ppl"][str(tiny.train_len)] is not None
    assert all(learned["ppl"][str(n)] is None for n in data["eval_lens"][1:])
    assert "max_len=16" in learned["note"]


def test_compare_writes_table_and_plot(compared, capsys):
    out, _, _ = compared
    md = (out / "results.md").read_text()
    data = json.loads((out / "results.json").read_text())
    for r in data["results"]:
        assert f"| {r['scheme']} |" in md
    assert "ppl(4L)/ppl(L)" in md
    png = (out / "extrapolation.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    for scheme in ("none", "sinusoidal", "learned", "rope", "alibi"):
        assert (out / "models" / scheme / "checkpoints" / "latest").exists()


def test_compare_resumes_by_skipping_finished_models(compared, capsys):
    out, _, args = compared
    before = (out / "results.json").read_text()
    stamps = {p: p.stat().st_mtime_ns for p in (out / "models").rglob("model.safetensors")}
    assert main(args) == 0
    assert (out / "results.json").read_text() == before
    assert {p: p.stat().st_mtime_ns for p in (out / "models").rglob("model.safetensors")} == stamps
    assert "| rope+yarn |" in capsys.readouterr().out


def test_compare_with_two_worker_processes_gives_the_same_numbers(compared, corpus_dir, tmp_path):
    out, cache, _ = compared
    assert main(tiny_compare_args(tmp_path, corpus_dir, cache, jobs=2, schemes="rope,alibi")) == 0
    two, one = ppl_by_scheme(tmp_path), ppl_by_scheme(out)
    assert set(two) == {"rope", "rope+pi", "rope+ntk", "rope+yarn", "alibi"}
    for scheme, ppl in two.items():
        assert ppl == pytest.approx(one[scheme], rel=1e-5)


def test_ratio_and_table_formatting():
    rows = [
        {"scheme": "a", "ppl": {"8": 2.0, "32": 3.0}, "note": None},
        {"scheme": "b", "ppl": {"8": 2.0, "32": None}, "note": "n/a | why"},
    ]
    assert ratio(rows[0], 32, 8) == 1.5 and ratio(rows[1], 32, 8) is None
    table = markdown_table(rows, [8, 32], 8)
    assert "| a | 2.00 | 3.00 | 1.500 |  |" in table
    assert "| b | 2.00 | n/a | n/a | n/a / why |" in table


def test_settings_validation():
    with pytest.raises(LabError, match="preset='huge' is not known; allowed: tiny, quick, gpu"):
        settings_for("huge")
    with pytest.raises(LabError, match=r"unknown \['t5'\]"):
        Settings(schemes=("rope", "t5"))
    with pytest.raises(LabError, match=r"unknown \['rerope'\]; allowed: pi, ntk, dynamic, yarn"):
        Settings(extensions=("pi", "rerope"))
    assert settings_for("quick", steps=None).steps == PRESETS["quick"].steps
    assert settings_for("quick", steps=7).steps == 7


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--encoding", "rope", "--out", "{tmp}/r", "--corpus", "{tmp}/nope"], "does not exist"),
        (["compare", "--out", "{tmp}/c", "--schemes", "rope,t5", "--preset", "tiny"], "unknown ['t5']"),
        (["eval", "{tmp}/empty"], "no checkpoint at"),
        (["sample", "{tmp}/empty"], "no checkpoint at"),
        (
            ["train", "--encoding", "rope", "--out", "{tmp}/r", "--d-model", "30"],
            "d_model=30 must be a multiple",
        ),
        (["compare", "--out", "{tmp}/c", "--device", "tpu:0", "--preset", "tiny"], "device='tpu:0'"),
        (
            ["train", "--encoding", "rope", "--out", "{tmp}/r", "--device", "cuda:0"]
            if not torch.cuda.is_available()
            else ["train", "--encoding", "rope", "--out", "{tmp}/r", "--device", "cuda:999"],
            "cuda",
        ),
    ],
)
def test_cli_errors_are_one_line_and_nonzero(argv, message, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_cli_rejects_unknown_encoding_and_bad_lengths(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--encoding", "xpos", "--out", "x"])
    assert e.value.code == 2 and "invalid choice: 'xpos'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "x", "--lens", "64,-1"])
    assert "expected positive integers" in capsys.readouterr().err


def test_cli_train_eval_sample_round_trip(corpus_dir, tmp_path, capsys):
    run = tmp_path / "run"
    base = ["--corpus", str(corpus_dir), "--cache-dir", str(tmp_path / "cache")]
    assert (
        main(
            [
                "train",
                "--encoding",
                "learned",
                "--out",
                str(run),
                "--train-len",
                "16",
                "--n-layer",
                "1",
                "--n-head",
                "2",
                "--d-model",
                "16",
                "--steps",
                "3",
                "--batch-size",
                "2",
                "--no-progress",
                *base,
            ]
        )
        == 0
    )
    assert "trained learned to step 3" in capsys.readouterr().out
    report = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                str(run),
                "--lens",
                "16,32",
                "--eval-tokens",
                "64",
                "--passkey-lens",
                "120",
                "--passkey-trials",
                "1",
                "--json",
                str(report),
                *base,
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "| learned |" in text and "n/a" in text
    data = json.loads(report.read_text())
    assert data["results"][0]["ppl"]["32"] is None and data["passkey"]["plain"]["120"] is None
    assert main(["sample", str(run), "--prompt", "def ", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("def ")


def test_a_killed_compare_resumes_partial_training_to_the_same_numbers(compared, corpus_dir, tmp_path):
    """A compare killed mid-training leaves a partial checkpoint; rerunning finishes it bit-identically."""
    from posenc.lab.data import load_corpus
    from posenc.lab.train import train

    out, cache, _ = compared
    s = PRESETS["tiny"]
    data = load_corpus(corpus_dir, cache_dir=cache)
    partial = train(
        s.model_config("rope"),
        s.train_config(),
        tmp_path / "models" / "rope",
        corpus=data,
        progress=False,
        ckpt_every=s.ckpt_every,
        stop_after=s.steps // 2,
    )
    assert partial.step == s.steps // 2
    assert main(tiny_compare_args(tmp_path, corpus_dir, cache, schemes="rope")) == 0
    resumed, whole = ppl_by_scheme(tmp_path), ppl_by_scheme(out)
    for scheme, ppl in resumed.items():
        assert ppl == whole[scheme]  # exactly: the resumed model is the uninterrupted model
