"""RoPE throughput: posenc's rotation of q and k against the copy floor and transformers' eager code.

For each shape and dtype, in one process and round-robin (:func:`.timing.interleaved_times`):

* ``copy``: ``dst.copy_(src)`` for q and for k, the same bytes a rotation reads and writes (the floor);
* ``hf``: transformers' ``apply_rotary_pos_emb`` (Llama, "half" layout) with its (1, seq, head_dim) cos/sin;
* :func:`posenc.kernels.apply_rotary_qk`, the entry point :class:`posenc.RotaryEmbedding` calls, in both
  layouts, out of place (new outputs, autograd-capable) and ``inplace=True``; with the preset's
  ``rope_backward`` also forward + backward through autograd. Every case gets its cos/sin tables made
  beforehand, so all of them time the rotation alone.

GB/s counts the bytes read and written: 2 x (q.nbytes + k.nbytes). On CUDA a row also gives the share
of the device's nominal HBM bandwidth.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import posenc
from posenc.kernels import apply_rotary_qk

from .presets import Preset
from .report import Column, number, percent, ratio, table
from .timing import bests, interleaved_times, medians

LAYOUTS = ("half", "interleaved")
MODES = ("out", "inplace")

# Nominal HBM bandwidth (GB/s) by device-name fragment, for the "share of HBM" column.
NOMINAL_HBM_GBS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0, "L40": 864.0, "A10": 600.0, "4090": 1008.0}


def nominal_hbm(device: torch.device) -> float | None:
    """The nominal memory bandwidth (GB/s) of a CUDA device we know the name of, else None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in NOMINAL_HBM_GBS.items() if k in name), None)


def hf_apply() -> Callable | None:
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except Exception:  # transformers is optional: the rows then have no ratio
        return None
    return apply_rotary_pos_emb


def rope_tables(seq: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the default schedule's angles, float32 (seq, head_dim/2), made in float64."""
    inv_freq, _ = posenc.rope_frequencies(head_dim, dtype=torch.float64)
    theta = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq
    return theta.cos().float().to(device), theta.sin().float().to(device)


def _cases(q, k, cos, sin, backward: bool) -> dict[str, Callable[[], object]]:
    """The calls timed for one (q, k): copy, hf where installed, then layout/mode for each layout."""
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    cases: dict[str, Callable[[], object]] = {"copy": lambda: (dq.copy_(q), dk.copy_(k))}
    hf = hf_apply()
    if hf is not None:
        cos_full = torch.cat((cos, cos), dim=-1).to(q.dtype)[None]  # (1, seq, d), as LlamaRotaryEmbedding
        sin_full = torch.cat((sin, sin), dim=-1).to(q.dtype)[None]
        cases["hf"] = lambda: hf(q, k, cos_full, sin_full)
    qg, kg = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()

    def fwd_bwd(layout: str) -> None:
        with torch.enable_grad():
            out = apply_rotary_qk(qg, kg, cos, sin, layout=layout)
            torch.autograd.grad(out, (qg, kg), out)

    for layout in LAYOUTS:
        cases[f"{layout}/out"] = lambda lay=layout: apply_rotary_qk(q, k, cos, sin, layout=lay)
        # In place on q and k themselves: the values drift, the cost does not.
        cases[f"{layout}/inplace"] = lambda lay=layout: apply_rotary_qk(
            q, k, cos, sin, layout=lay, inplace=True
        )
        if backward:
            cases[f"{layout}/fwd_bwd"] = lambda lay=layout: fwd_bwd(lay)
    return cases


def bench_shape(shape, dtype: torch.dtype, preset: Preset, device: torch.device, repeat: int) -> list[dict]:
    """One row per layout and mode for q of ``shape`` (batch, heads, seq, head_dim) and its k."""
    b, h, seq, d = shape
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=gen).to(device, dtype)
    k = torch.randn((b, max(1, h // preset.kv_group), seq, d), generator=gen).to(device, dtype)
    with torch.no_grad():
        raw = interleaved_times(
            _cases(q, k, *rope_tables(seq, d, device), preset.rope_backward), repeat, device=device
        )
    t, best = medians(raw), bests(raw)
    nbytes, hbm = 2 * (q.nbytes + k.nbytes), nominal_hbm(device)
    rows = []
    for layout in LAYOUTS:
        for mode in MODES:
            sec = t[f"{layout}/{mode}"]
            rows.append(
                {
                    "shape": list(shape),
                    "k_heads": k.shape[1],
                    "dtype": str(dtype).removeprefix("torch."),
                    "layout": layout,
                    "mode": mode,
                    "ms": sec * 1e3,
                    "gb_per_s": nbytes / sec / 1e9,
                    "copy_ms": t["copy"] * 1e3,
                    "copy_gb_per_s": nbytes / t["copy"] / 1e9,
                    "fraction_of_copy": t["copy"] / sec,
                    "fraction_of_nominal_hbm": nbytes / sec / 1e9 / hbm if hbm else None,
                    "hf_ms": t["hf"] * 1e3 if "hf" in t else None,
                    "speedup_vs_hf": t["hf"] / sec if "hf" in t else None,
                    "fwd_bwd_ms": t[f"{layout}/fwd_bwd"] * 1e3 if preset.rope_backward else None,
                    "best_ms": best[f"{layout}/{mode}"] * 1e3,
                    "best_copy_ms": best["copy"] * 1e3,
                    "best_hf_ms": best["hf"] * 1e3 if "hf" in best else None,
                }
            )
    return rows


def run(preset: Preset, device: torch.device, repeat: int | None = None) -> list[dict]:
    """Every shape and dtype of ``preset`` on ``device``; ``repeat`` overrides the preset's count."""
    rows = []
    for shape in preset.rope_shapes:
        for dtype in preset.dtypes:
            rows.extend(bench_shape(shape, dtype, preset, device, repeat or preset.rope_repeat))
    return rows


COLUMNS = (
    Column("shape", -20, lambda r: str(tuple(r["shape"]))),
    Column("k heads", 7, lambda r: str(r["k_heads"])),
    Column("dtype", -9, lambda r: r["dtype"]),
    Column("layout", -12, lambda r: r["layout"]),
    Column("mode", -8, lambda r: r["mode"]),
    Column("ms", 8, lambda r: f"{r['ms']:.2f}"),
    Column("GB/s", 7, lambda r: f"{r['gb_per_s']:.1f}"),
    Column("copy%", 6, lambda r: percent(r["fraction_of_copy"])),
    Column("x HF", 6, lambda r: number(r["speedup_vs_hf"], ".1f")),
    Column("best: copy%", 11, lambda r: percent(r["best_copy_ms"] / r["best_ms"])),
    Column("x HF", 6, lambda r: ratio(r["best_hf_ms"], r["best_ms"])),
)
CUDA_COLUMNS = (
    Column("HBM%", 5, lambda r: percent(r["fraction_of_nominal_hbm"])),
    Column("fwd+bwd ms", 10, lambda r: number(r["fwd_bwd_ms"], ".3f")),
)


def rope_table(rows: list[dict]) -> str:
    """The rows as a table; the HBM and forward + backward columns appear where a row has them."""
    extra = any(r["fwd_bwd_ms"] is not None or r["fraction_of_nominal_hbm"] is not None for r in rows)
    title = (
        "RoPE on q and k, medians (copy% = share of this process's dst.copy_(src) bandwidth; x HF = speed-up "
        "over transformers' apply_rotary_pos_emb; best: the same from each case's fastest call"
        + ("; HBM% = share of the nominal HBM bandwidth)" if extra else ")")
    )
    return table(title, COLUMNS + CUDA_COLUMNS if extra else COLUMNS, rows)
