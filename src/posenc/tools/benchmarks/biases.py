"""Every score bias at long context: forward and forward + backward time and peak memory.

One row per bias, length and mode, at batch 1 with the preset's heads and head_dim, causal:

* ``posenc``: ``posenc.attention(q, k, v, bias=obj)`` (the row's ``backend``: FlexAttention on CUDA, the
  blocked kernel or the materialised bias on the CPU);
* ``sdpa causal``: causal SDPA without a bias, the floor every bias pays on top of, timed round-robin with
  ``posenc`` in the same process so that their ratio (``x_causal_sdpa``) sees the same load;
* ``sdpa+bias``: SDPA with the materialised (heads, L, L) bias, in the same round-robin, skipped (with the
  reason in ``sdpa_bias_skipped``) where its estimated footprint exceeds half the memory available now.

"forward+backward" times the forward and ``torch.autograd.grad`` of the output's sum with respect to q, k, v
and the bias's learnable parameters (those with ``requires_grad``: T5's table, KERPLE's r1/r2, FIRE's MLP,
c and threshold; ALiBi's default slopes and Sandwich have none).

Peak memory is what one call added on top of q, k, v (:mod:`.memory`), measured around each case's first
call. On the CPU every row runs in a fresh process whose first large call is ``posenc``'s, so its peak is
its own; the materialised case's peak is measured later in that process (its GiB-sized buffers are fresh
allocations either way), and the floor's peak comes from its own fresh process per length and mode.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

import posenc
from posenc.attention import bias_backend
from posenc.runs import memory

from .attention import answer_parent, attend, in_child, materialised_bytes, materialised_fits, random_qkv
from .presets import Preset
from .report import Column, number, table
from .timing import interleaved_times

_CPU = torch.device("cpu")
MODES = ("forward", "forward+backward")

# The biases benchmarked, in table order: name -> (kind, factory(heads, head_dim), longest L run or None).
# "table" biases depend on i - j only, "tile" biases are computed per block of scores, "content" schemes
# (their terms depend on q and k, so there is no bias to materialise) go through posenc.attention(bias=...)
# as well. The 2x time target covers table biases only, the memory target every row. A new scheme that
# posenc.attention takes as bias= is one more entry here.
BIASES: dict[str, tuple[str, Callable[[int, int], torch.nn.Module], int | None]] = {
    "ALiBi": ("table", lambda heads, dim: posenc.ALiBi(heads), None),
    "T5Bias": ("table", lambda heads, dim: posenc.T5Bias(heads), None),
    "KerpleBias(log)": ("table", lambda heads, dim: posenc.KerpleBias(heads, kind="log"), None),
    "SandwichBias": ("table", lambda heads, dim: posenc.SandwichBias(heads), None),
    "FireBias": ("tile", lambda heads, dim: posenc.FireBias(heads, train_len=2048), None),
    # Content schemes are far slower per call on the CPU (docs/fast-paths.md has the times) and grow as
    # L^2, so a full run stops at L = 2048; their longer rows say so instead of vanishing.
    "ShawRelative": ("content", lambda heads, dim: posenc.ShawRelative(dim), 2048),
    "CoPE": ("content", lambda heads, dim: posenc.CoPE(dim, npos_max=2049), 2048),
}

# The materialised case holds this many (heads, L, L) tensors at its peak: forward the bias, its causal
# copy, the scores and the weights; a backward adds the weights', scores' and bias's gradients.
_MATRICES = {"forward": 4, "forward+backward": 6}


def materialised_bias(bias, seq: int) -> torch.Tensor:
    """The (heads, seq, seq) causal bias as a user would build it for SDPA's attn_mask: a table bias as one
    gather from its (heads, 2 seq - 1) distance table (its generic ``.bias()`` evaluates the table at every
    (i, j), which for Sandwich is seq^2 x dim / 2 float64 cosines), a tile bias through ``.bias()``."""
    if getattr(bias, "per_tile", True):  # FIRE; table biases (ALiBi among them) take the gather
        return bias.bias(seq, seq, causal=True)
    pos = torch.arange(seq, device=bias._device())
    return bias.distance_table(seq, causal=True)[:, pos[:, None] - pos[None, :] + seq - 1]


def materialised_need(bias, seq: int, heads: int, element_size: int, mode: str) -> int:
    """Estimated peak bytes of the materialised case: :data:`_MATRICES` (heads, L, L) tensors plus what
    building the bias holds per score (an int64 index; a tile bias's ``tile_width`` floats, twice when its
    parameters get gradients)."""
    per_score = 8
    if getattr(bias, "per_tile", False):
        per_score = 4 * bias.tile_width * (1 if mode == "forward" else 2)
    return materialised_bytes(seq, heads, element_size, _MATRICES[mode]) + per_score * seq * seq


def _check(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


def timed_call(fn: Callable, inputs: tuple, params: tuple, mode: str) -> Callable[[], object]:
    """One timed call of ``fn`` on q, k, v: the forward, or the forward and the gradients it needs."""
    if mode == "forward":

        def forward():
            with torch.no_grad():
                return fn(*inputs)

        return forward

    def forward_backward():
        # autograd.grad returns the gradients instead of accumulating them into .grad across calls
        return torch.autograd.grad(fn(*inputs).sum(), (*inputs, *params))

    return forward_backward


def first_call_peak(fn: Callable[[], object], device, peaks: dict, name: str) -> Callable[[], object]:
    """``fn``, recording in ``peaks[name]`` the memory its first call added (the timing runs it anyway)."""

    def call():
        if name in peaks:
            return fn()
        meter = memory.peak_meter(device)
        out = fn()
        peaks[name] = meter()
        return out

    return call


def _cases(name: str, heads: int, dim: int, device, materialise: bool):
    """What one row times: (kind, the bias, its trainable parameters, {case: fn(q, k, v)}). "sdpa causal"
    alone is the floor; a bias runs as "posenc" beside the floor, and as "sdpa+bias" (its materialised bias)
    when ``materialise`` and it is no content scheme (those have no bias to materialise)."""
    if name == "sdpa causal":
        return None, None, (), {"sdpa causal": attend("sdpa causal", None)}
    _check("bias", name, BIASES)
    kind = BIASES[name][0]
    bias = BIASES[name][1](heads, dim).to(device)
    params = tuple(p for p in bias.parameters() if p.requires_grad)
    fns = {case: attend(case, bias) for case in ("posenc", "sdpa causal")}
    if materialise and kind != "content":
        fns["sdpa+bias"] = lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=materialised_bias(bias, q.shape[2]).to(q.dtype)
        )
    return kind, bias, params, fns


def measure(
    name: str,
    mode: str,
    seq: int,
    heads: int,
    dim: int,
    repeat: int,
    device=_CPU,
    dtype=torch.float32,
    materialise: bool = True,
) -> dict:
    """One row in this process: ``posenc`` (and ``sdpa+bias`` if ``materialise``) round-robin with the
    floor. ``name`` "sdpa causal" measures the floor alone (its own peak).

    Returns seconds and peak_bytes of each case that ran (the floor's as ``sdpa_causal_*``, the materialised
    bias's as ``sdpa_bias_*``), posenc's backend and the ratios to the floor.
    """
    _check("mode", mode, MODES)
    floor_only = name == "sdpa causal"
    kind, bias, params, fns = _cases(name, heads, dim, device, materialise)
    materialise = "sdpa+bias" in fns
    grad = mode != "forward"

    def calls_on(length: int) -> tuple[tuple, dict[str, Callable[[], object]]]:
        qkv = tuple(t.requires_grad_(grad) for t in random_qkv(length, heads, dim, dtype, device))
        own = {case: () if case == "sdpa causal" else params for case in fns}  # the floor has no bias
        return qkv, {case: timed_call(fn, qkv, own[case], mode) for case, fn in fns.items()}

    for call in calls_on(256)[1].values():  # load kernels and thread pools (and the blocked path) first
        call()
    full, calls = calls_on(seq)
    if device.type == "cuda":
        for call in calls.values():  # compile for this shape; CUDA's peak counts live allocations only
            call()
    peaks: dict[str, int] = {}
    timed = {case: first_call_peak(call, device, peaks, case) for case, call in calls.items()}
    times = {case: statistics.median(ts) for case, ts in interleaved_times(timed, repeat, 0, device).items()}
    floor = times["sdpa causal"]
    if floor_only:
        return {"seconds": floor, "peak_bytes": peaks["sdpa causal"]}
    out = {
        "seconds": times["posenc"],
        "peak_bytes": peaks["posenc"],
        "backend": "query-blocked" if kind == "content" else _backend(full, bias, grad),
        "sdpa_causal_seconds": floor,
        "x_causal_sdpa": times["posenc"] / floor,
    }
    if materialise:
        out.update(
            sdpa_bias_seconds=times["sdpa+bias"],
            sdpa_bias_peak_bytes=peaks["sdpa+bias"],
            sdpa_bias_x_causal_sdpa=times["sdpa+bias"] / floor,
        )
    return out


def _backend(qkv, bias, grad: bool) -> str:
    """The path posenc.attention took for this row's bias (it depends on whether the call trains it)."""
    with torch.set_grad_enabled(grad):
        return bias_backend(qkv[0], qkv[1], bias)


def _measured(name, mode, seq, heads, dim, repeat, device, dtype, materialise) -> dict:
    """:func:`measure` in a fresh process on the CPU, in this one on CUDA; {"skipped": why} on failure."""
    if device.type == "cpu":
        return in_child(__name__, name, mode, seq, heads, dim, repeat, int(materialise))
    try:
        return measure(name, mode, seq, heads, dim, repeat, device, dtype, materialise)
    except torch.cuda.OutOfMemoryError as err:
        return {"skipped": f"failed: {str(err).splitlines()[0]}"}


def run(
    preset: Preset,
    device: torch.device,
    repeat: int | None = None,
    lengths: tuple[int, ...] | None = None,
) -> list[dict]:
    """Every bias of :data:`BIASES` at ``lengths`` (default the preset's ``bias_lengths``) in both modes."""
    rows = []
    heads, dim, dtype = preset.heads, preset.head_dim, preset.attention_dtype
    for seq in preset.bias_lengths if lengths is None else lengths:
        reps = repeat or preset.attention_repeat
        # Fewer repeats where one call takes seconds; the median of 3 still shrugs off one noisy run.
        reps = reps if seq < 16384 else max(1, min(reps, 3))
        for mode in MODES:
            floor = _measured("sdpa causal", mode, seq, heads, dim, 1, device, dtype, False)
            for name, (kind, factory, longest) in BIASES.items():
                row = {"bias": name, "kind": kind, "seq": seq, "mode": mode, "heads": heads, "head_dim": dim}
                if longest is not None and seq > longest:
                    rows.append({**row, "skipped": f"not run above L = {longest} (minutes per call here)"})
                    continue
                if kind == "content":
                    no_sdpa = "content-dependent: no bias to materialise"
                else:
                    need = materialised_need(factory(heads, dim), seq, heads, dtype.itemsize, mode)
                    no_sdpa = materialised_fits(need, device)
                row.update(_measured(name, mode, seq, heads, dim, reps, device, dtype, no_sdpa is None))
                if no_sdpa is not None:
                    row["sdpa_bias_skipped"] = no_sdpa
                if "peak_bytes" in floor:
                    row["sdpa_causal_peak_bytes"] = floor["peak_bytes"]
                rows.append(row)
                print(f"  bias {name} L={seq} {mode}: done", file=sys.stderr, flush=True)
    return rows


def mib(value) -> str:
    return number(None if value is None else value / 2**20, ".0f")


def _materialised(r: dict) -> str:
    if "sdpa_bias_skipped" in r:
        return f"skipped: {r['sdpa_bias_skipped']}"
    return (
        f"{r['sdpa_bias_seconds']:.3f} s, {r['sdpa_bias_x_causal_sdpa']:.2f}x, "
        f"{mib(r['sdpa_bias_peak_bytes'])} MiB"
    )


COLUMNS = (
    Column("bias", -16, lambda r: r["bias"]),
    Column("L", 6, lambda r: str(r["seq"])),
    Column("mode", -17, lambda r: r["mode"]),
    Column("seconds", 9, lambda r: f"{r['seconds']:.3f}"),
    Column("x causal", 8, lambda r: f"{r['x_causal_sdpa']:.2f}"),
    Column("peak MiB", 9, lambda r: mib(r["peak_bytes"])),
    Column("backend", -13, lambda r: r["backend"]),
    Column("causal s", 9, lambda r: f"{r['sdpa_causal_seconds']:.3f}"),
    Column("causal MiB", 10, lambda r: mib(r.get("sdpa_causal_peak_bytes"))),
    Column("  SDPA + materialised bias: s, x causal, peak", -40, _materialised),
)


def bias_table(rows: list[dict]) -> str:
    """The rows as a table (a row that failed shows why)."""
    title = (
        "Score biases, batch 1, causal, medians (x causal = time / causal SDPA without a bias, timed "
        "round-robin in one process; peak = memory added on top of q, k, v)"
    )
    return table(title, COLUMNS, rows, keys=3)


if __name__ == "__main__":
    name, mode = sys.argv[1], sys.argv[2]
    seq, heads, dim, repeat, materialise = map(int, sys.argv[3:8])
    answer_parent(measure(name, mode, seq, heads, dim, repeat, materialise=bool(materialise)))
