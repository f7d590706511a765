"""Train-short-test-long evaluation: perplexity at several lengths under three protocols, the probes of
:mod:`posenc.lab.probes`, eval-time extensions, passkey retrieval.

Protocols (docs/lab.md says which published table used which):

- ``windows`` (Press et al. 2021, "Train Short, Test Long", section 4): the validation tokens are cut
  into *non-overlapping* windows of the evaluation length T, the model reads each window from
  position 0, and perplexity is exp(mean next-byte cross-entropy) over every token of every window.
  Every T covers the same first ``max_tokens`` validation tokens. Most tokens sit early in their
  window, so this mixes short and long contexts; positions past the training length L weigh 1 - L/T.
- ``past``: the windows protocol restricted to positions at or past L, where only extrapolation helps.
- ``sliding`` (Press et al. 2021, appendix, "sliding window evaluation"; DAPE's "last tokens" figures):
  windows of length T advance by stride L and only their last L tokens are scored, so every scored
  token has between T - L + 1 and T tokens of context. Every T scores the same tokens. It costs T / L
  times the windows protocol per scored token, hence its own, smaller token count.

RoPE eval-time extensions use factor = T / L_train (no extension at T <= L_train, where every method
reduces to plain RoPE): position interpolation (Chen et al. 2023, arxiv.org/abs/2306.15595), NTK-aware
base scaling (bloc97 2023), dynamic NTK (emozilla 2023) and YaRN (Peng et al. 2023, arxiv.org/abs/2309.00071).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

import posenc
from posenc.lab import defaults as D
from posenc.lab.checks import check_lengths
from posenc.lab.data import sliding_windows, windows
from posenc.lab.encodings import EXTENSIONS, eval_extension, model_extensions
from posenc.lab.measures import BY_LENGTH, MEASURE_NAMES
from posenc.lab.model import GPT
from posenc.lab.passkey import (
    answered,
    passkey_accuracy,
    passkey_batch,
    passkey_hits,
    passkey_share,
)
from posenc.lab.probes import context_reach, copy_probe, far_context_gain, probe_windows
from posenc.lab.recall import recall_batch, recall_scores

__all__ = [
    "EXTENSIONS",
    "METRICS",
    "Row",
    "evaluate",
    "answered",
    "passkey_accuracy",
    "passkey_batch",
    "passkey_hits",
    "perplexities",
    "position_losses",
]


@torch.no_grad()
def position_losses(model: GPT, data: torch.Tensor, *, tokens_per_batch: int = 16384) -> torch.Tensor:
    """Next-byte cross-entropy (nats) for windows ``data`` (N, T+1): returns (N, T) float64 on CPU."""
    n, t1 = data.shape
    t = t1 - 1
    device = next(model.parameters()).device
    rows = max(1, tokens_per_batch // t)
    out = []
    for i in range(0, n, rows):
        chunk = data[i : i + rows].to(device)
        logits = model(chunk[:, :-1]).float()
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="none"
        )
        out.append(loss.view(chunk.shape[0], t).double().cpu())
    return torch.cat(out)


# Row fields holding a value per length, in the order results.json lists them.
METRICS = MEASURE_NAMES


@dataclass
class Row:
    """One line of the results table: a scheme's measures at each length (None: not measurable).

    ``ppl``: the windows protocol; ``ppl_past``: its positions at or past the training length;
    ``ppl_sliding``: the sliding protocol (:mod:`posenc.lab.evaluate`'s docstring); ``gain``: far-context
    gain; ``copy_first`` / ``copy_repeat``: the copy probe (:mod:`posenc.lab.probes`); ``recall``,
    ``recall_ppl``, ``recall_gain``: the recall probe (:mod:`posenc.lab.recall`); ``passkey``: the
    share of passkey prompts answered exactly (None where the length is too short for the prompt). A
    protocol that was not run leaves its dict empty.
    """

    scheme: str
    ppl: dict[int, float | None] = field(default_factory=dict)
    ppl_past: dict[int, float | None] = field(default_factory=dict)
    ppl_sliding: dict[int, float | None] = field(default_factory=dict)
    gain: dict[int, float | None] = field(default_factory=dict)
    reach: dict[int, float | None] = field(default_factory=dict)
    copy_first: dict[int, float | None] = field(default_factory=dict)
    copy_repeat: dict[int, float | None] = field(default_factory=dict)
    recall: dict[int, float | None] = field(default_factory=dict)
    recall_ppl: dict[int, float | None] = field(default_factory=dict)
    recall_gain: dict[int, float | None] = field(default_factory=dict)
    passkey: dict[int, float | None] = field(default_factory=dict)
    note: str | None = None

    def to_dict(self) -> dict:
        """The row as JSON: ``{"scheme", <each of METRICS>, "note"}`` with lengths as string keys."""
        out: dict = {"scheme": self.scheme}
        for name in METRICS:
            out[name] = {str(k): v for k, v in getattr(self, name).items()}
        out["note"] = self.note
        return out


def perplexities(
    model: GPT,
    val: np.ndarray,
    eval_lens: list[int],
    *,
    train_len: int,
    max_tokens: int = D.EVAL_TOKENS,
    extension: str | None = None,
    progress=None,
    protocols: tuple[str, ...] = ("windows", "past"),
    sliding_tokens: int = D.SLIDING_TOKENS,
    probe_windows: int = 0,
    probe_last: int = D.PROBE_LAST,
    passkey_trials: int = 0,
) -> Row:
    """Perplexity of ``model`` at each length in ``eval_lens`` under each protocol, and the probes.

    By default only what costs nothing beyond the windows protocol is measured (its losses, and the past
    protocol from the same losses); the sliding protocol, the probes and passkey each cost a run of their
    own and are measured when asked. What the commands ask by default is
    :class:`~posenc.lab.eval_config.EvalConfig`'s (every protocol, the probes, passkey).

    Args:
        val: validation tokens (1-D uint8).
        train_len: the length the model was trained at (positions >= it are "past"; the sliding stride).
        extension: an eval-time extension name from :data:`EXTENSIONS`, or None.
        progress: optional callable(str) told about each length as it starts.
        protocols: which of "windows", "past", "sliding" to measure. The windows protocol's losses are
            always computed (past and the gain probe reuse them), so "ppl" is always filled.
        sliding_tokens: tokens the sliding protocol scores per length (the same tokens at every length:
            those after the first ``max(eval_lens)``).
        probe_windows: windows per length for the far-context gain and copy probes; 0 skips them.
        probe_last: how many last tokens of each window the gain probe scores.
        passkey_trials: passkey prompts per length (:func:`posenc.lab.passkey.passkey_share`); 0 skips them.
    """
    eval_lens = check_lengths("eval_lens", eval_lens)
    row = Row(scheme=model.cfg.encoding + (f"+{extension}" if extension else ""))
    run = functools.partial(position_losses, model)
    for length in eval_lens:
        with eval_extension(model, extension, length / train_len, train_len):
            if progress is not None:
                progress(f"{row.scheme} @ {length}")
            try:
                losses = run(windows(val, length, max_tokens))
                _protocols(
                    row, run, losses, val, length, train_len, protocols, sliding_tokens, max(eval_lens)
                )
                if probe_windows:
                    _probes(row, run, losses, val, length, train_len, probe_windows, probe_last)
                    _recall(row, model, val, length, train_len, probe_windows)
                if passkey_trials:
                    row.passkey[length] = passkey_share(model, val, length, passkey_trials)
            except posenc.PositionError as e:
                for name in BY_LENGTH:
                    getattr(row, name).setdefault(length, None)
                if row.note is None:  # the first failing length names the first missing position
                    row.note = f"n/a past {train_len} tokens: {e}"
    for name in BY_LENGTH:  # the dicts in length order, whatever order they were filled in
        setattr(row, name, {n: getattr(row, name)[n] for n in eval_lens if n in getattr(row, name)})
    return row


def _protocols(row: Row, run, losses, val, length, train_len, protocols, sliding_tokens, longest) -> None:
    """Fill ``row``'s protocols at ``length`` from the windows protocol's ``losses`` (N, length)."""
    row.ppl[length] = math.exp(losses.mean().item())
    if "past" in protocols:
        row.ppl_past[length] = math.exp(losses[:, train_len:].mean().item()) if length > train_len else None
    if "sliding" in protocols:
        sliding = run(sliding_windows(val, length, train_len, sliding_tokens, start=longest))
        row.ppl_sliding[length] = math.exp(sliding[:, -train_len:].mean().item())


def _probes(row: Row, run, losses, val, length, train_len, n_windows, last) -> None:
    """Fill ``row``'s probes at ``length`` from ``n_windows`` windows.

    The gain probe's full-context run is the windows protocol's (``losses``, the same first windows), so
    it costs only the short run; where that protocol has fewer windows (long lengths), it uses those.
    The copy probe runs at lengths up to twice the training length only: within L is what it asks
    (can the model copy at all?), and at long lengths it would cost more than the windows protocol.
    """
    rows = probe_windows(val, length, min(n_windows, losses.shape[0]))
    row.gain[length] = far_context_gain(run, rows, train_len, last=last, full_losses=losses)
    if length == train_len:
        row.reach = context_reach(run, rows, train_len, last=last, full_losses=losses)
    if length <= D.COPY_PROBE_MAX_MULT * train_len:
        row.copy_first[length], row.copy_repeat[length] = copy_probe(
            run, probe_windows(val, length, n_windows)
        )


def _recall(row: Row, model: GPT, val, length: int, train_len: int, n_windows: int) -> None:
    """Fill ``row``'s recall probe at ``length`` (:func:`posenc.lab.recall.recall_scores`), up to
    :data:`~posenc.lab.defaults.RECALL_PROBE_MAX_MULT` training lengths; None where the window cannot hold
    the pairs and their queries."""
    if length > D.RECALL_PROBE_MAX_MULT * train_len:
        return
    probe = recall_batch(val, length, n_windows, train_len)
    scores = (None, None, None) if probe is None else recall_scores(model, *probe, train_len)
    row.recall[length], row.recall_ppl[length], row.recall_gain[length] = scores


def evaluate(
    model: GPT,
    val: np.ndarray,
    eval_lens: list[int],
    *,
    train_len: int,
    max_tokens: int = D.EVAL_TOKENS,
    extensions: tuple[str, ...] = tuple(EXTENSIONS),
    progress=None,
    **measures,
) -> list[Row]:
    """The model's own row, plus one row per eval-time extension that applies to its scheme.

    ``measures``: :func:`perplexities`' protocols, sliding_tokens, probe_windows, probe_last,
    passkey_trials.
    """
    methods = [None, *model_extensions(model.cfg, extensions)]
    return [
        perplexities(
            model,
            val,
            eval_lens,
            train_len=train_len,
            max_tokens=max_tokens,
            extension=ext,
            progress=progress,
            **measures,
        )
        for ext in methods
    ]
