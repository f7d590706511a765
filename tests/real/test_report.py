"""posenc.real.report: the tables and the summary say what the payload holds; partial runs still report."""

import json

import pytest

from posenc.real import report


def _row(method, ppl, passkey, short):
    lengths = ("100", "200")
    return {
        "method": method,
        "description": f"{method} description",
        "scaling": None,
        "ppl": dict(zip(lengths, ppl, strict=True)),
        "ppl_all": dict(zip(lengths, ppl, strict=True)),
        "ppl_short": short,
        "passkey": dict(zip(lengths, passkey, strict=True)),
        "passkey_hits": {n: round(4 * p) for n, p in zip(lengths, passkey, strict=True) if p is not None},
        "passkey_ci95": {
            n: [max(0.0, p - 0.3), min(1.0, p + 0.3)]
            for n, p in zip(lengths, passkey, strict=True)
            if p is not None
        },
        "passkey_trials": {},
        "ppl_by_context": {
            "200": [[0, 64, ppl[1] * 2], [64, 128, ppl[1]], [128, 199, ppl[1]]] if ppl[1] else None
        },
        "same_as": {"100": "none"} if method == "dynamic" else {},
        "seconds": 12.0,
        "seconds_by_length": {"100": 4.0, "200": 8.0},
        "peak_mib": 300.0,
    }


@pytest.fixture
def payload():
    rows = [
        _row("none", (5.0, 900.0), (1.0, 0.0), 8.0),
        _row("pi", (9.0, 11.0), (0.5, 0.5), 10.0),
        _row("dynamic", (5.0, 7.5), (1.0, 0.75), 8.0),
        _row("yarn", (5.5, None), (1.0, None), 8.4),  # a run still going: yarn at 200 not measured yet
    ]
    return {
        "model": {
            "name": "tiny",
            "model_type": "llama",
            "parameters": 1.5e6,
            "dtype": "float32",
            "device": "cpu",
        },
        "train_len": 100,
        "factor": 2.0,
        "lengths": [100, 200],
        "score_tokens": 12,
        "short_tokens": 99,
        "short_length": 100,
        "corpus": {"path": None, "windows": [{"document": "a.py", "end": 900}]},
        "passkey": {"trials": 4, "digits": 5, "seed": 0, "chat_template": True},
        "results": rows,
        "provenance": {},
    }


def test_the_summary_names_the_best_method_by_each_measure_and_the_short_prompt_costs(payload):
    rows = payload["results"]
    best = min((r["ppl"]["200"], r["method"]) for r in rows if r["ppl"]["200"] is not None)
    facts = report.summary(payload)
    assert (
        facts[0]
        == f"At 200 tokens (2x) the lowest perplexity is {best[1]}'s, {best[0]:.2f} (as trained: 900.00)."
    )
    assert facts[1] == "Passkey at 200 tokens: best 0.75 (dynamic)."
    none = rows[0]["ppl_short"]
    costs = ", ".join(f"{r['method']} {100 * (r['ppl_short'] / none - 1):+.1f}%" for r in rows[1:])
    assert (
        facts[2] == f"Short prompts (the first 99 tokens), perplexity against the model as trained: {costs}."
    )


def test_the_markdown_says_not_applicable_apart_from_not_measured_yet(payload):
    """A killed run's report said n/a both for a cell the method cannot run and for one not reached yet."""
    payload["results"].append(_row("string", (5.2, None), (1.0, None), 8.1))
    payload["results"][-1]["not_applicable"] = {"200": "its distances would pass the trained length"}
    text = report.markdown(payload)
    assert text.startswith("# posenc extend: tiny\n")
    assert "| yarn | 5.50 | not run yet |" in text and "| string | 5.20 | n/a |" in text
    assert "| yarn | 1.00 [0.70, 1.00] | not run yet |" in text
    assert "the same command again continues" in text
    assert "| dynamic | 1.00 [0.70, 1.00] | 0.75 [0.45, 1.00] |" in text
    assert "@100: same schedule as none, measured once" in text
    assert "- **pi**: pi description" in text


def test_write_puts_every_file_in_place(payload, tmp_path):
    pytest.importorskip("matplotlib")
    text, files = report.write(tmp_path / "out", payload)
    assert [f.rsplit("/", 1)[1] for f in files] == ["results.json", "results.md", "extend.png"]
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == payload
    assert (tmp_path / "out" / "results.md").read_text() == text
    _, files = report.write(tmp_path / "partial", payload, figure=False)
    assert not (tmp_path / "partial" / "extend.png").exists() and len(files) == 2


def test_the_suggestion_follows_its_stated_rule(payload):
    rows = payload["results"]
    # passkey at 200: dynamic 0.75 with interval [0.45, 1.0]; pi's 0.5 lies inside it, none's 0.0 does not
    inside = [r for r in rows[1:] if r["passkey"]["200"] is not None and r["passkey"]["200"] >= 0.45]
    want = min(inside, key=lambda r: r["ppl"]["200"])["method"]
    assert report.suggestion(payload).startswith(f"Suggested start at 200 tokens: {want} (perplexity ")
    assert report.summary(payload)[-1] == report.suggestion(payload)
    for r in rows:  # without passkey: the lowest perplexity there
        r["passkey"] = {n: None for n in r["passkey"]}
    best = min((r for r in rows[1:] if r["ppl"]["200"] is not None), key=lambda r: r["ppl"]["200"])
    assert f": {best['method']} (perplexity" in report.suggestion(payload)
    assert "no passkey was measured" in report.suggestion(payload)  # its rule is stated as the one applied
    payload["lengths"] = [100]
    assert report.suggestion(payload) is None  # nothing past the trained length


def test_every_label_of_the_figure_lies_inside_it(payload):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = report.extend_figure(payload)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in fig.axes:
        for text in [ax.yaxis.label, ax.xaxis.label, ax.title]:
            if text.get_text():
                box = text.get_window_extent(renderer)
                assert (
                    box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y0 >= 0 and box.y1 <= fig.bbox.height
                ), f"{text.get_text()!r} at {box} leaves the figure"
