"""Passkey retrieval prompts, for evaluation and as a training mix.

A passkey prompt hides a short key of digits at some depth of filler text and asks for it at the end;
the answer is the key's next bytes (Mohtashami & Jaggi 2023, "Landmark Attention",
arxiv.org/abs/2305.16300). Retrieving the key is copying from far back, which a small model trained
only on text never learns (docs/lab.md: the copy probe). :func:`passkey_rows` turns training windows
into passkey prompts, so that a share of the batches teaches retrieval inside the training length
(``--passkey-fraction``); accuracy past it then measures whether retrieval extrapolates.

Everything here is bytes as ints (the laboratory's tokenizer is UTF-8 bytes, :mod:`posenc.lab.data`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posenc.lab.checks import check_choice, check_int, check_lengths
from posenc.lab.errors import LabError
from posenc.lab.tokenizer import encode

__all__ = [
    "PASSKEY_FILLERS",
    "PASSKEY_STYLES",
    "REPEAT_FILLER",
    "TRAIN_KEY_DIGITS",
    "check_passkey_lengths",
    "passkey_min_length",
    "passkey_prompt",
    "passkey_rows",
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


def passkey_min_length(digits: int = 5, style: str = "sentences") -> int:
    """The shortest passkey length (bytes): the needle, the question and the ``digits`` answer bytes."""
    needle, question = PASSKEY_STYLES[check_choice("passkey style", style, PASSKEY_STYLES)]
    return len(needle.format(key="0" * digits)) + len(question) + digits


def check_passkey_lengths(lengths, digits: int = 5, style: str = "sentences") -> list[int]:
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


def passkey_rows(rows: torch.Tensor, gen: torch.Generator, *, style: str = "code") -> torch.Tensor:
    """Training windows ``(n, T)`` int64 made into passkey prompts with their answers, ``(n, T)``.

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
    out = rows.clone()
    if n == 0:
        return out
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
    return out
