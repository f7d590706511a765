"""posenc compare end to end (tiny preset): its files and their schema, resume, worker processes."""

import hashlib
import json
import math
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import posenc
from posenc.cli import main
from posenc.lab.config import PRESETS
from posenc.lab.data import load_corpus
from posenc.lab.encodings import ENCODINGS, extensions_for
from posenc.lab.report import extrapolation_figure
from posenc.runs.figures import save_figure

ROOT = Path(__file__).resolve().parents[2]


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


def expected_rows(settings):
    """The report's rows: each scheme, then its extensions (whatever the extension list holds)."""
    return [
        label
        for sc in settings.schemes
        for label in [sc, *(f"{sc}+{e}" for e in extensions_for(sc, settings.extensions))]
    ]


MEASURES = [
    "ppl",
    "ppl_past",
    "ppl_sliding",
    "gain",
    "reach",
    "copy_first",
    "copy_repeat",
    "recall",
    "recall_ppl",
    "recall_gain",
    "passkey",
]


def test_compare_writes_results_json_with_the_exact_schema(compared):
    out, _, _ = compared
    data = json.loads((out / "results.json").read_text())
    assert list(data) == [
        "train_len",
        "eval_lens",
        "corpus",
        "seeds",
        "protocols",
        "passkey_trials",
        "provenance",
        "results",
    ]
    tiny = PRESETS["tiny"]
    assert data["train_len"] == tiny.train_len
    assert data["eval_lens"] == [tiny.train_len * m for m in tiny.eval_mults]
    assert data["seeds"] == 1 and data["protocols"] == ["windows", "sliding", "past"]
    assert data["passkey_trials"] == tiny.passkey_trials
    assert isinstance(data["corpus"], str) and data["corpus"].endswith("corpus0")
    schemes = [r["scheme"] for r in data["results"]]
    assert schemes == expected_rows(tiny)
    keys = ["scheme", "seeds"] + [k for m in MEASURES for k in (m, f"{m}_sd")] + ["per_seed", "note"]
    for r in data["results"]:
        assert list(r) == keys
        assert r["seeds"] == 1 and list(r["per_seed"]) == ["0"]
        for m in MEASURES:
            # reach: the contexts L/4 and L/2 at the training length; the others: every length
            want = [str(tiny.train_len // 4), str(tiny.train_len // 2)] if m == "reach" else data["eval_lens"]
            assert list(r[m]) == [str(n) for n in want]
            assert all(v is None for v in r[f"{m}_sd"].values())  # one seed: no spread
            assert r["per_seed"]["0"][m] == r[m]  # one seed: the mean is that seed's value
        for v in r["ppl"].values():
            assert v is None or (isinstance(v, float) and math.isfinite(v) and v > 1)
        assert r["gain"][str(tiny.train_len)] is None  # both contexts are the whole window
        assert r["note"] is None or isinstance(r["note"], str)
    learned = next(r for r in data["results"] if r["scheme"] == "learned")
    assert learned["ppl"][str(tiny.train_len)] is not None
    assert all(learned["ppl"][str(n)] is None for n in data["eval_lens"][1:])
    assert "max_len=16" in learned["note"]


def test_results_json_records_how_to_reproduce_the_run(compared, corpus_dir):
    out, cache, _ = compared
    prov = json.loads((out / "results.json").read_text())["provenance"]
    assert prov["posenc"] == posenc.__version__ and prov["torch"] == torch.__version__
    assert prov["device"] == "cpu"
    assert prov["settings"] == PRESETS["tiny"].to_json()
    data = load_corpus(corpus_dir, cache_dir=cache)
    for split in ("train", "val"):
        tokens = np.asarray(getattr(data, split))
        assert prov["corpus"][split]["tokens"] == len(tokens)
        assert prov["corpus"][split]["sha256"] == hashlib.sha256(tokens.tobytes()).hexdigest()
    # run from this checkout: the revision is the checkout's HEAD
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    if head.returncode == 0:
        assert prov["git"]["commit"] == head.stdout.strip()


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
    ax, gain, keys, recall = fig.axes  # the recall probe runs in every comparison
    assert ax.get_title() == "Length extrapolation: trained short, evaluated long"
    assert ax.get_xlabel() == "evaluation length (tokens)" and ax.get_ylabel() == "perplexity (bytes)"
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == [r["scheme"] for r in data["results"]] + [f"train length {data['train_len']}"]
    measured = [r["scheme"] for r in data["results"] if r["gain"][str(data["eval_lens"][-1])] is not None]
    assert [line.get_label() for line in gain.get_lines()][:-1] == measured  # learned has no gain past L
    # passkey accuracy: only the longest length (64) holds the prompt; learned cannot run there
    asked = [r["scheme"] for r in data["results"] if r["passkey"][str(data["eval_lens"][-1])] is not None]
    assert [line.get_label() for line in keys.get_lines()][:-1] == asked and "learned" not in asked
    assert keys.get_title() == "Passkey retrieval: a key hidden in the text"
    probed = [r["scheme"] for r in data["results"] if any(v is not None for v in r["recall"].values())]
    assert [line.get_label() for line in recall.get_lines()][:-1] == probed
    save_figure(fig, tmp_path / "again.png")
    assert (tmp_path / "again.png").read_bytes() == png
    for scheme in ("none", "sinusoidal", "learned", "rope", "alibi"):
        assert (out / "models" / scheme / "seed-0" / "checkpoints" / "latest").exists()


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
    assert list(two) == expected_rows(replace(PRESETS["tiny"], schemes=("rope", "alibi")))
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
        tmp_path / "models" / "rope" / "seed-0",
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


# ---------------------------------------------------------------------------------------------- seeds


@pytest.fixture(scope="module")
def two_seeds(compared, corpus_dir):
    """The module's one-seed compare (seed 0) extended to two seeds, rope and alibi only."""
    out, cache, _ = compared
    args = tiny_compare_args(out, corpus_dir, cache, schemes="rope,alibi") + ["--seeds", "2"]
    stamps = {p: p.stat().st_mtime_ns for p in (out / "models").rglob("model.safetensors")}
    one = json.loads((out / "results.json").read_text())
    assert main(args) == 0
    return out, args, stamps, one


def test_seeds_report_the_mean_and_sd_of_the_per_seed_values(two_seeds):
    out, _, _, one = two_seeds
    data = json.loads((out / "results.json").read_text())
    assert data["seeds"] == 2
    single = {r["scheme"]: r for r in one["results"]}
    for r in data["results"]:
        assert r["seeds"] == 2 and list(r["per_seed"]) == ["0", "1"]
        # seed 0 is the model the one-seed run trained, evaluated again with the same numbers
        assert r["per_seed"]["0"]["ppl"] == single[r["scheme"]]["ppl"]
        assert r["per_seed"]["1"]["ppl"] != r["per_seed"]["0"]["ppl"]  # another init and batch order
        for m in MEASURES:
            for n, v in r[m].items():
                values = [r["per_seed"][s][m][n] for s in ("0", "1")]
                if None in values:
                    assert v is None and r[f"{m}_sd"][n] is None
                    continue
                assert v == pytest.approx(np.mean(values), rel=1e-12)
                assert r[f"{m}_sd"][n] == pytest.approx(np.std(values, ddof=1), rel=1e-9, abs=1e-15)
    md = (out / "results.md").read_text()
    rope = next(r for r in data["results"] if r["scheme"] == "rope")
    n = str(data["train_len"])
    assert f"| rope | {rope['ppl'][n]:.2f} ± {rope['ppl_sd'][n]:.2f} |" in md
    assert "seeds 0..1, mean ± sd" in md


def test_a_finished_seed_is_not_trained_again(two_seeds, capsys):
    out, args, stamps, _ = two_seeds
    # going from one seed to two trained only seed 1
    for path, stamp in stamps.items():
        if "seed-0" in path.parts and path.parts[-5] in ("rope", "alibi"):
            assert path.stat().st_mtime_ns == stamp
    assert (out / "models" / "rope" / "seed-1" / "checkpoints" / "latest").exists()
    # and a rerun of the two-seed compare trains and evaluates nothing
    now = {p: p.stat().st_mtime_ns for p in (out / "models").rglob("*.json")}
    capsys.readouterr()
    assert main(args) == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "models").rglob("*.json")} == now


def test_seeds_are_separate_tasks_in_the_worker_pool(monkeypatch, tmp_path):
    """Each (scheme, seed) is submitted on its own, so seeds train in parallel."""
    import posenc.lab.compare as lab_compare

    submitted = []

    class Pool:
        def __init__(self, *a, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, task, *args):  # args: the comparison, the events
            from concurrent.futures import Future

            scheme, seed = task.scheme, task.seed
            submitted.append((scheme, seed, task.extension))
            f = Future()
            f.set_result({"scheme": scheme, "seed": seed})
            return f

    monkeypatch.setattr(lab_compare, "ProcessPoolExecutor", Pool)
    s = replace(PRESETS["tiny"], schemes=("alibi", "rope"), extensions=("pi",), seeds=3, seed=5)
    order, followups = lab_compare._task_order(s)
    display = lab_compare.CompareProgress(1, [], enabled=False)
    rows = lab_compare._run_pool(order, followups, (s,), display, jobs=2, threads=1)
    trained = [t for t in submitted if t[2] is None]
    assert sorted(trained) == [(sc, seed, None) for sc in ("alibi", "rope") for seed in (5, 6, 7)]
    assert sorted(t for t in submitted if t[2] is not None) == [("rope", seed, "pi") for seed in (5, 6, 7)]
    assert len(rows) == 9


def test_protocol_and_copy_fraction_flags_reach_the_report_and_the_training(compared, corpus_dir, tmp_path):
    _, cache, _ = compared
    args = tiny_compare_args(tmp_path, corpus_dir, cache, schemes="alibi")
    assert main(args + ["--protocol", "sliding", "--copy-fraction", "0.5"]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["protocols"] == ["sliding"]
    (row,) = data["results"]
    assert "ppl_past" not in row and row["ppl_sliding"]["16"] > 1 and row["ppl"]["16"] > 1
    md = (tmp_path / "results.md").read_text()
    assert "Protocol `sliding`" in md and "Protocol `windows`" not in md and "Protocol `past`" not in md
    state = json.loads((tmp_path / "models" / "alibi" / "seed-0" / "run.json").read_text())
    assert state["train"]["copy_fraction"] == 0.5


def test_passkey_flags_reach_the_training_and_the_report(compared, corpus_dir, tmp_path):
    _, cache, _ = compared
    args = tiny_compare_args(tmp_path, corpus_dir, cache, schemes="alibi")
    args += ["--train-len", "40", "--eval-mults", "1,2", "--passkey-fraction", "0.5", "--passkey-trials", "3"]
    assert main(args) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    (row,) = data["results"]
    assert data["passkey_trials"] == 3 and set(row["passkey"]) == {"40", "80"}
    assert all(v in (0.0, 1 / 3, 2 / 3, 1.0) for v in row["passkey"].values())
    md = (tmp_path / "results.md").read_text()
    assert "Passkey retrieval: 3 prompts per length" in md and "trained with a passkey share of 0.5" in md
    state = json.loads((tmp_path / "models" / "alibi" / "seed-0" / "run.json").read_text())
    assert state["train"]["passkey_fraction"] == 0.5
    again = tmp_path / "none"
    assert main(tiny_compare_args(again, corpus_dir, cache, schemes="alibi") + ["--passkey-trials", "0"]) == 0
    data = json.loads((again / "results.json").read_text())
    assert "passkey" not in data["results"][0] and "Passkey" not in (again / "results.md").read_text()


def test_the_mix_reaches_the_training_the_provenance_and_the_recall_probe(compared, corpus_dir, tmp_path):
    _, cache, _ = compared
    args = tiny_compare_args(tmp_path, corpus_dir, cache, schemes="alibi")
    assert main(args + ["--mix", "copy=0.25, recall=0.5"]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["provenance"]["settings"]["mix"] == "recall=0.5,copy=0.25"  # canonical
    (row,) = data["results"]
    assert set(row["recall"]) == set(row["recall_gain"]) == {str(n) for n in data["eval_lens"]}
    assert row["recall_gain"]["16"] is None and row["recall_gain"]["32"] > 0
    assert all(0 <= v <= 1 for v in row["recall"].values())
    assert "trained with mix recall=0.5,copy=0.25" in (tmp_path / "results.md").read_text()
    state = json.loads((tmp_path / "models" / "alibi" / "seed-0" / "run.json").read_text())
    assert state["train"]["mix"] == "recall=0.5,copy=0.25"


def test_a_finished_model_trained_with_other_settings_is_refused_not_reused(
    compared, corpus_dir, tmp_path, capsys
):
    _, cache, _ = compared
    args = tiny_compare_args(tmp_path, corpus_dir, cache, schemes="alibi")
    assert main(args) == 0
    capsys.readouterr()
    assert main(args + ["--copy-fraction", "0.5"]) == 2  # same --out, a model trained without copies
    assert "train.copy_fraction: checkpoint has None, requested 0.5" in capsys.readouterr().err


def test_a_scheme_given_by_path_keeps_its_models_under_out(compared, corpus_dir, tmp_path):
    _, cache, _ = compared
    user = tmp_path / "mine.py"
    user.write_text(
        "import posenc\nfrom posenc.lab.encodings import Encoding\n\n\ndef alibi(cfg):\n"
        "    return Encoding(bias=posenc.ALiBi(cfg.n_head))\n"
    )
    spec = f"{user}:alibi"
    try:
        assert main(tiny_compare_args(tmp_path / "out", corpus_dir, cache, schemes=spec)) == 0
    finally:
        ENCODINGS.pop(spec, None)  # registered on first use; other tests list the registry
    (run,) = (tmp_path / "out" / "models").iterdir()
    assert (run / "seed-0" / "checkpoints" / "latest").exists()
    assert not (tmp_path / "mine.py:alibi").exists()
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    assert [r["scheme"] for r in rows] == [spec]


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_a_killed_compare_takes_its_workers_and_queue_manager_with_it(corpus_dir, tmp_path):
    """SIGKILL of the compare process: its training workers and the queue's manager end within seconds,
    instead of training on and writing checkpoints into --out."""
    import signal
    import sys
    import time

    args = tiny_compare_args(tmp_path / "out", corpus_dir, tmp_path / "cache", jobs=2, schemes="alibi,rope")
    proc = subprocess.Popen([sys.executable, "-m", "posenc.cli", *args, "--steps", "1000000"], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        latest = [
            tmp_path / "out" / "models" / s / "seed-0" / "checkpoints" / "latest" for s in ("alibi", "rope")
        ]
        while not all(p.exists() for p in latest):  # both workers are training
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        children = _children(proc.pid)
        assert len(children) >= 3  # two workers and the manager (and the resource tracker)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 15
    while (alive := {p for p in children if Path(f"/proc/{p}").exists() and "Z" not in _state(p)}) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert not alive


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_a_corrupt_saved_row_is_set_aside_and_evaluated_again(compared, corpus_dir, tmp_path, capsys):
    """A damaged eval.json stopped compare with a bare JSON error; the row is derived from the checkpoint,
    which is kept, so it is evaluated again and the damaged file kept beside it."""
    import shutil

    out, cache, _ = compared
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    saved = copy / "models" / "rope" / "seed-0" / "eval.json"
    # other tests of this module add seeds to ``out``; this model's own saved row is what must come back,
    # all but its timings
    before = json.loads(saved.read_text())["row"]
    saved.write_text('{"key": {"steps": ')
    assert main(tiny_compare_args(copy, corpus_dir, cache)) == 0
    assert "eval.json' is corrupt" in capsys.readouterr().err
    assert saved.with_name("eval.json.corrupt").exists()
    after = json.loads(saved.read_text())["row"]
    timings = ("train_s", "eval_s")
    assert {k: v for k, v in after.items() if k not in timings} == {
        k: v for k, v in before.items() if k not in timings
    }


def test_a_saved_row_without_a_newer_measure_is_evaluated_again(compared, corpus_dir, tmp_path):
    """A row saved before a measure existed (here: without "reach") is measured again, not reused with the
    measure missing; the model is not retrained."""
    import shutil

    out, cache, _ = compared
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    saved = copy / "models" / "rope" / "seed-0" / "eval.json"
    stamp = (copy / "models" / "rope" / "seed-0").rglob("model.safetensors")
    stamps = {p: p.stat().st_mtime_ns for p in stamp}
    old = json.loads(saved.read_text())
    before = old["row"].pop("reach")
    saved.write_text(json.dumps(old))
    assert main(tiny_compare_args(copy, corpus_dir, cache)) == 0
    assert json.loads(saved.read_text())["row"]["reach"] == before
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
