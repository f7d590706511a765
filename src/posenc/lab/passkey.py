"""Passkey retrieval prompts, for evaluation and as a training mix.

A passkey prompt hides a short key of digits at some depth of filler text and asks for it at the end;
the answer is the key's next bytes (Mohtashami & Jaggi 2023, "Landmark Attention",
arxiv.org/abs/2305.16300). Retrieving the key is copying from far back, which a small model trained
only on text never learns (docs/lab.md: the copy probe). :func:`passkey_rows` turns training windows
into passkey prompts, so that a share of the batches teaches retrieval inside the training length
(``--passkey-fraction``); accuracy past it then measures whether retrieval extrapolates.

Asking a model: :func:`passkey_batch` builds prompts with their answers, :func:`answered` decides in one
teacher-forced pass which are answered exactly, :func:`passkey_hits` counts them per length (with an
eval-time extension), and :class:`PasskeyResult` is one length's count with its Wilson interval.

Everything here is bytes as ints (the laboratory's tokenizer is UTF-8 bytes, :mod:`posenc.lab.tokenizer`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

import posenc
from posenc.lab import defaults as D
from posenc.lab.checks import check_choice, check_int, check_lengths
from posenc.lab.encodings import eval_extension
from posenc.lab.errors import LabError
from posenc.lab.stats import wilson_interval
from posenc.lab.tokenizer import encode

__all__ = [
    "PASSKEY_FILLERS",
    "PASSKEY_STYLES",
    "REPEAT_FILLER",
    "TRAIN_KEY_DIGITS",
    "PasskeyResult",
    "answered",
    "check_passkey_lengths",
    "passkey_accuracy",
    "passkey_batch",
    "passkey_hits",
    "passkey_min_length",
    "passkey_prompt",
    "passkey_report",
    "passkey_rows",
    "passkey_share",
]

# Mohtashami & Jaggi's filler, repeated as often as the prompt needs.
REPEAT_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "

# Prompt styles: (needle with the key, the question whose continuation is the key).
# "sentences": Mohtashami & Jaggi 2023, 87 bytes of needle and question around the key, more than the
# quick preset's whole training length.
# "code": the same retrieval as a Python assignment and a later use of the name (34 bytes), so that a
# model trained at 64 bytes on code can be asked inside its training length, with the corpus as filler.
PASSKEY_STYLES: dict[str, tuple[str, str]] = {
    "sentences": (
        "The pass key is {key}. Remember it. {key} is the pass key. ",
        "What is the pass key? The pass key is ",
    ),
    "code": ('\nPASSKEY = "{key}"\n', '\nassert PASSKEY == "'),
}
PASSKEY_FILLERS = ("repeat", "corpus")

# Key lengths (digits, inclusive) of the training mix: varied, so that a model learns to copy the key
# rather than a fixed number of bytes after the needle.
TRAIN_KEY_DIGITS = (1, 5)


def passkey_min_length(digits: int = D.PASSKEY_DIGITS, style: str = D.PASSKEY_STYLE) -> int:
    """The shortest passkey length (bytes): the needle, the question and the ``digits`` answer bytes."""
    needle, question = PASSKEY_STYLES[check_choice("passkey style", style, PASSKEY_STYLES)]
    return len(needle.format(key="0" * digits)) + len(question) + digits


def check_passkey_lengths(lengths, digits: int = D.PASSKEY_DIGITS, style: str = D.PASSKEY_STYLE) -> list[int]:
    """``lengths`` sorted, when each is a positive integer that fits a passkey prompt; else a LabError."""
    check_int("passkey digits", digits)
    lengths = check_lengths("passkey lengths", lengths)
    least = passkey_min_length(digits, style)
    short = [n for n in lengths if n < least]
    if short:
        raise LabError(
            f"passkey lengths {short} are too short: with a {digits}-digit key the {style!r} prompt and the "
            f"answer need at least {least} bytes"
        )
    return lengths


def passkey_prompt(
    length: int, key: str, depth: float, *, style: str = "sentences", filler: Sequence[int] | None = None
) -> tuple[list[int], str]:
    """A prompt of exactly ``length`` bytes hiding ``key`` at relative ``depth`` (0 start, 1 end) of filler.

    Filler, the needle (``PASSKEY_STYLES[style]``, holding the key) somewhere inside, and the question at
    the end; the answer is the next ``len(key)`` bytes. ``filler``: the filler's token ids (at least as
    many as there is room for), e.g. a stretch of the validation text; default, repeated sentences.
    """
    needle_text, question_text = PASSKEY_STYLES[check_choice("passkey style", style, PASSKEY_STYLES)]
    needle, question = encode(needle_text.format(key=key)), encode(question_text)
    room = length - len(needle) - len(question)
    if room < 0:
        raise LabError(
            f"passkey length {length} is too short; it needs at least {len(needle) + len(question)} bytes"
        )
    if filler is None:
        fill = encode((REPEAT_FILLER * (room // len(REPEAT_FILLER) + 1))[:room])
    else:
        fill = [int(t) for t in filler[:room]]
        if len(fill) < room:
            raise LabError(f"passkey filler has {len(fill)} tokens; the prompt needs {room}")
    cut = int(round(depth * room))
    return fill[:cut] + needle + fill[cut:] + question, key


def passkey_rows(
    rows: torch.Tensor, gen: torch.Generator, *, style: str = "code"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training windows ``(n, T)`` int64 made into passkey prompts with their answers, ``(n, T)``, and
    where the answers are, ``(n, T)`` bool: the key's bytes after the question.

    Each row keeps its own bytes, in order, as filler (so the text around the needle is the corpus's) and
    becomes ``filler[:cut] + needle + filler[cut:room] + question + key + filler[room:]``, exactly T bytes:
    a key of :data:`TRAIN_KEY_DIGITS` digits (fewer when T is short), the prompt and key ending at a
    uniform position from the shortest prompt's end to T, and the needle at a uniform depth of the filler
    before the question, all drawn from ``gen``. The question's place varies so that a model with
    absolute positions does not learn to answer at the window's end only. The loss on the key's bytes
    after the question is what teaches retrieval; the key inside the needle is random and teaches nothing.
    """
    n, t = rows.shape
    low, high = TRAIN_KEY_DIGITS
    room = [d for d in range(low, high + 1) if passkey_min_length(d, style) <= t]
    if not room:
        raise LabError(
            f"the passkey training mix needs windows of at least {passkey_min_length(low, style)} bytes "
            f"(a {low}-digit key in the {style!r} prompt, with its answer); these have {t} (the training "
            f"length + 1)"
        )
    out, answers = rows.clone(), torch.zeros(rows.shape, dtype=torch.bool)
    if n == 0:
        return out, answers
    digits = torch.randint(room[0], room[-1] + 1, (n,), generator=gen).tolist()
    depths = torch.rand(n, generator=gen, dtype=torch.float64).tolist()
    values = torch.randint(0, 10, (n, high), generator=gen).tolist()
    ends = torch.rand(n, generator=gen, dtype=torch.float64).tolist()
    for i in range(n):
        key = "".join(str(v) for v in values[i][: digits[i]])
        shortest = passkey_min_length(digits[i], style)
        end = shortest + int(ends[i] * (t - shortest + 1))  # where the key ends: shortest .. t
        filler = rows[i].tolist()
        ids, _ = passkey_prompt(end - digits[i], key, depths[i], style=style, filler=filler)
        used = end - shortest  # filler bytes the prompt took: all but needle, question and key
        out[i] = torch.tensor(ids + encode(key) + filler[used : used + t - end], dtype=out.dtype)
        answers[i, end - digits[i] : end] = True
    return out, answers


# ---------------------------------------------------------------------------------------------- evaluation


def passkey_batch(
    length: int,
    trials: int,
    *,
    digits: int,
    seed: int = 0,
    style: str = "code",
    filler: np.ndarray | None = None,
) -> tuple[torch.Tensor, int]:
    """``trials`` passkey prompts of ``length`` bytes *with their answers*: ``(trials, length)`` int64 and
    the number of answer bytes at the end (``digits``).

    The keys, depths and (with ``filler``, a token array such as the validation split) the filler's
    offsets are drawn from ``(seed, length)``, so a length's prompts do not depend on which other
    lengths are asked.
    """
    rng = random.Random(f"passkey-{seed}-{length}")
    if filler is not None and len(filler) < length:
        raise LabError(f"passkey filler has {len(filler)} tokens; length {length} needs more")
    rows = []
    for _ in range(trials):
        key = "".join(rng.choice("0123456789") for _ in range(digits))
        depth = rng.random()
        fill = None
        if filler is not None:
            start = rng.randrange(len(filler) - length + 1)
            fill = filler[start : start + length]
        ids, key = passkey_prompt(length - digits, key, depth, style=style, filler=fill)
        rows.append(ids + encode(key))
    return torch.tensor(rows, dtype=torch.int64), digits


@torch.no_grad()
def answered(model, rows: torch.Tensor, answer: int, *, tokens_per_batch: int = 65536) -> torch.Tensor:
    """Which prompts-with-answers ``rows`` ``(N, T)`` the model answers exactly: ``(N,)`` bool.

    Greedy decoding reproduces the last ``answer`` bytes exactly if and only if each of them is the
    argmax given the bytes before it, so one teacher-forced forward pass decides it (for a causal
    model; randomized positions are drawn once for the whole length T).
    """
    device = next(model.parameters()).device
    n, t = rows.shape
    per_batch = max(1, tokens_per_batch // t)
    out = []
    for i in range(0, n, per_batch):
        chunk = rows[i : i + per_batch].to(device)
        guess = model(chunk[:, :-1])[:, -answer:].argmax(-1)
        out.append((guess == chunk[:, -answer:]).all(dim=1).cpu())
    return torch.cat(out)


def passkey_hits(
    model,
    lengths: list[int],
    *,
    trials: int = D.EVAL_COMMAND_PASSKEY_TRIALS,
    digits: int = D.PASSKEY_DIGITS,
    seed: int = 0,
    extension: str | None = None,
    style: str = D.PASSKEY_STYLE,
    filler: np.ndarray | None = None,
) -> dict[int, int | None]:
    """How many of ``trials`` prompts at each length the model answers with exactly the hidden key
    (greedy decoding, :func:`answered`); None where the model cannot be run (a learned table past its
    length).

    The prompt and the ``digits`` answer bytes together fill the length (:func:`passkey_batch`). With
    ``extension`` the factor is length / the model's training length.
    """
    lengths = check_passkey_lengths(lengths, digits, style)
    train_len = model.cfg.max_len
    result: dict[int, int | None] = {}
    for length in lengths:
        rows, answer = passkey_batch(length, trials, digits=digits, seed=seed, style=style, filler=filler)
        with eval_extension(model, extension, length / train_len, train_len):
            try:
                result[length] = int(answered(model, rows, answer).sum())
            except posenc.PositionError:
                result[length] = None
    return result


def passkey_accuracy(
    model, lengths: list[int], *, trials: int = D.EVAL_COMMAND_PASSKEY_TRIALS, **kw
) -> dict[int, float | None]:
    """Share of prompts at each length answered with exactly the hidden key (None: n/a); ``kw`` as
    :func:`passkey_hits`."""
    hits = passkey_hits(model, lengths, trials=trials, **kw)
    return {n: None if h is None else h / trials for n, h in hits.items()}


def passkey_share(model, val: np.ndarray, length: int, trials: int) -> float | None:
    """The share of ``trials`` passkey prompts of ``length`` answered exactly, as a comparison asks them
    (:data:`~posenc.lab.defaults.PASSKEY_DIGITS` digits, the :data:`~posenc.lab.defaults.PASSKEY_STYLE`
    prompt, filler from ``val``, the same prompts for every model); None when ``length`` is too short."""
    if length < passkey_min_length(D.PASSKEY_DIGITS, D.PASSKEY_STYLE):
        return None
    rows, answer = passkey_batch(length, trials, digits=D.PASSKEY_DIGITS, style=D.PASSKEY_STYLE, filler=val)
    return answered(model, rows, answer).double().mean().item()


@dataclass(frozen=True)
class PasskeyResult:
    """The passkey prompts of one length: ``hits`` of ``trials`` answered exactly (None: the model cannot
    be run at ``length``, a learned table past its size)."""

    length: int
    hits: int | None
    trials: int

    @property
    def accuracy(self) -> float | None:
        return None if self.hits is None else self.hits / self.trials

    @property
    def ci95(self) -> tuple[float, float] | None:
        """The 95% Wilson interval of the accuracy (:func:`posenc.lab.stats.wilson_interval`)."""
        return None if self.hits is None else wilson_interval(self.hits, self.trials)

    def to_json(self) -> dict | None:
        if self.hits is None:
            return None
        return {"accuracy": self.accuracy, "hits": self.hits, "trials": self.trials, "ci95": list(self.ci95)}

    def cell(self) -> str:
        if self.hits is None:
            return f"@{self.length}: n/a"
        low, high = self.ci95
        return f"@{self.length}: {self.accuracy:.2f} [{low:.2f}, {high:.2f}]"


def passkey_report(
    model, lengths, methods, *, trials: int, filler, **prompt
) -> dict[str, list[PasskeyResult]]:
    """:class:`PasskeyResult` per length for the model as trained (``"plain"``) and with each extension of
    ``methods`` (None: plain); ``prompt``: :func:`passkey_hits`' digits, seed and style."""
    out = {}
    for ext in methods:
        hits = passkey_hits(model, lengths, trials=trials, extension=ext, filler=filler, **prompt)
        out[ext or "plain"] = [PasskeyResult(n, h, trials) for n, h in hits.items()]
    return out
