"""Train-short-test-long evaluation: perplexity at several lengths, RoPE eval-time extensions, passkey.

Protocol (Press et al. 2021, "Train Short, Test Long", section 4): the validation tokens are cut into
*non-overlapping* windows of the evaluation length T, the model reads each window from position 0,
and perplexity is exp(mean next-byte cross-entropy) over every token of every window. Every T
covers the same first ``max_tokens`` validation tokens, so lengths are compared on the same text.
A longer window gives later tokens more context, which lowers perplexity for a scheme that
extrapolates; a scheme that does not extrapolate gets worse instead. ``ppl_past`` is the same
measure restricted to positions at or past the training length, where only extrapolation helps.

RoPE eval-time extensions use factor = T / L_train (no extension at T <= L_train, where every method
reduces to plain RoPE): position interpolation (Chen et al. 2023, arxiv.org/abs/2306.15595), NTK-aware
base scaling (bloc97 2023), dynamic NTK (emozilla 2023) and YaRN (Peng et al. 2023, arxiv.org/abs/2309.00071).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

import posenc
from posenc.lab.config import check_lengths
from posenc.lab.data import decode, encode, windows
from posenc.lab.encodings import EXTENSIONS
from posenc.lab.errors import LabError
from posenc.lab.model import GPT, rope_extension

__all__ = [
    "EXTENSIONS",
    "Row",
    "evaluate",
    "passkey_accuracy",
    "passkey_prompt",
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


@dataclass
class Row:
    """One line of the results table: a scheme's perplexity at each length (None: not measurable)."""

    scheme: str
    ppl: dict[int, float | None] = field(default_factory=dict)
    ppl_past: dict[int, float | None] = field(default_factory=dict)
    note: str | None = None

    def to_dict(self) -> dict:
        """The row as JSON: ``{"scheme", "ppl", "ppl_past", "note"}`` with lengths as string keys."""
        return {
            "scheme": self.scheme,
            "ppl": {str(k): v for k, v in self.ppl.items()},
            "ppl_past": {str(k): v for k, v in self.ppl_past.items()},
            "note": self.note,
        }


def perplexities(
    model: GPT,
    val: np.ndarray,
    eval_lens: list[int],
    *,
    train_len: int,
    max_tokens: int = 32768,
    extension: str | None = None,
    progress=None,
) -> Row:
    """Perplexity of ``model`` at each length in ``eval_lens`` on non-overlapping validation windows.

    Args:
        val: validation tokens (1-D uint8).
        train_len: the length the model was trained at (positions >= it are "past").
        extension: a RoPE eval-time extension name from :data:`EXTENSIONS`, or None.
        progress: optional callable(str) told about each length as it starts.
    """
    eval_lens = check_lengths("eval_lens", eval_lens)
    row = Row(scheme=model.cfg.encoding + (f"+{extension}" if extension else ""))
    for length in eval_lens:
        with rope_extension(model, extension, length / train_len, train_len):
            if progress is not None:
                progress(f"{row.scheme} @ {length}")
            try:
                losses = position_losses(model, windows(val, length, max_tokens))
            except posenc.PositionError as e:
                row.ppl[length] = row.ppl_past[length] = None
                if row.note is None:  # the first failing length names the first missing position
                    row.note = f"n/a past {train_len} tokens: {e}"
                continue
        row.ppl[length] = math.exp(losses.mean().item())
        row.ppl_past[length] = math.exp(losses[:, train_len:].mean().item()) if length > train_len else None
    return row


def evaluate(
    model: GPT,
    val: np.ndarray,
    eval_lens: list[int],
    *,
    train_len: int,
    max_tokens: int = 32768,
    extensions: tuple[str, ...] = tuple(EXTENSIONS),
    progress=None,
) -> list[Row]:
    """The model's own row, plus one row per RoPE extension when the model uses RoPE."""
    methods = [None, *extensions] if model.cfg.encoding == "rope" else [None]
    return [
        perplexities(
            model,
            val,
            eval_lens,
            train_len=train_len,
            max_tokens=max_tokens,
            extension=ext,
            progress=progress,
        )
        for ext in methods
    ]


# ---------------------------------------------------------------------------------------------- passkey

_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


_QUESTION = "What is the pass key? The pass key is "


def _needle(key: str) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key. "


def passkey_min_length(digits: int = 5) -> int:
    """The shortest passkey length (bytes): the needle, the question and the ``digits`` answer bytes."""
    return len(_needle("0" * digits)) + len(_QUESTION) + digits


def check_passkey_lengths(lengths, digits: int = 5) -> list[int]:
    """``lengths`` sorted, when each is a positive integer that fits a passkey prompt; else a LabError."""
    lengths = check_lengths("passkey lengths", lengths)
    short = [n for n in lengths if n < passkey_min_length(digits)]
    if short:
        raise LabError(
            f"passkey lengths {short} are too short: with a {digits}-digit key the prompt and the answer "
            f"need at least {passkey_min_length(digits)} bytes"
        )
    return lengths


def passkey_prompt(length: int, key: str, depth: float) -> tuple[list[int], str]:
    """A prompt of exactly ``length`` bytes hiding ``key`` at relative ``depth`` (0 start, 1 end) of filler.

    Format after Mohtashami & Jaggi 2023 (landmark attention, arxiv.org/abs/2305.16300): filler
    sentences, "The pass key is K. Remember it. K is the pass key." somewhere inside, and the question
    "What is the pass key? The pass key is " at the end; the answer is the next ``len(key)`` bytes.
    """
    needle, question = _needle(key), _QUESTION
    room = length - len(needle) - len(question)
    if room < 0:
        raise LabError(
            f"passkey length {length} is too short; it needs at least {len(needle) + len(question)} bytes"
        )
    filler = (_FILLER * (room // len(_FILLER) + 1))[:room]
    cut = int(round(depth * room))
    text = filler[:cut] + needle + filler[cut:] + question
    return encode(text), key


@torch.no_grad()
def passkey_accuracy(
    model: GPT,
    lengths: list[int],
    *,
    trials: int = 8,
    digits: int = 5,
    seed: int = 0,
    extension: str | None = None,
) -> dict[int, float | None]:
    """Share of prompts at each length whose greedy continuation is exactly the hidden key (None: n/a).

    The prompt and the ``digits`` generated bytes together fill the length; with ``extension`` the
    factor is length / the model's training length.
    """
    lengths = check_passkey_lengths(lengths, digits)
    rng = random.Random(seed)
    device = next(model.parameters()).device
    train_len = model.cfg.max_len
    result: dict[int, float | None] = {}
    for length in lengths:
        with rope_extension(model, extension, length / train_len, train_len):
            hits = 0
            try:
                for _ in range(trials):
                    key = "".join(rng.choice("0123456789") for _ in range(digits))
                    ids, key = passkey_prompt(length - digits, key, rng.random())
                    out = model.generate(torch.tensor([ids], device=device), digits, temperature=0)
                    hits += decode(out[0, len(ids) :].tolist()) == key
                result[length] = hits / trials
            except posenc.PositionError:
                result[length] = None
    return result
