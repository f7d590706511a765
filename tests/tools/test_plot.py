"""posenc plot frequencies: the spectra it computes, the figure it builds, and the command."""

import argparse
import sys

import numpy as np
import pytest

from posenc import reference as R
from posenc.tools import plot as plots


def test_wavelengths_follow_each_method():
    factor, head_dim, base, orig = 8.0, 128, 10000.0, 4096
    w = plots.wavelengths(head_dim, base, factor, orig)
    default = 2 * np.pi / R.inverse_frequencies(head_dim, base)
    np.testing.assert_allclose(w["default RoPE"], default, rtol=1e-12)
    np.testing.assert_allclose(w["PI (linear) x8"], factor * default, rtol=1e-12)
    for name in ("NTK-aware", "YaRN", "Llama 3.1"):  # fast pairs kept, the slowest interpolated by the factor
        assert w[name][0] == pytest.approx(default[0], rel=1e-12)
        assert w[name][-1] == pytest.approx(factor * default[-1], rel=1e-9)
        assert np.all(w[name] >= default * (1 - 1e-12)) and np.all(w[name] <= factor * default * (1 + 1e-12))
    # YaRN and Llama 3.1 leave every pair that turns more than ~32 / 4 times in the original context alone
    assert np.allclose(w["YaRN"][default < orig / 32 / 2], default[default < orig / 32 / 2])
    assert np.allclose(w["Llama 3.1"][default < orig / 4], default[default < orig / 4])


def test_frequency_figure_draws_each_method_and_both_context_lengths():
    fig = plots.frequency_figure(head_dim=64, base=500000.0, factor=4.0, original_length=2048)
    (ax,) = fig.axes
    assert ax.get_title() == "RoPE wavelengths at factor 4 (head_dim 64, base 500000)"
    assert ax.get_xlabel() == "dimension pair k (fast to slow)" and ax.get_yscale() == "log"
    waves = plots.wavelengths(64, 500000.0, 4.0, 2048)
    *methods, original, extended = ax.get_lines()
    assert (
        [line.get_label() for line in methods]
        == list(waves)
        == [t.get_text() for t in ax.get_legend().get_texts()]
    )
    for line, w in zip(methods, waves.values(), strict=True):
        np.testing.assert_array_equal(line.get_xdata(), np.arange(32))
        np.testing.assert_allclose(line.get_ydata(), w)
    assert list(original.get_ydata()) == [2048, 2048] and list(extended.get_ydata()) == [8192, 8192]
    assert [t.get_text() for t in ax.texts] == ["original context 2,048", "extended context 8,192"]


def parser():
    p = argparse.ArgumentParser(prog="posenc")
    plots.add_commands(p.add_subparsers(dest="command"))
    return p


def test_command_writes_a_png(tmp_path, capsys):
    out = tmp_path / "sub" / "f.png"
    argv = ["plot", "frequencies", "--factor", "4", "--head-dim", "64", "--base", "500000", "--out", str(out)]
    args = parser().parse_args(argv)
    assert args.func(args) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert str(out) in capsys.readouterr().out


def test_command_through_posenc_cli(tmp_path):
    from posenc.cli import main

    out = tmp_path / "f.png"
    assert main(["plot", "frequencies", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "flag, value, word",
    [
        ("--factor", "0.5", "factor"),
        ("--head-dim", "7", "head_dim"),
        ("--base", "-1", "--base -1.0 must be > 1"),
        ("--base", "1", "--base 1.0 must be > 1"),  # once a ZeroDivisionError inside YaRN
        ("--base", "nan", "--base nan must be > 1"),
    ],
)
def test_bad_arguments(tmp_path, capsys, flag, value, word):
    args = parser().parse_args(["plot", "frequencies", flag, value, "--out", str(tmp_path / "x.png")])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert word in err and err.startswith("posenc plot frequencies: error: ") and len(err.splitlines()) == 1
    assert not (tmp_path / "x.png").exists()


def test_out_without_suffix_writes_and_prints_the_png_it_wrote(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = parser().parse_args(["plot", "frequencies", "--head-dim", "16", "--out", "spectrum"])
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == "spectrum.png"
    assert (tmp_path / "spectrum.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "spectrum").exists()


@pytest.mark.parametrize("where, word", [("dir", "is a directory"), ("file/x.png", "is a file")])
def test_out_that_cannot_be_written_is_refused(tmp_path, capsys, where, word):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    args = parser().parse_args(["plot", "frequencies", "--out", str(tmp_path / where)])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc plot frequencies: error: --out") and word in err


def test_without_matplotlib_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    args = parser().parse_args(["plot", "frequencies", "--out", str(tmp_path / "x.png")])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "pip install posenc[plot]" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.png").exists()


# ------------------------------------------------------------------------------------------ plot plan
LLAMA4 = {
    "model_type": "llama4",
    "text_config": {
        "model_type": "llama4_text",
        "num_hidden_layers": 8,
        "head_dim": 64,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "attention_chunk_size": 8192,
        "max_position_embeddings": 1048576,
        "rope_theta": 500000.0,
        "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0],
    },
}
GEMMA3 = {
    "model_type": "gemma3_text",
    "num_hidden_layers": 6,
    "head_dim": 32,
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 1024,
    "sliding_window_pattern": 3,
}


def test_plan_figure_shows_each_layer_and_each_rope():
    from posenc.hf import position_plan

    plan = position_plan(GEMMA3)
    fig = plots.plan_figure(plan, "gemma3", context=131072)
    top, bottom = fig.axes
    assert top.get_title() == "gemma3: encoding and attention span per layer"
    bars = [bar for container in top.containers for bar in container]
    assert len(bars) == 6 and top.get_yscale() == "log"
    assert sorted((round(b.get_x() + b.get_width() / 2), b.get_height()) for b in bars) == [
        (0, 1024),
        (1, 1024),
        (2, 131072),
        (3, 1024),
        (4, 1024),
        (5, 131072),
    ]
    labels = [t.get_text() for t in top.get_legend().get_texts()]
    assert len(labels) == 2 and "linear x8" in labels[1] and "base=10000" in labels[0]
    # one spectrum per distinct RoPE: local base 1e4, global base 1e6 stretched x8 by linear scaling
    local, global_ = bottom.get_lines()
    np.testing.assert_allclose(local.get_ydata(), 2 * np.pi / R.inverse_frequencies(32, 1e4))
    np.testing.assert_allclose(global_.get_ydata(), 8 * 2 * np.pi / R.inverse_frequencies(32, 1e6))
    assert bottom.get_title() == "RoPE wavelength spectrum of each layer type"


def test_plan_figure_marks_nope_and_chunked_layers():
    from posenc.hf import position_plan

    fig = plots.plan_figure(position_plan(LLAMA4), "llama4", context=1048576)
    top, bottom = fig.axes
    rope_bars, nope_bars = top.containers
    assert [round(b.get_x() + 0.4) for b in nope_bars] == [3, 7]
    assert all(b.get_height() == 1048576 for b in nope_bars)
    assert all(b.get_height() == 8192 and b.get_hatch() == "//" for b in rope_bars)
    assert [t.get_text() for t in top.get_legend().get_texts()][1] == "NoPE"
    assert len(bottom.get_lines()) == 1  # NoPE layers have no spectrum


def test_plan_summary_one_line_per_layer_type():
    from posenc.hf import position_plan

    lines = plots.plan_summary(position_plan(LLAMA4))
    assert len(lines) == 2
    assert lines[0].startswith("  6 layer(s) [0,1,2,4,5,6]: RoPE(base=500000") and "chunked 8192" in lines[0]
    assert lines[1] == "  2 layer(s) [3,7]: NoPE | full | query x log1p(floor((p+1)/8192))*0.1+1"


def test_plan_command_reads_a_file_and_the_local_cache(tmp_path, capsys, monkeypatch):
    import json

    config = tmp_path / "config.json"
    config.write_text(json.dumps(GEMMA3))
    out = tmp_path / "plan.png"
    args = parser().parse_args(["plot", "plan", str(config), "--out", str(out)])
    assert args.func(args) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3 and printed[-1] == str(out) and out.read_bytes()[:4] == b"\x89PNG"
    # a model id found in a Hugging Face cache folder (laid out as huggingface_hub lays it out)
    cache = tmp_path / "hub"
    snapshot = cache / "models--org--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(LLAMA4))
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    args = parser().parse_args(["plot", "plan", "org/tiny", "--out", str(tmp_path / "p2.png")])
    assert args.func(args) == 0
    assert "NoPE" in capsys.readouterr().out


def test_plan_out_without_suffix_writes_and_prints_the_png_it_wrote(tmp_path, capsys, monkeypatch):
    """matplotlib writes NAME.png for --out NAME: that is the path printed, and NAME is not created."""
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3))
    args = parser().parse_args(["plot", "plan", "config.json", "--out", "layers"])
    assert args.func(args) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "layers.png"
    assert (tmp_path / "layers.png").read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "layers").exists()


def test_save_figure_returns_the_file_it_wrote(tmp_path):
    from matplotlib.figure import Figure

    from posenc.tools.plot import save_figure

    written = save_figure(Figure(), tmp_path / "sheet")
    assert written == tmp_path / "sheet.png" and written.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sheet.png"]


@pytest.mark.parametrize("kind", ["frequencies", "plan"])
def test_an_image_format_matplotlib_cannot_write_is_refused_before_drawing(kind, tmp_path, capsys):
    import json

    (tmp_path / "config.json").write_text(json.dumps(GEMMA3))
    what = [str(tmp_path / "config.json")] if kind == "plan" else []
    args = parser().parse_args(["plot", kind, *what, "--out", str(tmp_path / "figure.v2")])
    assert args.func(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"posenc plot {kind}: error: --out ") and "cannot write '.v2' images" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_plan_command_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    args = parser().parse_args(["plot", "plan", "org/not-here", "--out", str(tmp_path / "x.png")])
    assert args.func(args) == 2
    assert "never downloads" in capsys.readouterr().err and not (tmp_path / "x.png").exists()
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "num_hidden_layers": 2, "head_dim": 16, "rope_magic": 1}')
    args = parser().parse_args(["plot", "plan", str(bad), "--out", str(tmp_path / "x.png")])
    assert args.func(args) == 2
    assert "'rope_magic'" in capsys.readouterr().err
