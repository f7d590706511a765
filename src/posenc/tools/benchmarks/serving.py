"""RoPE at serving shapes: a decode step and short prefills, eager and under ``torch.compile``.

Each row times :class:`posenc.RotaryEmbedding` as a model calls it (``rope(q, k, offset=past)``: the
cos/sin lookup included) against transformers' ``apply_rotary_pos_emb`` given cos/sin computed beforehand
(its cheapest use), round-robin in one process (:func:`.timing.interleaved_times`). Shapes are GQA with 32
query and 8 key heads of 128 (Llama 3 8B). The compiled rows compile both callables with the default
inductor backend for the row's shape and time the compiled calls; compile time is reported beside them.
A one-call graph is mostly guard checks at decode size; the "16 layers" row rotates 16 layers' q and k in
one compiled graph, as a compiled model step does (transformers' cos/sin are shared by all layers).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

import posenc

from .report import Column, number, table
from .rope import hf_apply
from .timing import interleaved_times, medians

PAST = 1000  # tokens already in the cache
SHAPES = (("decode", 1, 1), ("decode", 32, 1), ("prefill", 1, 64), ("prefill", 1, 512))
QUICK_SHAPES = (("decode", 1, 1), ("prefill", 1, 16))
LAYERS = 16
COMPILED = (("decode", 1, 1), (f"decode, {LAYERS} layers", 1, 1), ("prefill", 1, 512))


def _inputs(batch: int, seq: int, device: torch.device):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, 32, seq, 128, generator=gen).to(device)
    k = torch.randn(batch, 8, seq, 128, generator=gen).to(device)
    rope = posenc.RotaryEmbedding(128, layout="half")
    cos, sin = rope.cos_sin(seq, offset=PAST, device=device)
    cos_full, sin_full = (
        torch.cat((cos, cos), -1)[None],
        torch.cat((sin, sin), -1)[None],
    )  # as Llama makes them
    return rope, q, k, cos_full, sin_full


def _row(
    kind: str, batch: int, seq: int, cases: dict[str, Callable], repeat: int, device, extra=None
) -> dict:
    with torch.no_grad():
        t = medians(interleaved_times(cases, repeat, warmup=3, device=device))
    return {
        "kind": kind,
        "batch": batch,
        "seq": seq,
        "posenc_us": t["posenc"] * 1e6,
        "hf_us": t["hf"] * 1e6,
        "speedup_vs_hf": t["hf"] / t["posenc"],
        **(extra or {}),
    }


def _compiled(fn: Callable, *args) -> tuple[Callable, float]:
    """fn compiled for these inputs, and the seconds the first call (the compile) took."""
    compiled = torch.compile(fn, dynamic=False)
    t0 = time.perf_counter()
    with torch.no_grad():
        compiled(*args)
    return compiled, time.perf_counter() - t0


def _eager_row(hf, kind: str, batch: int, seq: int, device, repeat: int | None) -> dict:
    rope, q, k, cos, sin = _inputs(batch, seq, device)
    cases = {"posenc": lambda: rope(q, k, offset=PAST), "hf": lambda: hf(q, k, cos, sin)}
    return _row(kind, batch, seq, cases, repeat or (200 if seq == 1 else 30), device, {"compiled": False})


def _compiled_row(hf, kind: str, batch: int, seq: int, device, repeat: int | None) -> dict:
    torch._dynamo.reset()
    rope, q, k, cos, sin = _inputs(batch, seq, device)
    rope(q, k, offset=PAST)  # a model's eager first step fills the cos/sin memo the graph then reads
    layers = LAYERS if kind.endswith("layers") else 1
    qs, ks = [q.clone() for _ in range(layers)], [k.clone() for _ in range(layers)]

    def ours_fn(qs, ks):
        return [rope(a, b, offset=PAST) for a, b in zip(qs, ks, strict=True)]

    def theirs_fn(qs, ks, cos, sin):
        return [hf(a, b, cos, sin) for a, b in zip(qs, ks, strict=True)]

    ours, ours_s = _compiled(ours_fn, qs, ks)
    theirs, theirs_s = _compiled(theirs_fn, qs, ks, cos, sin)
    cases = {"posenc": lambda: ours(qs, ks), "hf": lambda: theirs(qs, ks, cos, sin)}
    extra = {"compiled": True, "compile_s": ours_s, "hf_compile_s": theirs_s}
    return _row(kind, batch, seq, cases, repeat or (200 if seq == 1 else 30), device, extra)


def run(device: torch.device, quick: bool = False, repeat: int | None = None) -> list[dict]:
    """Eager rows for every shape; compiled rows (skipped with ``quick``) for a decode step and a prefill."""
    hf = hf_apply()
    if hf is None:
        return []
    rows = [_eager_row(hf, *shape, device, repeat) for shape in (QUICK_SHAPES if quick else SHAPES)]
    return rows + [_compiled_row(hf, *shape, device, repeat) for shape in (() if quick else COMPILED)]


COLUMNS = (
    Column("case", -18, lambda r: r["kind"]),
    Column("batch", 5, lambda r: str(r["batch"])),
    Column("tokens", 6, lambda r: str(r["seq"])),
    Column("mode", -9, lambda r: "compiled" if r["compiled"] else "eager"),
    Column("posenc us", 10, lambda r: f"{r['posenc_us']:.1f}"),
    Column("HF us", 9, lambda r: f"{r['hf_us']:.1f}"),
    Column("x HF", 6, lambda r: f"{r['speedup_vs_hf']:.2f}"),
    Column("compile s", 9, lambda r: number(r.get("compile_s"), ".1f")),
)


def serving_table(rows: list[dict]) -> str:
    title = (
        "RoPE at serving shapes, q 32 heads / k 8 heads of 128, medians: posenc's module (cos/sin lookup "
        f"included, position {PAST} on) against transformers' apply_rotary_pos_emb with cos/sin made "
        "beforehand"
    )
    return table(title, COLUMNS, rows)
