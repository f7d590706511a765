"""`posenc bench`: the quick smoke run end to end, the CUDA code path on CPU tensors, --device cuda
without a GPU, and the target bookkeeping on hand-made rows."""

import json
import subprocess
import sys

import pytest
import torch

from posenc.cli import main
from posenc.tools.benchmarks import attention, memory, rope
from posenc.tools.benchmarks.presets import PRESETS
from posenc.tools.benchmarks.targets import targets


def test_bench_quick_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--repeat", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "RoPE on q and k" in printed and "ALiBi attention" in printed and f"wrote {out}" in printed
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["quick"] is True and result["targets"] == []
    combos = {(r["dtype"], r["layout"], r["mode"]) for r in result["rope"]}
    dtypes, layouts, modes = ("float32", "bfloat16"), ("half", "interleaved"), ("out", "inplace")
    assert combos == {(d, lay, m) for d in dtypes for lay in layouts for m in modes}
    for r in result["rope"]:
        b, h, s, d = r["shape"]
        nbytes = 2 * 2 * b * h * s * d * (4 if r["dtype"] == "float32" else 2)
        assert r["ms"] > 0 and r["gb_per_s"] == pytest.approx(nbytes / (r["ms"] * 1e-3) / 1e9)
        assert r["fraction_of_copy"] == pytest.approx(r["copy_ms"] / r["ms"])
        assert r["speedup_vs_hf"] == pytest.approx(r["hf_ms"] / r["ms"])
    cases = {(r["seq"], r["case"]) for r in result["attention"]}
    assert cases == {(s, c) for s in (256, 1024) for c in ("posenc", "sdpa+bias", "sdpa causal")}
    floor = {r["seq"]: r["seconds"] for r in result["attention"] if r["case"] == "sdpa causal"}
    for r in result["attention"]:
        assert "skipped" not in r, r
        assert r["seconds"] > 0 and r["peak_bytes"] >= 0
        assert r["x_causal_sdpa"] == pytest.approx(r["seconds"] / floor[r["seq"]])


def test_cuda_code_path_runs_on_cpu_tensors():
    """The CUDA preset's extras (GQA, forward + backward, in-process attention) on tiny CPU inputs."""
    cpu = torch.device("cpu")
    rows = rope.run(PRESETS[("cuda", True)], cpu, repeat=1)
    assert {(r["layout"], r["mode"]) for r in rows} == {(lay, m) for lay in rope.LAYOUTS for m in rope.MODES}
    assert all(
        r["k_heads"] == 1 and r["fwd_bwd_ms"] > 0 and r["fraction_of_nominal_hbm"] is None for r in rows
    )
    assert "fwd+bwd ms" in rope.rope_table(rows)
    for case in attention.CASES:
        got = attention.measure(case, 64, 2, 16, 1, cpu, torch.bfloat16)
        assert got["seconds"] > 0 and got["peak_bytes"] >= 0
        assert (got["backend"] is not None) == (case == "posenc")


def test_cuda_without_a_gpu_fails_at_once(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--device", "cuda", "--quick"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert "--device cuda" in line and "no CUDA device is available" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_console_script_cuda_without_a_gpu_exits_2():
    cmd = [sys.executable, "-m", "posenc.cli", "bench", "--device", "cuda"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--device" in proc.stderr and "no CUDA device" in proc.stderr


def _rope_row(mode, speedup, fraction):
    return {
        "shape": [1, 2, 3, 4],
        "dtype": "float32",
        "layout": "half",
        "mode": mode,
        "speedup_vs_hf": speedup,
        "fraction_of_copy": fraction,
    }


def test_targets_met_and_not_met():
    rope_rows = [_rope_row("out", 4.5, 0.3), _rope_row("inplace", 9.0, 0.59)]
    attn = [
        {"case": "posenc", "seq": 16384, "seconds": 6.0, "peak_bytes": 1.4e9, "x_causal_sdpa": 3.1},
        {
            "case": "posenc",
            "seq": 8192,
            "seconds": 1.0,
            "peak_bytes": 9e9,
            "x_causal_sdpa": 9.0,
        },  # not a target
        {"case": "sdpa+bias", "seq": 16384, "skipped": "too big"},
    ]
    got = {t["target"].split(",")[0]: t["met"] for t in targets(rope_rows, attn)}
    assert got == {
        "RoPE out of place >= 4x HF": True,
        "RoPE in place >= 60% of copy": False,
        "ALiBi L=16384 peak < 1.5 GB": True,
        "ALiBi L=16384 time <= 3x causal SDPA": False,
    }


def test_attention_table_shows_why_a_case_was_skipped():
    rows = [
        {"case": "posenc", "seq": 64, "seconds": 0.5, "peak_bytes": 2**20, "backend": "blocked"},
        {"case": "sdpa+bias", "seq": 64, "skipped": "needs ~24 GiB"},
    ]
    lines = attention.attention_table(rows).splitlines()
    assert lines[2].split() == ["64", "posenc", "0.500", "1", "blocked"]
    assert lines[3].split() == ["64", "sdpa+bias", "skipped:", "needs", "~24", "GiB"]


def test_bench_rejects_bad_repeat(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--repeat", "0"])
    assert "--repeat must be an integer >= 1, got '0'" in capsys.readouterr().err


def test_materialised_case_is_skipped_when_it_cannot_fit(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 4 << 30)
    row = attention.run_case("sdpa+bias", 16384, 8, 64, 1)  # ~24 GiB needed: never started
    assert "skipped" in row and "GiB" in row["skipped"]


@pytest.mark.parametrize("where, word", [("adir", "is a directory"), ("afile/x.json", "is a file")])
def test_bench_out_that_cannot_be_written_is_refused_at_once(where, word, tmp_path, capsys, monkeypatch):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    monkeypatch.setattr(rope, "run", lambda *a: pytest.fail("benchmarked before --out was checked"))
    assert main(["bench", "--quick", "--out", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc bench: error: --out") and word in err and len(err.splitlines()) == 1
