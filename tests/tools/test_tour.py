"""posenc tour (the claims, the figure sheet) and the command line entry point."""

import subprocess
import sys

import numpy as np
import pytest

from posenc import cli
from posenc.tools import tour


def test_every_claim_holds():
    claims = tour.run_claims()
    failing = [c.text for c in claims if not c.holds]
    assert not failing
    assert {c.section for c in claims} >= {"Sinusoidal", "Learned", "RoPE", "ALiBi", "Why position matters"}
    assert sum(c.section == "Shaw relative positions" for c in claims) == 3


def test_a_failing_claim_fails_the_command(monkeypatch, capsys):
    monkeypatch.setattr(tour, "SECTIONS", [lambda: [tour.Claim("s", "a false claim", "1 != 2", False)]])
    assert cli.main(["tour"]) == 1
    assert "[FAILS] a false claim" in capsys.readouterr().out


def test_tour_figure_shows_three_panels():
    fig = tour.tour_figure()
    sinus, rope, alibi, colorbar = fig.axes  # the colorbar belongs to the sinusoidal panel
    assert [ax.get_title() for ax in (sinus, rope, alibi)] == [
        "Sinusoidal PE (d_model = 128)",
        "RoPE: q.k against offset n - m (q = k = 1)",
        "ALiBi bias for the last query (8 heads)",
    ]
    (image,) = sinus.get_images()
    assert image.get_array().shape == (128, 256)  # dimensions up, positions across
    assert (sinus.get_xlabel(), sinus.get_ylabel()) == ("position p", "dimension")
    assert colorbar.get_ylim() == pytest.approx((-1, 1))

    (line,) = rope.get_lines()
    offsets, scores = line.get_data()
    np.testing.assert_array_equal(offsets, np.arange(2049))
    assert scores[0] == pytest.approx(1.0) and np.all(np.abs(scores) <= 1 + 1e-12)  # q.k / d for unit vectors
    assert rope.get_xscale() == "symlog" and rope.get_xlabel() == "offset n - m"

    lines = alibi.get_lines()
    assert len(lines) == 8 and all(len(line.get_xdata()) == 64 for line in lines)
    assert all(line.get_ydata()[-1] == 0 for line in lines)  # the query attends to itself unbiased
    assert [t.get_text() for t in alibi.get_legend().get_texts()][0] == "head 1: m = 0.5"
    assert (alibi.get_xlabel(), alibi.get_ylabel()) == ("key position j (query at 63)", "bias")


def test_tour_writes_figures(tmp_path, capsys):
    assert cli.main(["tour", "--out", str(tmp_path)]) == 0
    png = tmp_path / "tour.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    out = capsys.readouterr().out
    assert "claims hold" in out and "dots 0.164293" in out


def test_console_script_without_command_prints_help():
    result = subprocess.run([sys.executable, "-m", "posenc.cli"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "tour" in result.stdout


@pytest.mark.parametrize("argv", [["--help"], ["tour", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 0


@pytest.mark.parametrize("where, word", [("afile", "is an existing file"), ("afile/sub", "is a file")])
def test_tour_out_that_cannot_be_written_is_refused_before_the_claims(
    where, word, tmp_path, capsys, monkeypatch
):
    (tmp_path / "afile").write_text("")
    monkeypatch.setattr(tour, "run_claims", lambda: pytest.fail("the claims ran before --out was checked"))
    assert cli.main(["tour", "--out", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc tour: error: --out") and word in err and len(err.splitlines()) == 1


def test_tour_out_without_matplotlib_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    monkeypatch.setattr(
        tour, "run_claims", lambda: pytest.fail("the claims ran before matplotlib was checked")
    )
    assert cli.main(["tour", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc tour: error:") and "pip install posenc[plot]" in err
    assert not (tmp_path / "tour.png").exists()
