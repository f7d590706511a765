"""The targets a full CPU run is checked against (issue 4, on a 2-core CPU): reported, not asserted.

* RoPE on q and k out of place >= 4x transformers' eager ``apply_rotary_pos_emb``;
* RoPE in place >= 60% of the copy bandwidth;
* ALiBi attention at L = 16384 under 1.5 GB peak and within 3x of causal SDPA without a bias;
* serving shapes (issue 9): a decode step and short prefills at least as fast as transformers given
  precomputed cos/sin, eager and compiled;
* score biases (issue 10) at L = 16384, forward and forward + backward: every bias under 1.5 GB peak, and
  table biases (ALiBi, T5, KERPLE, Sandwich) within 2x of causal SDPA without a bias.
"""

from __future__ import annotations

TARGET_HF_SPEEDUP = 4.0
TARGET_INPLACE_COPY_FRACTION = 0.60
TARGET_ALIBI_PEAK_BYTES = 1.5e9
TARGET_ALIBI_X_CAUSAL = 3.0
TARGET_ALIBI_SEQ = 16384
TARGET_BIAS_PEAK_BYTES = 1.5e9
TARGET_BIAS_X_CAUSAL = 2.0
TARGET_BIAS_SEQ = 16384


def _target(text: str, value: float, met: bool) -> dict:
    return {"target": text, "value": value, "met": bool(met)}


def bias_targets(rows: list[dict]) -> list[dict]:
    """The score-bias targets of the rows at TARGET_BIAS_SEQ; a row that could not be measured there is
    reported as not met, with no value, rather than left out."""
    out = []
    for r in rows:
        if r["seq"] != TARGET_BIAS_SEQ:
            continue
        tag = f"{r['bias']} L={r['seq']} {r['mode']}"
        peak, x_causal = r.get("peak_bytes"), r.get("x_causal_sdpa")
        text = f"{tag} peak < {TARGET_BIAS_PEAK_BYTES / 1e9:g} GB"
        out.append(_target(text, peak, peak is not None and peak < TARGET_BIAS_PEAK_BYTES))
        if r["kind"] == "table":
            text = f"{tag} time <= {TARGET_BIAS_X_CAUSAL:g}x causal SDPA"
            out.append(_target(text, x_causal, x_causal is not None and x_causal <= TARGET_BIAS_X_CAUSAL))
    return out


def targets(
    rope_rows: list[dict], attn_rows: list[dict], serving_rows: list[dict] = (), bias_rows: list[dict] = ()
) -> list[dict]:
    """Each target with the measured value and whether it is met, one entry per row it covers."""
    out = []
    for r in rope_rows:
        tag = f"{tuple(r['shape'])} {r['dtype']} {r['layout']}"
        hf, copy = r["speedup_vs_hf"], r["fraction_of_copy"]
        if r["mode"] == "out" and hf is not None:
            out.append(
                _target(f"RoPE out of place >= {TARGET_HF_SPEEDUP:g}x HF, {tag}", hf, hf >= TARGET_HF_SPEEDUP)
            )
        if r["mode"] == "inplace":
            text = f"RoPE in place >= {TARGET_INPLACE_COPY_FRACTION:.0%} of copy, {tag}"
            out.append(_target(text, copy, copy >= TARGET_INPLACE_COPY_FRACTION))
    for r in attn_rows:
        if r["case"] != "posenc" or r["seq"] != TARGET_ALIBI_SEQ or "seconds" not in r:
            continue
        peak, x_causal = r["peak_bytes"], r.get("x_causal_sdpa")
        text = f"ALiBi L={r['seq']} peak < {TARGET_ALIBI_PEAK_BYTES / 1e9:g} GB"
        out.append(_target(text, peak, peak < TARGET_ALIBI_PEAK_BYTES))
        if x_causal is not None:
            text = f"ALiBi L={r['seq']} time <= {TARGET_ALIBI_X_CAUSAL:g}x causal SDPA"
            out.append(_target(text, x_causal, x_causal <= TARGET_ALIBI_X_CAUSAL))
    for r in serving_rows:
        mode = "compiled" if r["compiled"] else "eager"
        text = f"RoPE {r['kind']} batch {r['batch']} x {r['seq']} tokens, {mode}: >= 1x HF"
        out.append(_target(text, r["speedup_vs_hf"], r["speedup_vs_hf"] >= 1.0))
    return out + bias_targets(bias_rows)


def targets_table(rows: list[dict]) -> str:
    """One line per target: met or not, and the measured value (MiB for a peak)."""
    lines = ["Targets"]
    for t in rows:
        v = t["value"]
        if v is None:
            shown = "not measured"
        else:
            shown = f"{v / 2**20:.0f} MiB" if "peak" in t["target"] else f"{v:.2f}"
        lines.append(f"  [{'met' if t['met'] else 'NOT met'}] {t['target']}: {shown}")
    return "\n".join(lines)
