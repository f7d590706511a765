"""Positional-encoding formulas in numpy, written to be read. The oracle every other implementation is tested
against.

Everything here is float64 and unoptimised on purpose: it should be possible to check each line
by eye against the papers each function cites.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "inverse_frequencies",
    "sinusoidal",
    "sinusoidal_shift_matrix",
    "rope",
    "alibi_slopes",
    "alibi_bias",
    "softmax",
    "attention",
    "t5_relative_bucket",
    "t5_bias",
    "kerple_bias",
    "sandwich_bias",
    "fire_bias",
    "xpos_zeta",
    "xpos",
    "blockwise_causal_mask",
    "shaw_attention",
    "cope_attention",
    "forgetting_attention",
    "banded_bias",
    "banded_attention",
    "selfextend_distance",
    "rerope_distance",
    "string_distance",
    "dual_chunk_distance",
    "remapped_attention",
    "fope_frequencies",
    "fope",
    "ssmax_attention",
]


def _array(x) -> np.ndarray:
    """``x`` as a float64 numpy array; torch tensors (any device, with or without grad) are accepted so
    that tests can hand the oracle what the module under test produced. torch is never imported here."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().double()  # double first: numpy has no bfloat16
    return np.asarray(x, dtype=np.float64)


def inverse_frequencies(dim: int, base: float = 10000.0) -> np.ndarray:
    """omega_k = 1 / base^(2k/dim) for k = 0 .. dim/2 - 1 (Vaswani et al. 2017, Su et al. 2021). Shape
    (dim/2,)."""
    k = np.arange(0, dim, 2, dtype=np.float64)
    return 1.0 / (base ** (k / dim))


def sinusoidal(max_len: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """Sinusoidal encoding (Vaswani et al. 2017, section 3.5). Shape (max_len, d_model).

    PE[p, 2k] = sin(p * omega_k), PE[p, 2k+1] = cos(p * omega_k).
    """
    angles = np.arange(max_len, dtype=np.float64)[:, None] * inverse_frequencies(d_model, base)[None, :]
    pe = np.zeros((max_len, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


def sinusoidal_shift_matrix(delta: float, d_model: int, base: float = 10000.0) -> np.ndarray:
    """The (d_model, d_model) block-diagonal matrix M(delta) with PE[p + delta] = M(delta) @ PE[p] for every
    p.

    Each (sin, cos) pair is rotated by omega_k * delta (the footnote of Vaswani et al. 2017, section 3.5).
    """
    m = np.zeros((d_model, d_model))
    for k, w in enumerate(inverse_frequencies(d_model, base)):
        c, s = math.cos(w * delta), math.sin(w * delta)
        m[2 * k : 2 * k + 2, 2 * k : 2 * k + 2] = [[c, s], [-s, c]]
    return m


def _pair_indices(d: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the first and second member of each rotated pair."""
    if layout == "interleaved":  # pairs (0, 1), (2, 3), ...: Su et al. 2021, Meta's Llama, GPT-J
        return np.arange(0, d, 2), np.arange(1, d, 2)
    if layout == "half":  # pairs (i, i + d/2): GPT-NeoX, Hugging Face Llama
        return np.arange(d // 2), np.arange(d // 2, d)
    raise ValueError(f"layout must be 'interleaved' or 'half', got {layout!r}")


def rope(
    x: np.ndarray,
    positions: np.ndarray,
    base: float = 10000.0,
    layout: str = "interleaved",
    rotary_dim: int | None = None,
    inv_freq: np.ndarray | None = None,
    attention_factor: float = 1.0,
) -> np.ndarray:
    """Rotary positional embedding (Su et al. 2021, eq. 34). x: (..., seq, d); positions: (seq,) or (batch,
    seq).

    Pair k of the first ``rotary_dim`` dimensions is rotated by theta = p * omega_k:
    (a, b) -> (a cos theta - b sin theta, a sin theta + b cos theta). Dimensions past rotary_dim are
    unchanged. ``inv_freq`` overrides the default schedule (context-extension methods), and
    ``attention_factor`` scales cos and sin as Hugging Face transformers does for YaRN and LongRoPE.
    Batched positions (batch, seq) apply to the leading dimension of x.
    """
    x = _array(x)
    d = x.shape[-1]
    r = d if rotary_dim is None else rotary_dim
    w = inverse_frequencies(r, base) if inv_freq is None else _array(inv_freq)
    pos = _array(positions)
    theta = pos[..., None] * w  # (seq, r/2) or (batch, seq, r/2)
    if theta.ndim == 3:  # line the batch axis up with x's leading axis
        theta = theta.reshape(theta.shape[:1] + (1,) * (x.ndim - 3) + theta.shape[1:])
    cos, sin = np.cos(theta) * attention_factor, np.sin(theta) * attention_factor
    first, second = _pair_indices(r, layout)
    a, b = x[..., first], x[..., second]
    out = x.copy()
    out[..., first] = a * cos - b * sin
    out[..., second] = a * sin + b * cos
    return out


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi head slopes (Press et al. 2021). Shape (n_heads,).

    For a power of two H: m_h = 2^(-8h/H), h = 1..H (Press et al. 2021). Otherwise, as the paper's code does:
    the schedule for the largest power of two P below H, then every other slope of the schedule for 2P,
    until there are H.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")

    def power_of_two(h: int) -> list[float]:
        return [2.0 ** (-8.0 * i / h) for i in range(1, h + 1)]

    p = 2 ** math.floor(math.log2(n_heads))
    if p == n_heads:
        return np.array(power_of_two(n_heads))
    return np.array(power_of_two(p) + power_of_two(2 * p)[0::2][: n_heads - p])


def alibi_bias(
    seq_len: int, n_heads: int, causal: bool = True, slopes: np.ndarray | None = None
) -> np.ndarray:
    """ALiBi's bias (Press et al. 2021) -m_h * |i - j|. Shape (n_heads, seq_len, seq_len).

    With causal=True (the default, as for ``posenc.ALiBi.bias``) the future (j > i) is -inf, so the result
    doubles as the causal mask; causal=False gives the symmetric bias everywhere.
    """
    m = alibi_slopes(n_heads) if slopes is None else _array(slopes)
    i = np.arange(seq_len)
    distance = np.abs(i[:, None] - i[None, :]).astype(np.float64)
    bias = -m[:, None, None] * distance[None]
    if causal:
        bias = np.where(i[None, :] > i[:, None], -np.inf, bias)
    return bias


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax; a row that is all -inf gives zeros, not NaN."""
    x = _array(x)
    peak = np.max(x, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    e = np.exp(x - peak)
    total = e.sum(axis=axis, keepdims=True)
    return e / np.where(total > 0, total, 1.0)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    bias: np.ndarray | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> np.ndarray:
    """Scaled dot-product attention (Vaswani et al. 2017, eq. 1) with an optional additive score bias.

    q: (..., Lq, d), k: (..., Lk, d), v: (..., Lk, dv); bias broadcastable to (..., Lq, Lk).
    With causal=True a query may not see keys after it; when Lq < Lk the queries are the last Lq
    positions (decoding with a cache).
    """
    q, k, v = (_array(t) for t in (q, k, v))
    bias = None if bias is None else _array(bias)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if bias is not None:
        scores = scores + bias
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        qi = np.arange(lk - lq, lk)[:, None]
        scores = np.where(np.arange(lk)[None, :] > qi, -np.inf, scores)
    return softmax(scores) @ v


def mrope_axis(k: int, mrope_section, interleaved: bool = False, order: str | None = None) -> int:
    """The position axis (0 time, then height, width, ...) frequency pair k follows in M-RoPE.

    Contiguous (Qwen2-VL, Wang et al. 2024, arxiv.org/abs/2409.12191, sec. 2.1): the first section[0]
    pairs follow time, the next section[1] height, and so on. Interleaved (Qwen3-VL; NeoMME with two
    axes): with n axes, pair k follows axis a = k mod n >= 1 while k < n * section[a], else time.
    Spatial-interleaved (ERNIE-4.5-VL): the first pairs cycle through the spatial axes 1 .. n-1, the last
    section[0] follow time.
    """
    order = order or ("interleaved" if interleaved else "contiguous")
    n = len(mrope_section)
    if order == "interleaved":
        a = k % n
        return a if a >= 1 and k < n * mrope_section[a] else 0
    if order == "spatial-interleaved":
        return 1 + k % (n - 1) if k < sum(mrope_section) - mrope_section[0] else 0
    return int(np.searchsorted(np.cumsum(mrope_section), k, side="right"))


def mrope(
    x: np.ndarray,
    positions: np.ndarray,
    mrope_section,
    base: float = 10000.0,
    interleaved: bool = False,
    layout: str = "half",
    order: str | None = None,
) -> np.ndarray:
    """Multimodal RoPE (Wang et al. 2024, "Qwen2-VL", sec. 2.1). x: (batch, heads, seq, d); positions:
    (axes, batch, seq) as (time, height, width, ...), one axis per mrope_section entry.

    Pair k (of d/2 = sum(mrope_section)) is rotated by theta = p[axis(k)] * omega_k, omega_k =
    base^(-2k/d), with axis(k) from :func:`mrope_axis`. The pairing of dimensions is ``layout`` ("half":
    (k, k + d/2), as both Qwen2-VL and Qwen3-VL rotate), whatever the order of the frequency slots.
    """
    x = np.asarray(x, dtype=np.float64)
    pos = np.asarray(positions, dtype=np.float64)
    d = x.shape[-1]
    first, second = _pair_indices(d, layout)
    out = x.copy()
    for k, w in enumerate(inverse_frequencies(d, base)):
        theta = pos[mrope_axis(k, mrope_section, interleaved, order)] * w  # (batch, seq)
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        a, b = x[..., first[k]], x[..., second[k]]
        out[..., first[k]] = a * cos - b * sin
        out[..., second[k]] = a * sin + b * cos
    return out


def axial_frequencies(head_dim: int, axes: int = 2, base: float = 100.0) -> np.ndarray:
    """RoPE-Axial frequencies (Heo et al. 2024, arxiv.org/abs/2403.13298, eq. 9-10). Shape (axes, 1,
    head_dim/2).

    The head_dim/2 pairs are split into ``axes`` equal blocks; pair j of block a turns with
    base^(-2 * axes * j / head_dim) along axis a and not at all along the other axes.
    """
    m = head_dim // (2 * axes)
    freqs = np.zeros((axes, 1, head_dim // 2))
    for a in range(axes):
        for j in range(m):
            freqs[a, 0, a * m + j] = base ** (-2.0 * axes * j / head_dim)
    return freqs


def axial_rope(
    x: np.ndarray,
    positions: np.ndarray,
    freqs: np.ndarray,
    layout: str = "interleaved",
    prefix_tokens: int = 0,
) -> np.ndarray:
    """RoPE on a grid of patches (Heo et al. 2024, eq. 9-12). x: (batch, heads, prefix_tokens + N, d);
    positions: (N, axes) coordinates; freqs: (axes, heads or 1, d/2).

    Pair k of head h of the token at p is rotated by theta = sum_a p_a * freqs[a, h, k] (axial: each
    pair follows one axis; RoPE-Mixed: learned mixtures). The first ``prefix_tokens`` tokens (class and
    register tokens) are not rotated.
    """
    x = np.asarray(x, dtype=np.float64)
    pos = np.asarray(positions, dtype=np.float64)
    theta = np.einsum("na,ahk->hnk", pos, np.asarray(freqs, dtype=np.float64))  # (heads, N, d/2)
    first, second = _pair_indices(x.shape[-1], layout)
    out = x.copy()
    grid = slice(prefix_tokens, None)
    a, b = x[..., grid, :][..., first], x[..., grid, :][..., second]
    cos, sin = np.cos(theta), np.sin(theta)
    out[..., grid, first] = a * cos - b * sin
    out[..., grid, second] = a * sin + b * cos
    return out


def _query_key_positions(q_len: int, k_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Query positions (q_len, 1), the last q_len of the k_len key positions (1, k_len)."""
    return np.arange(k_len - q_len, k_len)[:, None], np.arange(k_len)[None, :]


def t5_relative_bucket(
    relative: int, bidirectional: bool = False, num_buckets: int = 32, max_distance: int = 128
) -> int:
    """T5's bucket of one relative position ``relative`` = key - query (Raffel et al. 2020, section 2.1; Mesh
    TensorFlow's ``_relative_position_bucket``).

    Bidirectional: half the buckets for keys after the query. Then the first half of a direction's n buckets
    hold the distances 0 .. n/2 - 1 exactly; a distance d >= n/2 goes to n/2 + floor(log(d / (n/2)) /
    log(max_distance / (n/2)) * (n - n/2)), at most n - 1. The logarithm is rounded to float32, as
    transformers computes it, so that boundaries agree.
    """
    bucket = 0
    n = num_buckets
    if bidirectional:
        n //= 2
        if relative > 0:
            bucket += n
        distance = abs(relative)
    else:
        distance = max(-relative, 0)
    exact = n // 2
    if distance < exact:
        return bucket + distance
    ratio = np.float32(np.log(np.float32(distance) / np.float32(exact)))
    large = exact + int(ratio / np.float32(math.log(max_distance / exact)) * np.float32(n - exact))
    return bucket + min(large, n - 1)


def t5_bias(
    q_len: int,
    k_len: int,
    weight: np.ndarray,
    bidirectional: bool = False,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> np.ndarray:
    """T5's relative attention bias (Raffel et al. 2020): b[h, i, j] = weight[bucket(j - i), h]. Shape
    (heads, q_len, k_len); weight (num_buckets, heads); queries are the last q_len positions; no mask."""
    weight = _array(weight)
    qi, kj = _query_key_positions(q_len, k_len)
    out = np.zeros((weight.shape[1], q_len, k_len))
    for a in range(q_len):
        for j in range(k_len):
            rel = int(kj[0, j] - qi[a, 0])
            out[:, a, j] = weight[t5_relative_bucket(rel, bidirectional, num_buckets, max_distance)]
    return out


def kerple_bias(q_len: int, k_len: int, r1, r2, kind: str = "log") -> np.ndarray:
    """KERPLE's kernels as a bias (Chi et al. 2022, arxiv.org/abs/2205.09921, section 4): per head,
    log: -r1 * log(1 + r2 * |i - j|); power: -r1 * |i - j|^r2. Shape (heads, q_len, k_len); no mask."""
    r1, r2 = _array(r1)[:, None, None], _array(r2)[:, None, None]
    qi, kj = _query_key_positions(q_len, k_len)
    d = np.abs(qi - kj).astype(np.float64)[None]
    if kind == "log":
        return -r1 * np.log(1.0 + r2 * d)
    if kind == "power":
        return -r1 * d**r2
    raise ValueError(f"kind must be 'log' or 'power', got {kind!r}")


def sandwich_bias(q_len: int, k_len: int, n_heads: int, dim: int = 128) -> np.ndarray:
    """Sandwich (Chi et al. 2023, arxiv.org/abs/2212.10356): the inner product of the sinusoidal embeddings of
    the two positions minus its value dim/2 at distance 0, divided by head h's compression ratio 8h/H.
    Shape (n_heads, q_len, k_len); no mask."""
    pe = sinusoidal(k_len, dim)
    inner = pe[k_len - q_len :] @ pe.T - dim / 2
    ratio = np.arange(1, n_heads + 1) * 8.0 / n_heads
    return inner[None] / ratio[:, None, None]


def fire_bias(q_len: int, k_len: int, w1, b1, w2, b2, c: float, threshold: float, eps: float = 1e-6):
    """FIRE (Li et al. 2023, arxiv.org/abs/2310.04418, eq. 5-7): b[h, i, j] = f(psi(i - j) / psi(max(L, i)))_h
    with psi(x) = log(c |x| + 1) (+ eps on the normaliser), f(u) = w2 relu(w1 u + b1) + b2. w1, b1: (hidden,);
    w2: (heads, hidden); b2: (heads,). Shape (heads, q_len, k_len); no mask."""
    w1, b1, w2, b2 = (_array(t) for t in (w1, b1, w2, b2))
    qi, kj = _query_key_positions(q_len, k_len)
    psi_rel = np.log(np.abs(c * (qi - kj)) + 1.0)
    psi_norm = np.log(np.abs(c * np.maximum(threshold, qi)) + 1.0) + eps
    u = psi_rel / psi_norm  # (q_len, k_len)
    hidden = np.maximum(0.0, u[..., None] * w1.reshape(-1) + b1)  # (q_len, k_len, hidden)
    return np.moveaxis(hidden @ w2.T + b2, -1, 0)


# xPos


def xpos_zeta(dim: int, gamma: float = 0.4) -> np.ndarray:
    """xPos's per-pair decay base zeta_i = (2i/dim + gamma) / (1 + gamma), i = 0 .. dim/2 - 1 (Sun et al.
    2022, arxiv.org/abs/2212.10554, section 3.2). Shape (dim/2,); every zeta_i lies in (0, 1)."""
    return np.array([(2.0 * i / dim + gamma) / (1.0 + gamma) for i in range(dim // 2)])


def xpos(
    x: np.ndarray,
    positions: np.ndarray,
    kind: str,
    centre,
    base: float = 10000.0,
    scale_base: float = 512.0,
    gamma: float = 0.4,
    layout: str = "interleaved",
    rotary_dim: int | None = None,
) -> np.ndarray:
    """xPos (Sun et al. 2022, Algorithm 1): RoPE, then both members of pair i times zeta_i^(+(p - c)/B) for a
    query (kind="q") or zeta_i^(-(p - c)/B) for a key (kind="k"), B = scale_base, c = centre. A query at n and
    a key at m then score zeta_i^((n - m)/B) times RoPE's term in every pair; c cancels.

    x: (..., seq, d); positions: (seq,) or (batch, seq) (applied to x's leading axis); centre: a number, or
    one per sequence (batch,). Dimensions past rotary_dim are neither rotated nor scaled.
    """
    if kind not in ("q", "k"):
        raise ValueError(f"kind must be 'q' or 'k', got {kind!r}")
    x = _array(x)
    r = x.shape[-1] if rotary_dim is None else rotary_dim
    out = rope(x, positions, base=base, layout=layout, rotary_dim=r)
    zeta = xpos_zeta(r, gamma)
    pos = _array(positions)
    c = _array(centre)
    if c.ndim == 1:  # one centre per sequence
        pos = pos if pos.ndim == 2 else np.broadcast_to(pos, (c.shape[0],) + pos.shape)
        c = c[:, None]
    sign = 1.0 if kind == "q" else -1.0
    exponent = sign * (pos - c) / scale_base  # (seq,) or (batch, seq)
    scale = zeta ** exponent[..., None]  # (seq, r/2) or (batch, seq, r/2)
    if scale.ndim == 3:
        scale = scale.reshape(scale.shape[:1] + (1,) * (x.ndim - 3) + scale.shape[1:])
    first, second = _pair_indices(r, layout)
    out[..., first] = out[..., first] * scale
    out[..., second] = out[..., second] * scale
    return out


def blockwise_causal_mask(q_len: int, k_len: int, window: int, offset: int = 0) -> np.ndarray:
    """Blockwise causal attention (Sun et al. 2022, section 3.3): positions fall in blocks of ``window``
    (the paper: half the training length); a query sees the keys at or before it in its own block and the
    previous one. Queries are the last q_len of the k_len keys, which sit at offset .. offset+k_len-1.
    Boolean (q_len, k_len), True where a query may attend."""
    mask = np.zeros((q_len, k_len), dtype=bool)
    for a in range(q_len):
        i = offset + k_len - q_len + a
        first_visible = (i // window - 1) * window
        for j in range(k_len):
            p = offset + j
            mask[a, j] = first_visible <= p <= i
    return mask


# Shaw and CoPE


def shaw_attention(q, k, v, a_k, a_v, causal: bool = False, scale: float | None = None) -> np.ndarray:
    """Relative position representations (Shaw, Uszkoreit and Vaswani 2018, arxiv.org/abs/1803.02155,
    eq. 3-5):

    e_ij = q_i . (k_j + a_k[c(j - i)]) * scale,  out_i = sum_j softmax_j(e_ij) (v_j + a_v[c(j - i)]),
    c(d) = clip(d, -m, m) + m with a_k (2m + 1, d), a_v (2m + 1, dv). q (..., Lq, d), k (..., Lk, d),
    v (..., Lk, dv); queries are the last Lq positions; with causal a query sees no key after it.
    Returns (..., Lq, dv).
    """
    q, k, v, a_k, a_v = (_array(t) for t in (q, k, v, a_k, a_v))
    m = (a_k.shape[0] - 1) // 2
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    lq, lk = q.shape[-2], k.shape[-2]
    out = np.zeros((*q.shape[:-1], v.shape[-1]))
    for a in range(lq):
        i = lk - lq + a
        e = np.full((*q.shape[:-2], lk), -np.inf)
        for j in range(lk):
            if causal and j > i:
                continue
            r = min(max(j - i, -m), m) + m
            e[..., j] = np.einsum("...d,...d->...", q[..., a, :], k[..., j, :] + a_k[r]) * scale
        p = softmax(e)
        for j in range(lk):
            r = min(max(j - i, -m), m) + m
            out[..., a, :] += p[..., j, None] * (v[..., j, :] + a_v[r])
    return out


def cope_attention(q, k, v, pos_emb, scale: float | None = None) -> np.ndarray:
    """Contextual position encoding, causal (Golovneva et al. 2024, arxiv.org/abs/2405.18719, eq. 3-5, as the
    reference code ``ContextPosSelfAttn`` computes it). For query i and keys j <= i:

    g_ij = sigmoid(q_i . k_j * scale);  p_ij = min(sum_{t=j..i} g_it, npos - 1);
    e_i[n] = q_i . pos_emb[:, n] * scale;  w = p_ij - floor(p_ij);
    s_ij = q_i . k_j * scale + w e_i[ceil p_ij] + (1 - w) e_i[floor p_ij];  out_i = sum_j softmax_j(s_ij) v_j.

    q (..., Lq, d), k (..., Lk, d), v (..., Lk, dv), pos_emb (d, npos); queries are the last Lq positions.
    Returns (..., Lq, dv).
    """
    q, k, v, pos_emb = (_array(t) for t in (q, k, v, pos_emb))
    npos = pos_emb.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    lq, lk = q.shape[-2], k.shape[-2]
    out = np.zeros((*q.shape[:-1], v.shape[-1]))
    for a in range(lq):
        i = lk - lq + a
        z = np.stack([np.sum(q[..., a, :] * k[..., j, :], -1) * scale for j in range(i + 1)], axis=-1)
        gates = 1.0 / (1.0 + np.exp(-z))
        e = np.einsum("...d,dn->...n", q[..., a, :], pos_emb) * scale
        s = np.full((*q.shape[:-2], lk), -np.inf)
        for j in range(i + 1):
            p = np.minimum(gates[..., j:].sum(-1), npos - 1)
            lo, hi = np.floor(p).astype(int), np.ceil(p).astype(int)
            w = p - lo
            e_lo = np.take_along_axis(e, lo[..., None], -1)[..., 0]
            e_hi = np.take_along_axis(e, hi[..., None], -1)[..., 0]
            s[..., j] = z[..., j] + w * e_hi + (1 - w) * e_lo
        out[..., a, :] = np.einsum("...j,...jd->...d", softmax(s), v)
    return out


def forgetting_attention(q, k, v, log_forget, scale: float | None = None) -> np.ndarray:
    """Forgetting Attention, the attention of FoX (Lin, Nikishin, He & Courville 2025,
    arxiv.org/abs/2503.02130, sec. 2): causal softmax attention whose score of query i and key j <= i gets
    the decay D_ij = sum_{l=j+1..i} log f_l (so D_ii = 0):

    out_i = sum_j softmax_j(q_i . k_j * scale + D_ij) v_j.

    q (..., Lq, d), k (..., Lk, d), v (..., Lk, dv), log_forget (..., Lk): log f_t of every key position,
    the leading axes q's; queries are the last Lq positions. Returns (..., Lq, dv).
    """
    q, k, v, log_f = (_array(t) for t in (q, k, v, log_forget))
    lq, lk = q.shape[-2], k.shape[-2]
    decay = np.full((*log_f.shape[:-1], lq, lk), -np.inf)
    for a in range(lq):
        i = lk - lq + a
        # entry j of the reversed running sum of log f_i, log f_(i-1), ..., log f_1 is sum_{l=j+1..i}
        decay[..., a, :i] = np.cumsum(log_f[..., i:0:-1], axis=-1)[..., ::-1]
        decay[..., a, i] = 0.0
    return attention(q, k, v, bias=decay, causal=True, scale=scale)


def banded_bias(rel_states, rel_table, k_len: int) -> np.ndarray:
    """Inkling's hidden-state-conditioned banded relative bias (Thinking Machines Lab 2026; Hugging Face
    transformers' ``InklingRelativeLogits``): query i and key j get

    b_ij = r_i . P[:, i - j]  for 0 <= i - j < extent,  0 otherwise (later keys, and beyond the extent).

    rel_states r (..., Lq, d_rel), rel_table P (d_rel, extent); the queries are the last Lq of k_len
    positions. Returns (..., Lq, k_len), every entry written one pair at a time.
    """
    r, table = _array(rel_states), _array(rel_table)
    lq, extent = r.shape[-2], table.shape[1]
    bias = np.zeros((*r.shape[:-1], k_len))
    for a in range(lq):
        i = k_len - lq + a
        for j in range(max(0, i - extent + 1), i + 1):  # 0 <= i - j < extent; every other entry stays 0
            bias[..., a, j] = r[..., a, :] @ table[:, i - j]
    return bias


def banded_attention(q, k, v, rel_states, rel_table, scale: float | None = None) -> np.ndarray:
    """Causal attention with Inkling's banded bias (:func:`banded_bias`):
    out_i = sum_{j <= i} softmax_j(q_i . k_j * scale + b_ij) v_j.

    q (..., Lq, d), k (..., Lk, d), v (..., Lk, dv), rel_states (..., Lq, d_rel) with q's leading axes,
    rel_table (d_rel, extent); queries are the last Lq positions. Returns (..., Lq, dv).
    """
    bias = banded_bias(rel_states, rel_table, _array(k).shape[-2])
    return attention(q, k, v, bias=bias, causal=True, scale=scale)


def packed_positions(lengths) -> np.ndarray:
    """Positions of documents of these lengths packed into one row: 0..n1-1, 0..n2-1, ... (int64)."""
    return np.concatenate([np.arange(n, dtype=np.int64) for n in lengths] or [np.zeros(0, np.int64)])


# ---------------------------------------------------------------------------------------------- remaps
# Training-free context extension: each function gives every (query i, key j) pair, j <= i, its remapped
# distance (NaN above the diagonal); positions are absolute, queries the last q_len of the k_len keys.


def _causal_distances(q_len: int, k_len: int, offset: int = 0):
    i, j = _query_key_positions(q_len, k_len)
    return i + offset, j + offset, np.where(j <= i, (i - j).astype(np.float64), np.nan)


def selfextend_distance(q_len: int, k_len: int, group_size: int, window: int, offset: int = 0) -> np.ndarray:
    """SelfExtend (Jin et al. 2024, arxiv.org/abs/2401.01325): d if d < W, else
    i // G - j // G + W - W // G. (q_len, k_len)."""
    i, j, d = _causal_distances(q_len, k_len, offset)
    grouped = i // group_size - j // group_size + window - window // group_size
    return np.where(d < window, d, np.where(np.isnan(d), np.nan, grouped))


def rerope_distance(q_len: int, k_len: int, window: int, leaky: float | None = None, offset: int = 0):
    """ReRoPE (Su 2023, github.com/bojone/rerope): d if d < W, else W; leaky ReRoPE with slope divisor k:
    W + (d - W) / k beyond the window. (q_len, k_len)."""
    _, _, d = _causal_distances(q_len, k_len, offset)
    far = window if leaky is None else window + (d - window) / leaky
    return np.where(np.isnan(d), np.nan, np.where(d < window, d, far))


def string_distance(q_len: int, k_len: int, shift: int, local_window: int, offset: int = 0) -> np.ndarray:
    """STRING (An et al. 2024, arxiv.org/abs/2410.18745): d if d < N, else d - N + W. (q_len, k_len)."""
    _, _, d = _causal_distances(q_len, k_len, offset)
    return np.where(d < shift, d, d - shift + local_window)


def dual_chunk_distance(q_len: int, k_len: int, chunk_size: int, local_size: int, offset: int = 0):
    """Dual Chunk Attention (An et al. 2024, arxiv.org/abs/2402.17463), positions as vLLM's
    DualChunkRotaryEmbedding: chunks of c = chunk_size - local_size; the key at j mod c; the query at
    i mod c for a key in its own chunk, min(i mod c + c, chunk_size) in the chunk before, min(2c - 1,
    chunk_size) further back. (q_len, k_len)."""
    i, j, d = _causal_distances(q_len, k_len, offset)
    c = chunk_size - local_size
    gap = i // c - j // c
    query = np.where(
        gap == 0, i % c, np.where(gap == 1, np.minimum(i % c + c, chunk_size), min(2 * c - 1, chunk_size))
    )
    return np.where(np.isnan(d), np.nan, (query - j % c).astype(np.float64))


def remapped_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    distance: np.ndarray,
    base: float = 10000.0,
    layout: str = "interleaved",
    rotary_dim: int | None = None,
    inv_freq: np.ndarray | None = None,
    attention_factor: float = 1.0,
    query_scale: np.ndarray | None = None,
    scale: float | None = None,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Causal RoPE attention where pair (i, j) scores at the remapped ``distance[i, j]`` (NaN: masked).

    RoPE's score depends on positions only through their difference: rot(q, p) . rot(k, p') =
    rot(q, p - p') . rot(k, 0). So query i is rotated, for each key j, by distance[i, j], and the key at 0.
    q: (..., Lq, d); k: (..., Lk, d); v: (..., Lk, dv); ``query_scale`` (Lq,) multiplies each query first
    (ReRoPE's log-n scaling). ``sinks`` (heads,): attention sinks (as in GPT-OSS), one more logit per row of
    head h's softmax whose value is zero; q's third-last axis is the heads.
    """
    q, k, v = (_array(t) for t in (q, k, v))
    dist = _array(distance)
    lq, lk = dist.shape
    if query_scale is not None:
        q = q * _array(query_scale)[:, None]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    kw = dict(
        base=base, layout=layout, rotary_dim=rotary_dim, inv_freq=inv_freq, attention_factor=attention_factor
    )
    k0 = rope(k, np.zeros(lk), **kw)
    scores = np.full((*q.shape[:-2], lq, lk), -np.inf)
    for i in range(lq):
        seen = ~np.isnan(dist[i])
        qi = np.broadcast_to(q[..., i : i + 1, :], (*q.shape[:-2], lk, q.shape[-1]))
        rotated = rope(qi, np.where(seen, dist[i], 0.0), **kw)
        scores[..., i, :] = np.where(seen, (rotated * k0).sum(-1) * scale, -np.inf)
    if sinks is None:
        return softmax(scores) @ v
    column = np.broadcast_to(_array(sinks)[:, None, None], (*scores.shape[:-1], 1))
    return softmax(np.concatenate([scores, column], axis=-1))[..., :-1] @ v


def fope_frequencies(head_dim: int, base: float, train_len: int, fourier_dim: int | None = None):
    """FoPE's frequencies (Hua et al. 2024, arxiv.org/abs/2412.17739, section 4): the floor is
    omega_l = 2 pi / train_len; returns (the input frequencies omega_j = base^(-2j/fourier_dim) at or above
    it, (D,); a boolean (head_dim/2,): which pairs' own frequency base^(-2m/head_dim) is at or above it, the
    pairs that carry a Fourier series, the others clipped to the zero frequency)."""
    fourier_dim = head_dim if fourier_dim is None else fourier_dim
    floor = 2 * math.pi / train_len
    inputs = [base ** (-2.0 * j / fourier_dim) for j in range(fourier_dim // 2)]
    own = [base ** (-2.0 * m / head_dim) for m in range(head_dim // 2)]
    return np.array([w for w in inputs if w >= floor]), np.array([w >= floor for w in own])


def fope(
    x,
    positions,
    cos_coef,
    sin_coef,
    train_len: int,
    base: float = 10000.0,
    fourier_dim: int | None = None,
    layout: str = "interleaved",
) -> np.ndarray:
    """Fourier Position Embedding (Hua et al. 2024, eqs. 11-13 and appendix B's pseudo-code), one term at a
    time. x: (..., heads, seq, d); positions: (seq,) or (batch, seq) (applied to x's leading axis);
    cos_coef, sin_coef: (heads, D, M') for the D input frequencies and the M' pairs that carry a series
    (:func:`fope_frequencies`).

    Pair m of head h at position p: a pair below the floor is left as it is (the zero frequency); any
    other, (a, b) -> (a C - b S, a S + b C) with
    C = sum_j cos_coef[h, j, m] cos(omega_j p) / sum_j cos_coef[h, j, m] and S the same with sin_coef, sin.
    """
    x = _array(x)
    out = x.copy()
    d = x.shape[-1]
    omega, series = fope_frequencies(d, base, train_len, fourier_dim)
    cc, sc = _array(cos_coef), _array(sin_coef)
    pos = _array(positions)
    if pos.ndim == 1:
        pos = np.broadcast_to(pos, x.shape[:1] + pos.shape)
    first, second = _pair_indices(d, layout)
    for idx in np.ndindex(*x.shape[:-2]):
        h = idx[-1]
        for t in range(x.shape[-2]):
            p = pos[idx[0], t]
            for m in np.flatnonzero(series):
                c = sum(cc[h, j, m] * math.cos(w * p) for j, w in enumerate(omega)) / cc[h, :, m].sum()
                s = sum(sc[h, j, m] * math.sin(w * p) for j, w in enumerate(omega)) / sc[h, :, m].sum()
                a, b = x[idx + (t, first[m])], x[idx + (t, second[m])]
                out[idx + (t, first[m])] = a * c - b * s
                out[idx + (t, second[m])] = a * s + b * c
    return out


def ssmax_attention(q, k, v, s, scale: float | None = None) -> np.ndarray:
    """Causal attention with scalable softmax (SSMax; Nakanishi 2025, arxiv.org/abs/2501.19399): the scores
    of a query that sees n keys are multiplied by s_h * log(n), s (heads,) one scalar per head, so a row's
    softmax does not flatten as n grows. q: (..., heads, Lq, d); k: (..., heads, Lk, d); v: (..., heads, Lk,
    dv). The queries are the last Lq of the Lk positions, so query i sees n = Lk - Lq + i + 1 keys."""
    q, k, v = (_array(t) for t in (q, k, v))
    lq, lk = q.shape[-2], k.shape[-2]
    n = np.arange(lk - lq + 1, lk + 1, dtype=np.float64)
    factor = _array(s)[:, None] * np.log(n)[None, :]  # (heads, Lq)
    return attention(q * factor[..., None], k, v, causal=True, scale=scale)
