"""Associative recall, for training (a share of the training mix, :mod:`posenc.lab.mix`) and as a probe.

Key-value pairs ``$ab=Q7K2`` stand early in a window of corpus text and the same keys are asked late
(``$ab=`` again); the answer is the value's bytes. This is the multi-query associative recall of Zoology
(Arora et al. 2023, arxiv.org/abs/2312.04927), in bytes and inside real text as RULER's multi-key needles
are (Hsieh et al. 2024, arxiv.org/abs/2404.06654). The values are random, the filler holds no ``$``
(each is made a space), and a value is drawn again when it occurs anywhere else in the window, so the
value bytes after a query are predictable from its pair and from nothing else.

Training rows (:func:`recall_rows`) put the pairs in the first half of the window and the queries in the
second, so that distances spread over the whole training length L. The probe (:func:`recall_batch`,
:func:`recall_scores`) puts them in the first quarter of a window of n bytes and the queries in its last
``max(L/4, the queries' bytes)``: at n >= 2L every distance lies in ``(n/2, n]`` and past L, so the
probe's lengths are its distance buckets, and the last L bytes as context hold every query but no pair
(the far-context gain on exactly the answer bytes).

Shapes: rows ``(N, T)`` int64 byte ids; answer starts ``(N, K)`` int64, the position in the row of each
query's first value byte (K = :func:`recall_pairs`); answers ``(N, T)`` bool, the value bytes after the
queries (what ``--answer-weight`` weighs in training).
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
import torch.nn.functional as F

from posenc.lab.errors import LabError
from posenc.lab.tokenizer import encode

__all__ = [
    "RECALL_ITEM",
    "RECALL_MARK",
    "recall_batch",
    "recall_layout",
    "recall_min_length",
    "recall_pairs",
    "recall_rows",
    "recall_scores",
]

RECALL_MARK = ord("$")  # opens a pair and a query; never in the filler
KEY_LETTERS = "abcdefghijklmnopqrstuvwxyz"
VALUE_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
KEY_LEN, VALUE_LEN = 2, 4
RECALL_ITEM = 1 + KEY_LEN + 1 + VALUE_LEN  # "$ab=Q7K2": a pair, and a query with its answer
MAX_PAIRS = 8
# A value that occurs elsewhere in its window is drawn again, at most this many times (a chance of about
# 1e-4 per value in code text); text that defeats it keeps the last draw, whose answer is still its pair's.
_REDRAWS = 16


def recall_pairs(length: int) -> int:
    """Pairs in a window of ``length`` bytes: one per 32 bytes, 1 to :data:`MAX_PAIRS`."""
    return max(1, min(MAX_PAIRS, length // 32))


def recall_min_length() -> int:
    """The shortest window (bytes, targets included) that holds one pair and its query."""
    return 2 * RECALL_ITEM


def _item(key: int, value: str) -> list[int]:
    return [RECALL_MARK, *encode(KEY_LETTERS[key // 26] + KEY_LETTERS[key % 26] + "="), *encode(value)]


def recall_layout(
    filler: list[int], keys: list[int], values: list[str], pair_at: list[int], query_at: list[int]
) -> tuple[list[int], list[int]]:
    """``filler`` with pair i inserted before filler offset ``pair_at[i]`` and a query of key i (with its
    answer) before ``query_at[i]``; returns the ids and each query's answer start, in key order.

    Keys are indices into the 676 two-letter names. Every query offset must be >= every pair offset.
    """
    events = sorted([(p, 0, i) for i, p in enumerate(pair_at)] + [(q, 1, i) for i, q in enumerate(query_at)])
    ids, cursor, answers = [], 0, [0] * len(keys)
    for at, is_query, i in events:
        ids += filler[cursor:at]
        cursor = at
        if is_query:
            answers[i] = len(ids) + RECALL_ITEM - VALUE_LEN
        ids += _item(keys[i], values[i])
    return ids + filler[cursor:], answers


def _clean(filler) -> list[int]:
    """Filler bytes with every ``$`` made a space, so that only pairs and queries open with one."""
    return [32 if b == RECALL_MARK else int(b) for b in filler]


def _unique(ids: list[int], values: list[str]) -> bool:
    """Whether each value occurs exactly twice in ``ids``: in its pair and as its answer."""
    text = bytes(ids)
    return all(text.count(v.encode()) == 2 for v in values)


def _draw(draw_values, filler, keys, pair_at, query_at) -> tuple[list[int], list[int]]:
    """The layout with values from ``draw_values()``, drawn again while one occurs elsewhere."""
    for _ in range(_REDRAWS):
        values = draw_values()
        ids, answers = recall_layout(filler, keys, values, pair_at, query_at)
        if len(set(values)) == len(values) and _unique(ids, values):
            break
    return ids, answers


def recall_rows(rows: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Training windows ``(n, T)`` int64 made into recall windows ``(n, T)``: :func:`recall_pairs` (T) pairs
    at uniform offsets of the first half of the filler, their queries in a random order at uniform offsets
    of the second half, the rest the row's own bytes in order (its last ones dropped to make room). Every
    draw is from ``gen``. Also returns the answers ``(n, T)`` bool: each query's value bytes."""
    n, t = rows.shape
    k = recall_pairs(t)
    room = t - 2 * k * RECALL_ITEM
    if room < 0:
        raise LabError(
            f"the recall training mix needs windows of at least {recall_min_length()} bytes (a pair and its "
            f"query); these have {t} (the training length + 1)"
        )
    out, answers = rows.clone(), torch.zeros(rows.shape, dtype=torch.bool)
    for i in range(n):
        keys = torch.randperm(26 * 26, generator=gen)[:k].tolist()
        pair_at = sorted(torch.randint(0, room // 2 + 1, (k,), generator=gen).tolist())
        query_at = torch.randint(room // 2, room + 1, (k,), generator=gen).tolist()

        def values() -> list[str]:
            picks = torch.randint(0, len(VALUE_ALPHABET), (k, VALUE_LEN), generator=gen).tolist()
            return ["".join(VALUE_ALPHABET[c] for c in v) for v in picks]

        ids, starts = _draw(values, _clean(rows[i, :room].tolist()), keys, pair_at, query_at)
        out[i] = torch.tensor(ids, dtype=out.dtype)
        for start in starts:
            answers[i, start : start + VALUE_LEN] = True
    return out, answers


def recall_batch(
    val: np.ndarray, length: int, n_rows: int, train_len: int, *, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``n_rows`` probe windows ``(n_rows, length + 1)`` with their answer starts ``(n_rows, K)``, K =
    :func:`recall_pairs` (train_len + 1) as in training; None when ``length + 1`` cannot hold them.

    Pairs at offsets of the window's first quarter, queries in its last ``max(train_len / 4, K items)``
    bytes, filler from ``val`` at random offsets; drawn from ``(seed, length)`` so that every model of a
    comparison is asked the same windows.
    """
    t, k = length + 1, recall_pairs(train_len + 1)
    room = t - 2 * k * RECALL_ITEM
    if room < 0 or len(val) < t:
        return None
    rng = random.Random(f"recall-{seed}-{length}")
    pair_end = max(0, t // 4 - k * RECALL_ITEM)
    query_from = room - max(0, train_len // 4 - k * RECALL_ITEM)
    rows, starts = [], []
    for _ in range(n_rows):
        at = rng.randrange(len(val) - t + 1)
        keys = rng.sample(range(26 * 26), k)
        pair_at = sorted(rng.randint(0, pair_end) for _ in range(k))
        query_at = [rng.randint(query_from, room) for _ in range(k)]

        def values() -> list[str]:
            return ["".join(rng.choice(VALUE_ALPHABET) for _ in range(VALUE_LEN)) for _ in range(k)]

        ids, answers = _draw(values, _clean(val[at : at + room]), keys, pair_at, query_at)
        rows.append(ids)
        starts.append(answers)
    return torch.tensor(rows, dtype=torch.int64), torch.tensor(starts, dtype=torch.int64)


@torch.no_grad()
def _value_scores(model, rows: torch.Tensor, starts: torch.Tensor, tokens_per_batch: int):
    """Per query, whether greedy decoding gives its value exactly ``(N, K)`` bool, and the loss of each
    value byte ``(N, K, VALUE_LEN)`` float64, from one teacher-forced pass (logit c predicts byte c + 1)."""
    device = next(model.parameters()).device
    n, t = rows.shape
    cols = starts[:, :, None] - 1 + torch.arange(VALUE_LEN)  # (N, K, V): the logits of the value bytes
    hits, losses = [], []
    per_batch = max(1, tokens_per_batch // t)
    for i in range(0, n, per_batch):
        chunk, at = rows[i : i + per_batch].to(device), cols[i : i + per_batch].to(device)
        logits = model(chunk[:, :-1]).float()
        flat = at.flatten(1)  # (B, K * V)
        picked = torch.gather(logits, 1, flat[..., None].expand(-1, -1, logits.shape[-1]))
        truth = torch.gather(chunk, 1, flat + 1)
        loss = F.cross_entropy(picked.transpose(1, 2), truth, reduction="none")
        hits.append((picked.argmax(-1) == truth).view(at.shape).all(-1).cpu())
        losses.append(loss.view(at.shape).double().cpu())
    return torch.cat(hits), torch.cat(losses)


def recall_scores(
    model, rows: torch.Tensor, starts: torch.Tensor, train_len: int, *, tokens_per_batch: int = 65536
) -> tuple[float, float, float | None]:
    """``(accuracy, ppl, gain)`` of the probe windows ``rows`` with answer ``starts``: the share of queries
    answered exactly (greedy), the perplexity of the value bytes with the whole window as context, and
    ``ppl(last train_len bytes as context) / ppl(whole window)`` on the same bytes (None when the window is
    no longer than ``train_len``)."""
    hits, full = _value_scores(model, rows, starts, tokens_per_batch)
    accuracy, ppl = hits.double().mean().item(), math.exp(full.mean().item())
    t = rows.shape[1]
    if t - 1 <= train_len:
        return accuracy, ppl, None
    cut = t - (train_len + 1)
    _, short = _value_scores(model, rows[:, cut:], starts - cut, tokens_per_batch)
    return accuracy, ppl, math.exp(short.mean().item() - full.mean().item())
