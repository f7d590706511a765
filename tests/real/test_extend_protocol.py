"""The protocol of ``posenc extend`` on a tiny model: the model's own baseline ladder, the tasks asked of the
model as trained alone up to N where the budget says so, the needle's gain of every question, and LongPPL's
key tokens picked once by the model as trained."""

import json
from pathlib import Path

from posenc.cli import main
from posenc.real.tasks import min_length


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_the_ladder_and_the_baseline_run_the_model_as_trained_alone(tiny_llama_folder, tmp_path, monkeypatch):
    import posenc.real.extend as extend
    from posenc.real.budgets import BUDGETS, Budget

    least = min_length("niah_single_1", _tokenizer(tiny_llama_folder))
    n = 2 << least.bit_length()  # the trained length taken: a power of two the task fits at half of
    budget = Budget(
        "tiny",
        "test",
        (1, 2),
        1,
        2,
        answer_slack=4,
        tasks=("niah_single_1",),
        ladder=(0.5,),
        baseline_within=True,
    )
    monkeypatch.setitem(BUDGETS, "tiny", budget)
    out = tmp_path / "o"
    args = ["extend", "--model", str(tiny_llama_folder), "--out", str(out), "--no-progress", "--no-plot"]
    args += ["--budget", "tiny", "--methods", "none,yarn", "--train-len", str(n)]
    assert extend.check_budget("tiny") is BUDGETS["tiny"] and main(args) == 0
    payload = json.loads((out / "results.json").read_text())
    asked = {(e["method"], e["length"]) for e in payload["trials"]}
    assert asked == {("none", n // 2), ("none", n), ("none", 2 * n), ("yarn", 2 * n)}
    assert payload["tasks"]["ladder"] == [n // 2] and payload["tasks"]["baseline_within"]
    for e in payload["trials"]:  # every question has its gain, and the haystack it was asked in
        assert (
            e["gain"] == round((e["logprob"] - e["control_logprob"]) / e["gold_tokens"], 6)
            or abs(e["gain"] - (e["logprob"] - e["control_logprob"]) / e["gold_tokens"]) < 1e-5
        )
        assert e["haystack"] == "/".join(e["trial"].split("/")[:3])
    rows = {r["method"]: r for r in payload["results"]}
    assert rows["none"]["longppl_keys"] == rows["yarn"]["longppl_keys"] is not None  # picked once
    md = (out / "results.md").read_text()
    assert "| yarn | not asked | not asked |" in md  # the ladder and N: the model as trained alone
    assert "## Needle gain" in md and "Relative to the model's own baseline" in md
