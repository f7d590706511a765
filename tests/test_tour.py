"""posenc tour and the command line entry point."""

import subprocess
import sys

import pytest

from posenc import cli
from posenc.tools import tour


def test_every_claim_holds():
    claims = tour.run_claims()
    failing = [c.text for c in claims if not c.holds]
    assert not failing
    assert {c.section for c in claims} >= {"Sinusoidal", "Learned", "RoPE", "ALiBi", "Why position matters"}


def test_a_failing_claim_fails_the_command(monkeypatch, capsys):
    monkeypatch.setattr(tour, "SECTIONS", [lambda: [tour.Claim("s", "a false claim", "1 != 2", False)]])
    assert cli.main(["tour"]) == 1
    assert "[FAILS] a false claim" in capsys.readouterr().out


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
