"""`posenc bench`: the quick smoke run end to end, and the target bookkeeping on hand-made rows."""

import json

import pytest

from posenc.tools import bench
from posenc.cli import main


def test_bench_quick_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--repeat", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "RoPE on q and k" in printed and "ALiBi attention" in printed and f"wrote {out}" in printed
    result = json.loads(out.read_text())
    assert result["quick"] is True and result["targets"] == []
    combos = {(r["dtype"], r["layout"], r["mode"]) for r in result["rope"]}
    assert combos == {(d, lay, m) for d in ("float32", "bfloat16") for lay in ("half", "interleaved") for m in ("out", "inplace")}
    for r in result["rope"]:
        b, h, s, d = r["shape"]
        nbytes = 2 * 2 * b * h * s * d * (4 if r["dtype"] == "float32" else 2)
        assert r["ms"] > 0 and r["gb_per_s"] == pytest.approx(nbytes / (r["ms"] * 1e-3) / 1e9)
        assert r["fraction_of_copy"] == pytest.approx(r["copy_ms"] / r["ms"])
        assert r["speedup_vs_hf"] == pytest.approx(r["hf_ms"] / r["ms"])
    cases = {(r["seq"], r["case"]) for r in result["attention"]}
    assert cases == {(s, c) for s in (256, 1024) for c in ("posenc", "sdpa+bias", "sdpa causal")}
    for r in result["attention"]:
        assert "skipped" not in r, r
        assert r["seconds"] > 0 and r["peak_bytes"] >= 0
        assert r["x_causal_sdpa"] == pytest.approx(
            r["seconds"] / next(x["seconds"] for x in result["attention"] if x["seq"] == r["seq"] and x["case"] == "sdpa causal"))


def _rope_row(mode, speedup, fraction):
    return {"shape": [1, 2, 3, 4], "dtype": "float32", "layout": "half", "mode": mode,
            "speedup_vs_hf": speedup, "fraction_of_copy": fraction}


def test_targets_met_and_not_met():
    rope = [_rope_row("out", 4.5, 0.3), _rope_row("inplace", 9.0, 0.59)]
    attn = [
        {"case": "posenc", "seq": 16384, "seconds": 6.0, "peak_bytes": 1.4e9, "x_causal_sdpa": 3.1},
        {"case": "posenc", "seq": 8192, "seconds": 1.0, "peak_bytes": 9e9, "x_causal_sdpa": 9.0},  # not a target length
        {"case": "sdpa+bias", "seq": 16384, "skipped": "too big"},
    ]
    got = {t["target"].split(",")[0]: t["met"] for t in bench.targets(rope, attn)}
    assert got == {
        "RoPE out of place >= 4x HF": True,
        "RoPE in place >= 60% of copy": False,
        "ALiBi L=16384 peak < 1.5 GB": True,
        "ALiBi L=16384 time <= 3x causal SDPA": False,
    }


def test_bench_rejects_bad_repeat(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--repeat", "0"])
    assert "--repeat must be an integer >= 1, got '0'" in capsys.readouterr().err


def test_materialised_case_is_skipped_when_it_cannot_fit(monkeypatch):
    from posenc.tools.benchmarks import attention

    monkeypatch.setattr(attention, "_available_bytes", lambda: 4 << 30)
    row = attention.run_case("sdpa+bias", 16384, 8, 64, 1)  # ~24 GiB needed: never started
    assert "skipped" in row and "GiB" in row["skipped"]
