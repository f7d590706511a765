"""posenc.lab.report: markdown tables, results.json / details.json / results.md, the extrapolation figure."""

import json
from dataclasses import replace

import numpy as np
import pytest

from posenc.lab.config import PRESETS
from posenc.lab.report import (
    copy_table,
    extrapolation_figure,
    gain_table,
    markdown_table,
    passkey_table,
    past_table,
    ratio,
    sliding_table,
    write_reports,
)
from posenc.lab.stats import wilson_interval

PAYLOAD = {
    "train_len": 8,
    "eval_lens": [8, 16, 32],
    "corpus": "/c",
    "results": [
        {"scheme": "rope", "ppl": {"8": 3.0, "16": 4.0, "32": 6.0}, "note": None},
        {"scheme": "rope+yarn", "ppl": {"8": 3.0, "16": 3.5, "32": 4.0}, "note": None},
        {"scheme": "learned", "ppl": {"8": 3.2, "16": None, "32": None}, "note": "n/a"},
        {"scheme": "broken", "ppl": {"8": None, "16": None, "32": None}, "note": "n/a"},
    ],
}


def test_ratio_and_table_formatting():
    rows = [
        {"scheme": "a", "ppl": {"8": 2.0, "32": 3.0}, "note": None},
        {"scheme": "b", "ppl": {"8": 2.0, "32": None}, "note": "n/a | why"},
    ]
    assert ratio(rows[0], 32, 8) == 1.5 and ratio(rows[1], 32, 8) is None
    table = markdown_table(rows, [8, 32], 8)
    assert "| a | 2.00 | 3.00 | 1.500 |  |" in table
    assert "| b | 2.00 | n/a | n/a | n/a / why |" in table


def test_past_table_has_the_longer_lengths_only():
    rows = [{"scheme": "a", "ppl_past": {"8": None, "16": 2.5, "32": None}}]
    assert past_table(rows, [8, 16, 32], 8) == (
        "| scheme | ppl past 8 @16 | ppl past 8 @32 |\n|---|---:|---:|\n| a | 2.50 | n/a |"
    )
    assert past_table(rows, [8], 8) == ""


def test_extrapolation_figure_draws_one_line_per_measured_scheme_and_the_training_length():
    fig = extrapolation_figure(PAYLOAD)
    ax, gain = fig.axes
    assert ax.get_title() == "Length extrapolation: trained short, evaluated long"
    assert ax.get_xlabel() == "evaluation length (tokens)" and ax.get_ylabel() == "perplexity (bytes)"
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["rope", "rope+yarn", "learned", "train length 8"]  # "broken" has no point to draw
    assert [t.get_text() for t in ax.get_legend().get_texts()] == labels
    lines = dict(zip(labels, ax.get_lines(), strict=True))
    assert list(lines["rope"].get_xdata()) == [8, 16, 32] and list(lines["rope"].get_ydata()) == [
        3.0,
        4.0,
        6.0,
    ]
    assert list(lines["learned"].get_xdata()) == [8]
    assert lines["rope"].get_linestyle() == "-" and lines["rope+yarn"].get_linestyle() == "--"
    assert list(lines["train length 8"].get_xdata()) == [8, 8]
    assert not ax.collections  # one seed: no error bars
    assert [line.get_label() for line in gain.get_lines()][-1].startswith("no gain")


def test_the_figure_has_error_bars_of_one_sd_and_a_gain_panel():
    payload = {
        "train_len": 8,
        "results": [
            {
                "scheme": "alibi",
                "ppl": {"8": 3.0, "16": 2.9, "32": None},
                "ppl_sd": {"8": 0.1, "16": 0.2, "32": None},
                "gain": {"8": None, "16": 1.1, "32": 0.9},
                "gain_sd": {"8": None, "16": 0.05, "32": 0.0},
            }
        ],
    }
    payload_axes = extrapolation_figure(payload).axes
    ax, gain = payload_axes
    (bars,) = ax.collections  # the vertical error bars, one segment per point
    segments = np.array([seg for seg in bars.get_segments()])  # mean -/+ sd at each measured length
    np.testing.assert_allclose(
        segments, [[[8, 3.0 - 0.1], [8, 3.0 + 0.1]], [[16, 2.9 - 0.2], [16, 2.9 + 0.2]]]
    )
    (line,) = [ln for ln in gain.get_lines() if ln.get_label() == "alibi"]
    assert list(line.get_xdata()) == [16, 32] and list(line.get_ydata()) == [1.1, 0.9]
    assert len(payload_axes) == 2


def test_cells_show_mean_and_sd_when_there_is_a_spread():
    rows = [
        {
            "scheme": "rope",
            "ppl": {"8": 3.0, "16": 4.5},
            "ppl_sd": {"8": 0.125, "16": None},
            "ppl_sliding": {"8": 2.0, "16": 2.25},
            "ppl_sliding_sd": {"8": 0.5, "16": 0.25},
            "gain": {"8": None, "16": 0.75},
            "gain_sd": {"8": None, "16": 0.0125},
            "copy_first": {"8": 5.0, "16": 6.0},
            "copy_repeat": {"8": 4.0, "16": 3.0},
            "note": None,
        }
    ]
    assert "| rope | 3.00 ± 0.12 | 4.50 |" in markdown_table(rows, [8, 16], 8)
    assert sliding_table(rows, [8, 16], 8).endswith("| rope | 2.00 ± 0.50 | 2.25 ± 0.25 |")
    assert gain_table(rows, [8, 16], 8) == "| scheme | gain@16 (2x) |\n|---|---:|\n| rope | 0.750 ± 0.013 |"
    assert gain_table(rows, [8], 8) == ""
    assert copy_table(rows, [8, 16], 8).splitlines()[-1] == "| rope | 5.00 | 4.00 | 6.00 | 3.00 |"


def test_write_reports_writes_the_four_files(tmp_path):
    s = replace(PRESETS["tiny"], protocols=("windows", "past"), probe_windows=0, passkey_trials=0)
    rows = [
        {
            "scheme": "alibi",
            "ppl": {"16": 3.0, "32": 2.9, "64": 2.8},
            "ppl_past": {"16": None, "32": 2.7, "64": 2.6},
            "note": None,
            "train_s": 1.0,
            "eval_s": 0.5,
        }
    ]
    prov = {"posenc": "x"}
    table = write_reports(tmp_path, s, rows, corpus="/c", device="cpu", wall_s=12.34, provenance=prov)
    none3 = {"16": None, "32": None, "64": None}
    assert json.loads((tmp_path / "results.json").read_text()) == {
        "train_len": 16,
        "eval_lens": [16, 32, 64],
        "corpus": "/c",
        "seeds": 1,
        "protocols": ["windows", "past"],
        "passkey_trials": 0,
        "provenance": prov,
        "results": [
            {
                "scheme": "alibi",
                "seeds": 1,
                "ppl": {"16": 3.0, "32": 2.9, "64": 2.8},
                "ppl_sd": none3,
                "ppl_past": {"16": None, "32": 2.7, "64": 2.6},
                "ppl_past_sd": none3,
                "note": None,
            }
        ],
    }
    details = json.loads((tmp_path / "details.json").read_text())
    assert details == {"settings": s.to_json(), "device": "cpu", "wall_s": 12.3, "rows": rows}
    assert "| alibi | 3.00 | 2.90 | 2.80 | 0.933 |  |" in table
    md = (tmp_path / "results.md").read_text()
    assert table in md and "Wall time 12 s on cpu." in md and "| alibi | 2.70 | 2.60 |" in md
    assert "Protocol `windows`" in md and "Protocol `past`" in md
    assert "Protocol `sliding`" not in md and "Far-context gain" not in md and "Copy probe" not in md
    assert "Passkey" not in md
    assert (tmp_path / "extrapolation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "details.json",
        "extrapolation.png",
        "results.json",
        "results.md",
    ]


def test_passkey_table_and_panel_show_the_wilson_interval_of_all_seeds_trials():
    rows = [
        {"scheme": "rope", "seeds": 1, "passkey": {"16": None, "64": 0.75, "128": 0.0}, "note": None},
        {"scheme": "alibi", "seeds": 2, "passkey": {"16": None, "64": 0.5, "128": 0.25}, "note": None},
    ]
    table = passkey_table(rows, [16, 64, 128], 64, trials=20)
    low, high = wilson_interval(15, 20)
    assert table.splitlines()[0] == "| scheme | passkey@64 (1x) | passkey@128 (2x) |"
    assert (
        table.splitlines()[2]
        == f"| rope | 0.75 [{low:.2f}, {high:.2f}] | 0.00 [0.00, {wilson_interval(0, 20)[1]:.2f}] |"
    )
    low, high = wilson_interval(20, 40)  # two seeds of 20 prompts each
    assert table.splitlines()[3].startswith(f"| alibi | 0.50 [{low:.2f}, {high:.2f}] |")
    assert passkey_table([{"scheme": "x", "passkey": {}}], [16], 16, trials=5) == ""
    payload = {"train_len": 64, "eval_lens": [16, 64, 128], "passkey_trials": 20, "results": rows}
    payload["results"] = [{**r, "ppl": {"64": 3.0}} for r in rows]
    fig = extrapolation_figure(payload)
    _, _, keys = fig.axes
    assert [line.get_label() for line in keys.get_lines()][:2] == ["rope", "alibi"]
    # the error bars reach the interval's ends
    segments = [c for c in keys.collections if len(c.get_segments())]
    ends = sorted(round(float(y), 6) for c in segments for seg in c.get_segments() for y in seg[:, 1])
    assert round(wilson_interval(15, 20)[0], 6) in ends and round(wilson_interval(15, 20)[1], 6) in ends
    assert len(extrapolation_figure({**payload, "passkey_trials": 0}).axes) == 2


def test_the_recall_panel_draws_the_probe_s_exact_answers_with_one_sd():
    rows = [
        {
            "scheme": "rope",
            "ppl": {"8": 3.0},
            "recall": {"8": 0.5, "16": 0.0},
            "recall_sd": {"8": 0.25, "16": 0.0},
        },
        {"scheme": "swan", "ppl": {"8": 3.0}, "recall": {"8": None, "16": None}},
    ]
    fig = extrapolation_figure({"train_len": 8, "passkey_trials": 0, "results": rows})
    _, _, recall = fig.axes
    assert recall.get_title() == "Associative recall: pairs read from far back"
    (line,) = [ln for ln in recall.get_lines() if ln.get_label() == "rope"]  # swan has nothing to draw
    assert list(line.get_xdata()) == [8, 16] and list(line.get_ydata()) == [0.5, 0.0]
    (bars,) = recall.collections
    np.testing.assert_allclose(bars.get_segments()[0], [[8, 0.25], [8, 0.75]])
    assert recall.get_ylim() == (-0.03, 1.03)
    assert len(extrapolation_figure({"train_len": 8, "results": rows[1:]}).axes) == 2


@pytest.mark.parametrize("panels", [2, 4])
def test_every_axis_label_lies_inside_the_figure(panels):
    """The y label of the left panel was reported cut off at the figure's edge [D8]: every label and tick
    label of every panel must lie inside the saved figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    payload = json.loads(json.dumps(PAYLOAD))
    payload["passkey_trials"] = 0
    if panels == 4:  # passkey and recall panels beside perplexity and gain
        payload["passkey_trials"] = 10
        payload["results"][0] |= {"passkey": {"8": 1.0, "16": 0.5}, "recall": {"8": 0.75, "32": 0.0}}
    fig = extrapolation_figure(payload)
    assert len(fig.axes) == panels
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    for ax in fig.axes:
        lo, hi = ax.bbox.y0, ax.bbox.y1
        for text in [ax.yaxis.label, ax.xaxis.label, ax.title, *ax.get_yticklabels()]:
            if not text.get_text() or not text.get_visible():
                continue
            box = text.get_window_extent(renderer)
            if text in ax.get_yticklabels() and not lo <= (box.y0 + box.y1) / 2 <= hi:
                continue  # a tick outside the view, which is not drawn
            assert box.x0 >= 0 and box.x1 <= width and box.y0 >= 0 and box.y1 <= height, (
                f"{text.get_text()!r} at {box} leaves the {width:.0f}x{height:.0f} figure"
            )
