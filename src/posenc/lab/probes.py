"""Probes of whether a model uses context at all: far-context gain and copying a repeated segment.

A flat perplexity past the training length L does not show that a model reads the far context: a
model that attends only to its last L tokens is flat too, and ALiBi's flatness can be reproduced by a
sliding window (Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in
Transformers", arxiv.org/abs/2305.19466). Both probes are model-agnostic and cheap (a few dozen
windows per length).

Far-context gain at length n: the same last ``last`` tokens of each window are scored twice, once with
the whole window (n tokens) as context and once with only its last L tokens;
``gain = ppl(last-L context) / ppl(full context)``. Above 1, tokens farther back than L help; 1, the
model behaves like a window of L; below 1, the far tokens hurt. The short run keeps every position
inside the training length, so it measures context, not extrapolation; its scored tokens have between
L - last + 1 and L tokens of context, so a model that reads exactly its last L tokens scores slightly
above 1 (exactly 1 with ``last = 1``).

Copy probe at length n: windows whose second half repeats the first (``s + s``); perplexity on the
repeated half against perplexity on the same tokens in the first half. A model that looks back and
copies predicts the repeat far better (induction heads, Olsson et al. 2022).

Shapes: windows are ``(N, n + 1)`` int64 token ids (inputs ``[:, :-1]``, targets ``[:, 1:]``); losses
are ``(N, n)`` float64 nats.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from posenc.lab.data import repeat_rows, windows

__all__ = ["context_reach", "copy_probe", "far_context_gain", "probe_windows"]


def probe_windows(val: np.ndarray, length: int, n_windows: int) -> torch.Tensor:
    """The first ``n_windows`` non-overlapping windows of ``length`` (fewer when the split is short):
    the rows of the windows protocol's ``windows(val, length, max_tokens)``, in the same order."""
    return windows(val, length, n_windows * length)[:n_windows]


def far_context_gain(
    losses_fn,
    rows: torch.Tensor,
    train_len: int,
    *,
    last: int = 32,
    full_losses: torch.Tensor | None = None,
) -> float | None:
    """``ppl(last train_len tokens as context) / ppl(whole window as context)`` on the last ``last``
    targets of ``rows`` ``(N, n + 1)``; None when ``n <= train_len`` (both contexts are the window).

    ``losses_fn(windows) -> (N, T) losses`` runs the model. ``full_losses`` (``(M, n)``, M <= N): losses
    of the first M rows that were already computed (the windows protocol's), so only the rest are run.
    """
    n = rows.shape[1] - 1
    if n <= train_len:
        return None
    last = min(last, train_len)
    have = 0 if full_losses is None else min(full_losses.shape[0], rows.shape[0])
    parts = [full_losses[:have, -last:]] if have else []
    if have < rows.shape[0]:
        parts.append(losses_fn(rows[have:])[:, -last:])
    full = torch.cat(parts)
    short = losses_fn(rows[:, -(train_len + 1) :])[:, -last:]
    return math.exp(short.mean().item() - full.mean().item())


def context_reach(
    losses_fn, rows: torch.Tensor, train_len: int, *, last: int = 32, full_losses: torch.Tensor | None = None
) -> dict[int, float]:
    """Far-context gain inside the training length: for c = L/4 and L/2, ``ppl(last c tokens as context) /
    ppl(whole window)`` on windows ``rows`` ``(N, L + 1)``, every ratio on the same last ``min(last, L/4)``
    targets, so that they compare. How far back within what it was trained on a model reads: near 1 at
    L/4, it uses a quarter of its context at most. ``{}`` when L < 8 (no quarter to speak of)."""
    if train_len < 8:
        return {}
    contexts = (train_len // 4, train_len // 2)
    last = min(last, contexts[0])
    return {c: far_context_gain(losses_fn, rows, c, last=last, full_losses=full_losses) for c in contexts}


def copy_probe(losses_fn, rows: torch.Tensor) -> tuple[float, float]:
    """``(ppl on the first half, ppl on the repeat)`` of ``rows`` ``(N, n + 1)`` made into ``s + s``.

    With ``h = ceil((n + 1) / 2)`` tokens per copy, the targets compared are the copy's tokens 1 ..
    ``n - h`` in each half: the same bytes, predicted once from the segment's start and once after
    the whole segment has been seen. (Token 0 of the repeat follows the segment's last token and is
    not copyable, so it is left out; token 0 of the first half has no context.)
    """
    seq = repeat_rows(rows)
    n = rows.shape[1] - 1
    half = (n + 2) // 2
    m = n + 1 - half  # tokens of the second copy that fit
    losses = losses_fn(seq)  # column c predicts sequence position c + 1
    first = losses[:, 0 : m - 1]  # positions 1 .. m-1
    repeat = losses[:, half : half + m - 1]  # positions half+1 .. half+m-1
    return math.exp(first.mean().item()), math.exp(repeat.mean().item())
