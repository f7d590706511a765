"""``posenc bench --only questions`` (posenc.tools.benchmarks.questions): one row answers a haystack's
questions both ways, on the real model, and says how many answers agree."""

from posenc.tools.benchmarks import questions


def test_a_row_answers_every_question_both_ways(smollm2, monkeypatch):
    monkeypatch.setattr(questions, "QUESTIONS", 3)
    monkeypatch.setattr(questions, "ANSWER_TOKENS", 2)
    with questions._method(smollm2.model, "rerope", 1024):
        row = questions.measure(smollm2, "vt", 1024)
    assert row["questions"] == 3 and row["lengths"] == 1 and row["same"] == 3
    assert row["x_batched"] == row["alone_s"] / row["batched_s"] > 0
    assert smollm2.model.config._attn_implementation == "sdpa"  # unpatched after the case
    table = questions.questions_table([{"task": "vt", "method": "rerope", "seq": 1024, **row}])
    assert "rerope" in table and "3 (1 lengths)" in table
