"""posenc plot frequencies: the spectra it computes, the figure it builds, and the command."""

import argparse

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
    [("--factor", "0.5", "factor"), ("--head-dim", "7", "head_dim"), ("--base", "-1", "rope_theta")],
)
def test_bad_arguments(tmp_path, capsys, flag, value, word):
    args = parser().parse_args(["plot", "frequencies", flag, value, "--out", str(tmp_path / "x.png")])
    assert args.func(args) == 2
    assert word in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
