"""``posenc extend`` with the task suite, end to end on both real models at a short setting: every method on
the same questions, each answer what transformers' own greedy decoding writes, the plans recorded, the
paired statistics in the report, a rerun that runs nothing, bad task settings refused before any work."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from posenc.cli import main
from posenc.real import trials as trials_module
from posenc.real.tasks import make_trials, score

N, LONG = 352, 704  # SmolLM2 run with its trained length taken as N, and at 2N
SMOLLM2 = ["--lengths", f"{N},{LONG}", "--train-len", str(N), "--methods", "none,yarn,selfextend"]
GEMMA = ["--lengths", "768", "--train-len", "384", "--methods", "none,yarn,nope-global-temp"]
COMMON = ["--tasks", "passkey,niah_noise", "--trials", "1", "--questions", "2", "--windows", "1"]
COMMON += ["--answer-tokens", "12", "--no-progress", "--no-plot"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    import json.decoder

    path = tmp_path_factory.mktemp("corpus") / "decoder.py"
    shutil.copy(json.decoder.__file__, path)
    return path


def _extend(folder, corpus, out, flags) -> dict:
    args = ["extend", "--model", str(folder), "--corpus", str(corpus), "--out", str(out), *COMMON, *flags]
    assert main(args) == 0
    return json.loads((out / "results.json").read_text())


def test_smollm2_on_the_tasks(smollm2_folder, smollm2, corpus, tmp_path, monkeypatch):
    """One run (the slow part), each property of it checked by a function below."""
    run = (tmp_path, _extend(smollm2_folder, corpus, tmp_path, SMOLLM2))
    every_method_answers_the_same_questions_at_every_length(run)
    an_answer_is_transformers_greedy_decoding_of_the_whole_prompt(run, smollm2)
    the_report_has_the_plans_the_scores_and_the_paired_comparisons(run)
    a_rerun_runs_no_trial(run, smollm2_folder, corpus, monkeypatch)


def every_method_answers_the_same_questions_at_every_length(smollm2_run):
    _, payload = smollm2_run
    entries = payload["trials"]
    keys: dict[tuple, list] = {}
    for e in entries:
        keys.setdefault((e["method"], e["length"]), []).append(e["trial"])
    assert set(keys) == {(m, n) for m in ("none", "yarn", "selfextend") for n in (N, LONG)}
    for n in (N, LONG):  # one set of questions per length, the same for every method
        assert len({tuple(sorted(ids)) for (m, length), ids in keys.items() if length == n}) == 1
    assert all(len(ids) == 3 for ids in keys.values())  # passkey asks once, niah_noise twice
    assert {e["task"] for e in entries} == {"passkey", "niah_noise"}
    costs = payload["trial_costs"]
    assert costs[str(N)]["questions"] == 3 * 3 and costs[str(N)]["forwards"] == 3 * 2


def an_answer_is_transformers_greedy_decoding_of_the_whole_prompt(smollm2_run, smollm2):
    """The model as trained at N tokens: no patch changes it, so the unpatched model's own generate on
    prefix + question must write the saved answer."""
    _, payload = smollm2_run
    trial = make_trials("niah_noise", smollm2.tokenizer, N, 1, seed=0, questions=2)[0]
    saved = {e["trial"]: e for e in payload["trials"] if e["method"] == "none" and e["length"] == N}
    for i, q in enumerate(trial.questions):
        with torch.inference_mode():
            out = smollm2.model.generate(
                torch.tensor([list(trial.prefix) + list(q.ids)]), max_new_tokens=12, do_sample=False
            )
        written = out[0, len(trial.prefix) + len(q.ids) :].tolist()
        stop = smollm2.model.generation_config.eos_token_id
        stop = set(stop if isinstance(stop, list) else [stop])
        cut = next((k for k, t in enumerate(written) if t in stop), len(written))
        text = smollm2.tokenizer.decode(written[:cut], skip_special_tokens=True)
        entry = saved[trial.question_id(i)]
        assert text.startswith(entry["answer"])  # the run stops once every expected string is written
        assert entry["score"] == score(q.expected, entry["answer"]) == score(q.expected, text)


def the_report_has_the_plans_the_scores_and_the_paired_comparisons(smollm2_run):
    out, payload = smollm2_run
    plans = {r["method"]: r["plan"] for r in payload["results"]}
    assert plans["selfextend"][1].startswith("attention remapped: SelfExtend(")
    assert "yarn" in plans["yarn"][0]
    md = (out / "results.md").read_text()
    for heading in ("## Scores per task", "## Paired comparisons", "## Effective length", "Suggested start"):
        assert heading in md
    assert "none vs yarn" in md and "yarn vs selfextend" in md


def a_rerun_runs_no_trial(smollm2_run, smollm2_folder, corpus, monkeypatch):
    out, payload = smollm2_run

    def refuse(*args, **kwargs):
        raise AssertionError("a saved trial was run again")

    monkeypatch.setattr(trials_module, "run_trials", refuse)
    monkeypatch.setattr("posenc.real.extend.run_trials", refuse)
    again = _extend(smollm2_folder, corpus, out, SMOLLM2)
    assert again["trials"] == payload["trials"]


def test_gemma_runs_its_plans_on_the_tasks(gemma3_folder, corpus, tmp_path):
    payload = _extend(gemma3_folder, corpus, tmp_path, [*GEMMA, "--tasks", "passkey"])
    plans = {r["method"]: r["plan"] for r in payload["results"]}
    assert any(
        "NoPE | full" in line and "query x max(1,ln(p+1)/ln 384)" in line
        for line in plans["nope-global-temp"]
    )
    assert any("yarn x2" in line and "full" in line for line in plans["yarn"])
    assert all("yarn" not in line for line in plans["yarn"] if "sliding" in line)  # global layers only
    assert len(payload["trials"]) == 3  # three methods, one length, one passkey question


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tasks", "niah"], "unknown task 'niah'"),
        (["--tasks", "cwe", "--lengths", "256,512"], "--tasks cwe needs at least"),
        (["--methods", "selfextend@global"], "takes no layer set"),
        (["--layers", "every:0"], "every:K needs a positive integer K"),
    ],
)
def test_bad_task_settings_are_refused_before_any_forward(
    flags, message, smollm2_folder, corpus, tmp_path, capsys, monkeypatch
):
    def refuse(*args, **kwargs):
        raise AssertionError("a forward ran before the settings were checked")

    monkeypatch.setattr("posenc.real.extend.run_trials", refuse)
    base = ["extend", "--model", str(smollm2_folder), "--corpus", str(corpus), "--out", str(tmp_path / "o")]
    defaults = ["--lengths", "448,896", "--train-len", "448", "--no-progress", "--no-plot"]
    assert main(base + defaults + flags) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
