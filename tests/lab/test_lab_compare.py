"""posenc compare end to end (tiny preset): its files and their schema, resume, worker processes."""

import json
import math

import pytest

from posenc.cli import main
from posenc.lab.config import PRESETS
from posenc.lab.report import extrapolation_figure, save_figure


def tiny_compare_args(out, corpus_dir, cache, jobs=1, schemes=None):
    """argv for a tiny-preset compare into ``out``."""
    args = [
        "compare",
        "--preset",
        "tiny",
        "--out",
        str(out),
        "--corpus",
        str(corpus_dir),
        "--cache-dir",
        str(cache),
        "--jobs",
        str(jobs),
        "--no-progress",
    ]
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


def test_compare_writes_table_and_plot(compared, tmp_path):
    out, _, _ = compared
    md = (out / "results.md").read_text()
    data = json.loads((out / "results.json").read_text())
    for r in data["results"]:
        assert f"| {r['scheme']} |" in md
    assert "ppl(4L)/ppl(L)" in md
    png = (out / "extrapolation.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # What the PNG shows: the figure of results.json, one line per row and the training length.
    fig = extrapolation_figure(data)
    (ax,) = fig.axes
    assert ax.get_title() == "Length extrapolation: trained short, evaluated long"
    assert ax.get_xlabel() == "evaluation length (tokens)" and ax.get_ylabel() == "perplexity (bytes)"
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == [r["scheme"] for r in data["results"]] + [f"train length {data['train_len']}"]
    save_figure(fig, tmp_path / "again.png")
    assert (tmp_path / "again.png").read_bytes() == png
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
