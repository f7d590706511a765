"""LongPPL (Fang et al. 2024, "What is Wrong with Perplexity for Long-context Language Modeling?",
arXiv:2410.23771): perplexity on the key tokens alone, the tokens that long context helps predict.

A token is key when the model as trained, reading a window of its trained length N, predicts it much better
with the whole window than with only its last N/4 tokens: its loss drops by more than ``alpha`` = 2 nats
(the long-short difference, LSD) and its loss with the whole window is under ``-beta`` = 2 nats (the
long-context likelihood, LCL, above -2), the paper's thresholds. LongPPL's short context is cut as its
package cuts it: the scored tokens of one chunk share a short context that starts ``trunc`` tokens before
the chunk (so each sees at least ``trunc`` tokens).

``posenc extend`` picks the key tokens once, among the final tokens every length scores alike
(:func:`posenc.real.scoring.window_stats`' ``tail_nll``), from the model as trained at N against its
truncated context (:func:`short_context_ids`), and then scores every method at every length on those same
tokens (:func:`longppl`): a method is judged on the tokens that need long context, not on the many that a
short context predicts as well.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["ALPHA", "BETA", "key_tokens", "longppl", "short_context_ids", "truncation", "window_keys"]

ALPHA = 2.0  # nats: the least drop in loss that long context must give a key token (LSD > alpha)
BETA = -2.0  # nats: the least log-likelihood a key token has with long context (LCL > beta)


def truncation(train_len: int) -> int:
    """The short context's length: a quarter of the trained length (LongPPL's rule: 4K of 16K-32K)."""
    if isinstance(train_len, bool) or not isinstance(train_len, int) or train_len < 4:
        raise ValueError(f"train_len must be an integer >= 4, not {train_len!r}")
    return train_len // 4


def short_context_ids(window: Sequence[int], scored: int, trunc: int) -> list[int]:
    """The tokens a truncated forward reads to score the last ``scored`` tokens of ``window`` with a short
    context: the ``trunc`` tokens before them and them (LongPPL's chunk of ``scored`` tokens); the last
    ``scored`` losses of that forward are the short-context losses."""
    if scored < 1 or trunc < 1 or trunc + scored > len(window):
        raise ValueError(
            f"a window of {len(window)} tokens cannot score its last {scored} with {trunc} tokens before them"
        )
    return list(window[len(window) - trunc - scored :])


def key_tokens(
    full: Sequence[float], short: Sequence[float], alpha: float = ALPHA, beta: float = BETA
) -> list[int]:
    """The indices i where the long context's loss ``full[i]`` is under -``beta`` and at least ``alpha``
    below the short context's ``short[i]`` (both in nats, of the same tokens)."""
    if len(full) != len(short):
        raise ValueError(f"full and short must score the same tokens: {len(full)} and {len(short)} losses")
    return [i for i, (f, s) in enumerate(zip(full, short, strict=True)) if s - f > alpha and f < -beta]


def longppl(losses: Sequence[float], keys: Sequence[int]) -> float | None:
    """exp(the mean of ``losses`` at ``keys``): the perplexity of the key tokens; None without any."""
    if not keys:
        return None
    return math.exp(math.fsum(losses[i] for i in keys) / len(keys))


def window_keys(windows: Sequence[dict | None], shorts: Sequence[dict | None]) -> list[list[int]] | None:
    """Each window's key tokens among its scored tail, from the model as trained: its window results
    (``tail_nll``) and its truncated forwards' (``short_nll``), in the windows' order; None until all of them
    are measured (or results saved before ``tail_nll`` was)."""
    if not windows or len(windows) != len(shorts):
        return None
    if any(w is None or "tail_nll" not in w for w in windows) or any(s is None for s in shorts):
        return None
    return [key_tokens(w["tail_nll"], s["short_nll"]) for w, s in zip(windows, shorts, strict=True)]
