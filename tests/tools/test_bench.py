"""`posenc bench`: the quick smoke run end to end, the CUDA code path on CPU tensors, --device cuda
without a GPU, the score-bias rows (in this process at tiny sizes, one in a child process), and the target
bookkeeping on hand-made rows."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

import posenc
from posenc.cli import main
from posenc.runs import memory
from posenc.tools.benchmarks import attention, biases, remaps, rope
from posenc.tools.benchmarks.presets import PRESETS
from posenc.tools.benchmarks.targets import targets, targets_table


def test_bench_quick_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--repeat", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "RoPE on q and k" in printed and "ALiBi attention" in printed and f"wrote {out}" in printed
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["quick"] is True and result["targets"] == []
    assert result["bias"] == [] and result["remap"] == []  # --quick leaves them to --only bias / remap
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
    assert "argument --repeat: expected a positive integer, got '0'" in capsys.readouterr().err


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


def _tiny_bias_preset(lengths=(64,)):
    return dataclasses.replace(PRESETS[("cpu", True)], heads=2, head_dim=16, bias_lengths=lengths)


def _in_process(monkeypatch):
    """biases.run measuring in this process instead of one fresh process per row (fast; peaks unchecked)."""
    monkeypatch.setattr(biases, "_measured", lambda *args: biases.measure(*args))


def test_bias_rows_have_the_expected_keys(monkeypatch):
    _in_process(monkeypatch)
    rows = biases.run(_tiny_bias_preset(), torch.device("cpu"), repeat=1)
    assert [(r["bias"], r["mode"]) for r in rows] == [(b, m) for m in biases.MODES for b in biases.BIASES]
    for r in rows:
        assert "skipped" not in r, r
        assert r["kind"] == biases.BIASES[r["bias"]][0]
        assert (r["seq"], r["heads"], r["head_dim"]) == (64, 2, 16)
        assert r["seconds"] > 0 and r["peak_bytes"] >= 0 and r["sdpa_causal_peak_bytes"] >= 0
        assert r["x_causal_sdpa"] == pytest.approx(r["seconds"] / r["sdpa_causal_seconds"])
        if r["kind"] == "content":
            assert r["backend"] == "query-blocked" and "no bias to materialise" in r["sdpa_bias_skipped"]
        else:
            # 2 heads x 64^2 scores: the blocked kernel, unless the call trains the bias's parameters
            trains = r["mode"] == "forward+backward" and r["bias"] in (
                "T5Bias",
                "KerpleBias(log)",
                "FireBias",
            )
            assert r["backend"] == ("materialise" if trains else "blocked"), r
            ratio = r["sdpa_bias_seconds"] / r["sdpa_causal_seconds"]
            assert r["sdpa_bias_x_causal_sdpa"] == pytest.approx(ratio)
            assert r["sdpa_bias_peak_bytes"] >= 0
    assert biases.bias_table(rows).count("\n") == len(rows) + 1


def test_bias_rows_say_what_was_not_run(monkeypatch):
    _in_process(monkeypatch)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1 << 10)  # nothing materialised fits
    monkeypatch.setattr(biases, "BIASES", {k: biases.BIASES[k] for k in ("ALiBi", "CoPE")})
    monkeypatch.setitem(biases.BIASES, "CoPE", (*biases.BIASES["CoPE"][:2], 32))
    rows = biases.run(_tiny_bias_preset(), torch.device("cpu"), repeat=1)
    alibi, cope = rows[0], rows[1]
    assert (
        "needs ~0 GiB" in alibi["sdpa_bias_skipped"]
        and "sdpa_bias_seconds" not in alibi
        and alibi["seconds"] > 0
    )
    assert cope["skipped"] == "not run above L = 32 (minutes per call here)" and "seconds" not in cope
    lines = biases.bias_table(rows).splitlines()
    assert "skipped: needs" in lines[2] and lines[3].split()[:4] == ["CoPE", "64", "forward", "skipped:"]


def test_bias_child_process_runs_a_row():
    got = attention.in_child(biases.__name__, "SandwichBias", "forward+backward", 64, 2, 16, 1, 1)
    assert {"seconds", "peak_bytes", "sdpa_bias_seconds", "x_causal_sdpa"} <= set(got), got


def test_bias_measure_refuses_an_unknown_bias_or_mode():
    with pytest.raises(ValueError, match=r"bias must be one of \(.*'ALiBi'.*\), got 'Nope'"):
        biases.measure("Nope", "forward", 64, 2, 16, 1)
    modes = r"\('forward', 'forward\+backward'\)"
    with pytest.raises(ValueError, match=rf"mode must be one of {modes}, got 'back'"):
        biases.measure("ALiBi", "back", 64, 2, 16, 1)


@pytest.mark.parametrize("name", ["T5Bias", "KerpleBias(log)", "SandwichBias", "FireBias", "ALiBi"])
def test_materialised_bias_is_the_bias(name):
    bias = biases.BIASES[name][1](3, 16)
    assert torch.equal(biases.materialised_bias(bias, 40), bias.bias(40, 40, causal=True))


def _bias_row(bias, kind, mode, peak, x_causal, seq=16384):
    return {
        "bias": bias,
        "kind": kind,
        "mode": mode,
        "seq": seq,
        "peak_bytes": peak,
        "x_causal_sdpa": x_causal,
    }


def test_bias_targets_met_and_not_met():
    rows = [
        _bias_row("T5Bias", "table", "forward", 2e8, 1.9),
        _bias_row("T5Bias", "table", "forward+backward", 1.6e9, 2.1),
        _bias_row("FireBias", "tile", "forward", 2e8, 9.0),  # no time target for a tile bias
        _bias_row("ALiBi", "table", "forward", 9e9, 9.0, seq=8192),  # not a target length
        {"bias": "CoPE", "kind": "content", "mode": "forward", "seq": 16384, "skipped": "not run"},
    ]
    got = {t["target"]: t["met"] for t in targets([], [], [], rows)}
    assert got == {
        "T5Bias L=16384 forward peak < 1.5 GB": True,
        "T5Bias L=16384 forward time <= 2x causal SDPA": True,
        "T5Bias L=16384 forward+backward peak < 1.5 GB": False,
        "T5Bias L=16384 forward+backward time <= 2x causal SDPA": False,
        "FireBias L=16384 forward peak < 1.5 GB": True,
        "CoPE L=16384 forward peak < 1.5 GB": False,
    }
    shown = targets_table(targets([], [], [], rows)).splitlines()
    assert "  [NOT met] T5Bias L=16384 forward+backward time <= 2x causal SDPA: 2.10" in shown
    assert "  [NOT met] CoPE L=16384 forward peak < 1.5 GB: not measured" in shown
    assert "  [met] T5Bias L=16384 forward peak < 1.5 GB: 191 MiB" in shown


def test_bench_only_bias_runs_the_bias_lengths(tmp_path, capsys, monkeypatch):
    _in_process(monkeypatch)
    monkeypatch.setattr(biases, "BIASES", {"KerpleBias(log)": biases.BIASES["KerpleBias(log)"]})
    monkeypatch.setitem(PRESETS, ("cpu", True), _tiny_bias_preset((48, 64)))
    out = tmp_path / "bias.json"
    assert main(["bench", "--quick", "--only", "bias", "--repeat", "1", "--out", str(out)]) == 0
    assert "Score biases" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["rope"] == result["attention"] == result["serving"] == [] and result["targets"] == []
    assert [(r["seq"], r["mode"]) for r in result["bias"]] == [(s, m) for s in (48, 64) for m in biases.MODES]


def test_remap_rows_time_every_remap_against_rope_attention(monkeypatch):
    monkeypatch.setattr(remaps, "in_child", lambda module, *args: remaps.measure(*args))  # in this process
    rows = remaps.run(_tiny_bias_preset(), torch.device("cpu"), repeat=1)
    assert [(r["remap"], r["mode"]) for r in rows] == [(n, m) for m in biases.MODES for n in remaps.REMAPS]
    for r in rows:
        assert r["seconds"] > 0 and r["x_rope"] == pytest.approx(r["seconds"] / r["rope_seconds"])
        assert r["peak_bytes"] >= 0 and r["parameters"].startswith(
            ("SelfExtend(", "ReRoPE(", "STRING(", "DualChunk(")
        )
    assert remaps.remap_table(rows).count("\n") == len(rows) + 1
    child = attention.in_child(remaps.__name__, "SelfExtend", "forward+backward", 64, 4, 16, 1)
    assert {"seconds", "peak_bytes", "rope_seconds", "x_rope"} <= set(child), child
    with pytest.raises(ValueError, match="remap must be one of"):
        remaps.measure("DCA", "forward", 64, 2, 16, 1)


def test_peers_rows_compare_posenc_with_each_peer_that_agrees(monkeypatch):
    """Every installed peer that agrees with posenc in float64 is timed forward and forward+backward, with
    ratio quartiles; one that disagrees is reported, not timed."""
    from posenc.tools.benchmarks import peers

    real = peers._peers

    def with_a_wrong_peer(layout, head_dim, start, length, dtype):
        found = real(layout, head_dim, start, length, dtype)
        found["off by one"] = lambda q, k: (q + 1, k)
        return found

    monkeypatch.setattr(peers, "_peers", with_a_wrong_peer)
    rows = peers.bench_case("prefill", (1, 2, 8, 8), 3, torch.float32, "half", repeat=3)
    timed = {(r["direction"], r["peer"]) for r in rows if "skipped" not in r}
    for direction in ("forward", "forward+backward"):
        assert {(direction, "transformers"), (direction, "transformers compiled")} <= timed
    assert ("forward", "posenc out of place") in timed
    assert {("forward", "posenc torch kernels"), ("forward+backward", "posenc torch kernels")} <= timed
    (skipped,) = [r for r in rows if "skipped" in r]
    assert skipped["peer"] == "off by one" and "differs from posenc by" in skipped["skipped"]
    for r in rows:
        if "skipped" not in r:
            assert r["ratio_q1"] <= r["ratio"] <= r["ratio_q3"] and r["max_abs_diff_float64"] < 1e-5
    assert "transformers compiled" in peers.peers_table(rows)


def test_a_busy_neighbour_spins_while_inside_and_is_ended_on_the_way_out():
    from posenc.tools.benchmarks.timing import busy_neighbour

    with pytest.raises(RuntimeError, match="inside"), busy_neighbour() as child:
        assert child.poll() is None  # running
        raise RuntimeError("inside")
    assert child.poll() is not None


def test_vllm_is_a_peer_only_where_its_library_loads(monkeypatch, tmp_path):
    from posenc.tools.benchmarks import peers

    monkeypatch.setenv("POSENC_VLLM_CPU_LIBRARY", str(tmp_path / "missing.so"))
    assert peers.vllm_rotary() is None
    assert peers.VLLM not in peers._peers("half", 8, 0, 4, torch.float32)


def test_crossover_rows_time_both_cpu_paths_of_every_table_and_tile_bias():
    """Each row times the materialised bias and the blocked kernel on the same inputs, and the two paths
    compute the same attention (so the ratio compares like with like)."""
    from posenc.tools.benchmarks import crossover

    row = crossover.measure("T5Bias", "decode", 2, 4, 8, (3, 40), "forward+backward", 1)
    assert row["scores"] == 2 * 4 * 3 * 40 and row["q_len"] == 3 and row["seq"] == 40
    assert row["blocked_over_materialised"] == row["blocked_seconds"] / row["materialised_seconds"] > 0
    bias = posenc.FireBias(4, train_len=64)
    q, k, v = (torch.randn(2, 4, n, 8, dtype=torch.float64) for n in (5, 40, 40))
    paths = crossover._paths(bias.double())
    torch.testing.assert_close(paths["materialised"](q, k, v), paths["blocked"](q, k, v), rtol=0, atol=1e-12)
    rows = crossover.run(quick=True)
    kinds = {name for name, (kind, _, _) in biases.BIASES.items() if kind != "content"}
    assert {r["bias"] for r in rows} == kinds
    assert {r["family"] for r in rows} == {"lab", "model", "decode"}
    assert crossover.crossover_table(rows).count("\n") == len(rows) + 1


def test_a_new_benchmark_is_one_registry_record(tmp_path, capsys, monkeypatch):
    """A benchmark added to the registry (here one reading the context it is handed) is an --only choice,
    runs, prints its table and lands in the JSON, with no other edit; a plain run skips it when it is not
    by_default."""
    from posenc.tools.benchmarks import registry, report

    seen = []

    def run(module, context):
        seen.append(context)
        return [{"what": "toy", "repeat": context.repeat}]

    monkeypatch.setattr(report, "toy_table", lambda rows: f"Toy: {len(rows)} row", raising=False)
    toy = registry.Benchmark("toy", "a toy", "report", run, "toy_table", by_default=False)
    monkeypatch.setitem(registry.BENCHMARKS, "toy", toy)
    out = tmp_path / "toy.json"
    assert main(["bench", "--quick", "--only", "toy", "--repeat", "3", "--out", str(out)]) == 0
    assert "Toy: 1 row" in capsys.readouterr().out
    assert json.loads(out.read_text())["toy"] == [{"what": "toy", "repeat": 3}]
    assert seen[0].quick is True and seen[0].device == torch.device("cpu")
    with pytest.raises(SystemExit):
        main(["bench", "--only", "toy2"])
    assert "toy" in capsys.readouterr().err  # the choices the error lists come from the registry
