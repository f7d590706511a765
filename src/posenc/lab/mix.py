"""The training mix (``--mix recall=0.2,copy=0.2,passkey=0.05``): stated shares of the training windows made
into tasks whose answer bytes only far context predicts.

Plain text gives a small byte-level model next to nothing that is predictable only from far back (at the
quick preset no model reads farther back than L/2: docs/lab.md, the probes), so a far-context gain above 1
cannot show. Each window becomes, with the probability its share gives, one of:

- ``recall``: associative recall, key-value pairs early and their keys asked late
  (:func:`posenc.lab.recall.recall_rows`; Zoology, Arora et al. 2023, arxiv.org/abs/2312.04927; RULER,
  Hsieh et al. 2024, arxiv.org/abs/2404.06654);
- ``copy``: a span of the window copied to a random later offset (:func:`copy_rows`), the copy probe's
  task (docs/lab.md) at random offsets and lengths rather than a whole half repeated;
- ``passkey``: a passkey prompt with its answer (:func:`posenc.lab.passkey.passkey_rows`; Mohtashami &
  Jaggi 2023, arxiv.org/abs/2305.16300);

and the rest stays text. The draws follow the window starts, from the batch's generator, so a batch
depends on ``(seed, step)`` alone as before. The mix is written as one canonical string (the tasks in the
order above, zero shares left out), which is what the run state and provenance record.
"""

from __future__ import annotations

import functools

import torch

from posenc.lab.checks import check_number
from posenc.lab.errors import LabError
from posenc.lab.passkey import TRAIN_KEY_DIGITS, passkey_min_length, passkey_rows
from posenc.lab.recall import recall_min_length, recall_rows

__all__ = [
    "MIX_TASKS",
    "check_mix_fits",
    "check_training_mix",
    "copy_rows",
    "mix_help",
    "mix_min_length",
    "mix_rows",
    "parse_mix",
]

# The copied span: 8 bytes at least (a copy shorter than a few bytes is barely told from text), a quarter
# of the window at most.
COPY_MIN_SPAN = 8


def copy_rows(rows: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Training windows ``(n, T)`` with a span copied forward: ``(n, T)``, and their answers ``(n, T)`` bool.

    A span of s bytes, s uniform in ``[8, max(8, T // 4)]``, from a uniform source offset a is written over
    the bytes at a uniform later offset b >= a + s (no overlap), so the copy's bytes after its first are
    predictable from b - a bytes back: those are the answers. Every draw is from ``gen``.
    """
    n, t = rows.shape
    if t < 2 * COPY_MIN_SPAN:
        raise LabError(
            f"the copy training mix needs windows of at least {2 * COPY_MIN_SPAN} bytes (a span and its "
            f"copy); these have {t} (the training length + 1)"
        )
    out, answers = rows.clone(), torch.zeros(rows.shape, dtype=torch.bool)
    spans = torch.randint(COPY_MIN_SPAN, max(COPY_MIN_SPAN, t // 4) + 1, (n,), generator=gen).tolist()
    u = torch.rand(n, 2, generator=gen, dtype=torch.float64).tolist()
    for i, s in enumerate(spans):
        a = int(u[i][0] * (t - 2 * s + 1))  # source: 0 .. t - 2s
        b = a + s + int(u[i][1] * (t - a - 2 * s + 1))  # copy: a + s .. t - s
        out[i, b : b + s] = rows[i, a : a + s]
        answers[i, b + 1 : b + s] = True
    return out, answers


# name -> (what each window becomes, the rows' builder, the least training length it fits). A builder takes
# windows (n, T) and a generator and returns the task's windows (n, T) and its answers (n, T) bool: the
# bytes that only far context predicts, which --answer-weight weighs in the loss.
MIX_TASKS = {
    "recall": ("key-value pairs early, their keys asked late", recall_rows, recall_min_length() - 1),
    "copy": ("a span copied to a random later offset", copy_rows, 2 * COPY_MIN_SPAN - 1),
    "passkey": (
        "a passkey prompt with its answer",
        passkey_rows,
        passkey_min_length(TRAIN_KEY_DIGITS[0], "code") - 1,
    ),
}
_EXAMPLE = "recall=0.2,copy=0.2,passkey=0.05"


@functools.lru_cache(maxsize=64)
def parse_mix(spec: str | None) -> dict[str, float]:
    """``{task: share}`` of a mix ``"NAME=SHARE,..."`` (None or "": no mix), zero shares left out, in
    :data:`MIX_TASKS` order; a :class:`LabError` naming ``mix``, the value and what is allowed."""
    if not spec:
        return {}
    shares: dict[str, float] = {}
    for item in (part.strip() for part in spec.split(",")):
        name, sep, share = item.partition("=")
        name = name.strip()
        if not sep:
            raise LabError(f"mix={spec!r}: {item!r} is not NAME=SHARE; e.g. {_EXAMPLE}")
        if name not in MIX_TASKS:
            raise LabError(f"mix={spec!r}: unknown task {name!r}; allowed: {', '.join(MIX_TASKS)}")
        if name in shares:
            raise LabError(f"mix={spec!r}: {name!r} is given more than once; give each task once")
        try:
            value = float(share)
        except ValueError:
            raise LabError(
                f"mix={spec!r}: the share of {name!r} must be a number in [0, 1], got {share!r}"
            ) from None
        shares[name] = check_number(f"mix={spec!r}: the share of {name!r}", value, low=0, high=1)
    total = sum(shares.values())
    if total > 1:
        raise LabError(
            f"mix={spec!r}: the shares add up to {total:g}; they must add up to at most 1 (each window is "
            "one task or text)"
        )
    return {name: shares[name] for name in MIX_TASKS if shares.get(name)}


def check_training_mix(
    mix: str | None, copy_fraction: float = 0.0, passkey_fraction: float = 0.0, answer_weight: float = 1.0
) -> str | None:
    """The canonical form of ``mix`` (None when it holds no share), refused beside ``copy_fraction`` or
    ``passkey_fraction`` (a window cannot be drawn by two mixes); ``answer_weight`` must be positive and
    finite, and other than 1 only where some window has answers to weigh."""
    if mix is not None and not isinstance(mix, str):
        raise LabError(f"mix={mix!r} must be a string NAME=SHARE,..., e.g. {_EXAMPLE}")
    shares = parse_mix(mix)
    if shares and (copy_fraction or passkey_fraction):
        raise LabError(
            f"mix={mix!r} cannot be combined with copy_fraction={copy_fraction} or passkey_fraction="
            f"{passkey_fraction}; give the passkey's share in the mix (passkey=P) and leave those at 0"
        )
    check_number("answer_weight", answer_weight, low=0, low_open=True, finite=True)
    if answer_weight != 1 and not (shares or copy_fraction or passkey_fraction):
        raise LabError(
            f"answer_weight={answer_weight:g} weighs the answer bytes of the training mix, and there is none "
            f"(mix={mix!r}); give a mix (e.g. --mix {_EXAMPLE}) or leave answer_weight at 1"
        )
    return ",".join(f"{name}={share!r}" for name, share in shares.items()) or None


def mix_min_length(mix: str | None) -> int:
    """The least training length (bytes) whose windows fit every task of ``mix`` (1 for no mix)."""
    return max([1] + [MIX_TASKS[name][2] for name in parse_mix(mix)])


def check_mix_fits(mix: str | None, train_len: int) -> None:
    """Refuse a training length whose windows cannot hold every task of ``mix`` with its answer."""
    least = mix_min_length(mix)
    if train_len < least:
        raise LabError(
            f"mix={mix!r} needs train_len >= {least} (each task and its answer in one training window); "
            f"train_len is {train_len}"
        )


def mix_help() -> str:
    """The ``--mix`` flag's help: the form, the tasks, the rule."""
    tasks = "; ".join(f"{name}: {meaning}" for name, (meaning, _, _) in MIX_TASKS.items())
    return (
        "the training mix: shares of training windows made into tasks that only far context answers "
        f"(posenc.lab.mix), e.g. {_EXAMPLE}; tasks: {tasks}; the shares add up to at most 1, not beside "
        "--copy-fraction or --passkey-fraction (default: text only)"
    )


def mix_rows(
    window: torch.Tensor, mix: str | None, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``window`` ``(n, T)`` with each row, with probability its task's share of ``mix``, made into that
    task; each row's task ``(n,)`` int64, its index in :data:`MIX_TASKS` or -1 for text; and the answers
    ``(n, T)`` bool, the bytes of each task that only far context predicts (none in a text row).

    One uniform draw per row picks its task (the shares stacked in :data:`MIX_TASKS` order); then each
    task's builder draws its rows' details, in that order.
    """
    u = torch.rand(window.shape[0], generator=gen, dtype=torch.float64)
    kinds = torch.full((window.shape[0],), -1, dtype=torch.int64)
    shares, low = parse_mix(mix), 0.0
    for j, name in enumerate(MIX_TASKS):
        if name in shares:
            high = low + shares[name]
            kinds[(u >= low) & (u < high)] = j
            low = high
    out, answers = window.clone(), torch.zeros(window.shape, dtype=torch.bool)
    for j, (_, rows_of, _) in enumerate(MIX_TASKS.values()):
        chosen = kinds == j
        if chosen.any():
            out[chosen], answers[chosen] = rows_of(window[chosen], gen)
    return out, kinds, answers
