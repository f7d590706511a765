"""Questions that share one long prefix: the prefix is run once, each question continues from its cache.

A trial's haystack is long (thousands of tokens) and its questions short (tens). :class:`Continuation`
runs the prefix once with a ``DynamicCache``, keeps a snapshot of the cache's layers, and for each question
feeds the question's tokens and decodes greedily from there, restoring the snapshot before the next one.
Every question therefore sees exactly the cache a fresh forward of ``prefix + question`` would build (the
tests check it token for token against ``model.generate`` on the whole prompt), at the cost of one long
forward per trial instead of one per question.

:meth:`Continuation.answers` answers many questions of one prefix as the rows of batches whose attention reads
the prefix once per step for all of them (:mod:`posenc.hf.shared_prefix`), where the model's attention
allows it, else one at a time.

The snapshot holds references, not copies. A full-attention layer keeps its keys and values in a buffer
reserved past the prefix (:func:`posenc.hf.cache.reserved_layer_class`): a question writes its tokens after
the prefix and the layer hands attention a view of the filled part, so restoring the snapshot is putting back
the view of the prefix, and the bytes after it are simply written again by the next question.
``DynamicCache``'s own layer would concatenate the whole cache into a new tensor at every decoded token, a
copy as large as the prefix per step (at 8K tokens SmolLM2's keys and values are 0.4 GB). A sliding-window
layer keeps transformers' layer, which grows by concatenation into new tensors and never writes into those it
had, so its trimmed tail is restored the same way. A cache whose layers write in place over the prefix (a
static cache) is refused.
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from posenc.hf.cache import reserved_layer_class
from posenc.hf.shared_prefix import Prefix, Rows, can_share, length_dependent_positions, shared_prefix

__all__ = ["Answer", "Continuation", "Request", "gold_logprob"]

# room left after the prefix for a question and its answer when the caller does not say; a longer one grows
# the buffer once (a new buffer: the prefix's view in the snapshot stays valid)
DEFAULT_RESERVE = 256
# questions decoded together at most: the scores of a step grow with the rows, the prefix is read once; a
# trial of the cpu budget (20 questions) is one batch
DEFAULT_ROWS = 32


@dataclass(frozen=True)
class Answer:
    """What the model wrote after one question: ``tokens`` (greedy, up to the question's budget or an
    end-of-sequence token, which is not included), their ``text``, and the ``seconds`` the question took
    (its continuation and decoding, not the shared prefix)."""

    tokens: tuple[int, ...]
    text: str
    seconds: float


@dataclass(frozen=True)
class Request:
    """One question for :meth:`Continuation.answers`: its token ``ids``, the most tokens its answer may take,
    and ``done(text)``, true once the answer written so far is final (None: decode to the budget or an
    end-of-sequence token)."""

    ids: tuple[int, ...]
    max_new_tokens: int
    done: Callable[[str], bool] | None = None


class Continuation:
    """Runs prefixes and the questions that continue them on ``model`` (a transformers causal LM in eval
    mode), decoding with ``tokenizer``."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.stop = _stop_tokens(model, tokenizer)
        # transformers 5 renames past_key_values to cache (the old name warns on every call, then goes)
        takes = inspect.signature(type(model).forward).parameters
        self._cache_kw = "cache" if "cache" in takes else "past_key_values"

    @property
    def batches(self) -> bool:
        """Whether :meth:`answers` runs questions of equal length as one batch on this model (else one at a
        time: :func:`~posenc.hf.shared_prefix.can_share` says why not); a batch keeps its own tokens apart,
        so its prefix needs no reserve."""
        return can_share(self.model) is None

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _cache(self, capacity: int):
        """An empty cache whose full-attention layers reserve ``capacity`` tokens."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        cache = DynamicCache(config=self.model.config)
        cache.layers = [
            reserved_layer_class()(capacity) if type(layer) is DynamicLayer else layer
            for layer in cache.layers
        ]
        return cache

    def _feed(self, cache, ids) -> torch.Tensor:
        """Run ``ids`` after what ``cache`` holds; the logits of the last position."""
        step = torch.as_tensor(list(ids), device=self._device())[None]
        return self.model(input_ids=step, use_cache=True, logits_to_keep=1, **{self._cache_kw: cache}).logits

    @torch.inference_mode()
    def prefill(self, prefix, reserve: int = DEFAULT_RESERVE) -> tuple[object, list[dict]]:
        """Run ``prefix`` (token ids) once: its cache and the snapshot its questions restore. ``reserve``:
        the tokens a question and its answer may add before a full-attention layer's buffer grows."""
        if len(prefix) == 0:
            raise ValueError("prefix is empty: a trial needs at least one token before its questions")
        if reserve < 0:
            raise ValueError(f"reserve must be >= 0 tokens, got {reserve}")
        cache = self._cache(len(prefix) + reserve)
        self._feed(cache, prefix)
        return cache, [_snapshot(layer) for layer in cache.layers]

    @torch.inference_mode()
    def prefill_at(
        self, prefix, cuts, reserve: int = DEFAULT_RESERVE
    ) -> tuple[object, dict[int, list[dict]]]:
        """Run ``prefix`` once, in pieces that end at each of ``cuts`` (token counts in 1..len(prefix)): its
        cache and, per cut, the snapshot of the cache holding the first ``cut`` tokens. Continuing from a
        snapshot (:meth:`extend`, :meth:`answers`) writes over the cache after it, so a caller visits the
        cuts from the latest to the earliest."""
        cuts = sorted(set(cuts) | {len(prefix)})
        if len(prefix) == 0 or cuts[0] < 1:
            raise ValueError(f"cuts must lie in 1..{len(prefix)} tokens of a non-empty prefix, got {cuts}")
        if reserve < 0:
            raise ValueError(f"reserve must be >= 0 tokens, got {reserve}")
        cache, points, at = self._cache(len(prefix) + reserve), {}, 0
        for cut in cuts:
            self._feed(cache, prefix[at:cut])
            points[cut] = [_snapshot(layer) for layer in cache.layers]
            at = cut
        return cache, points

    @torch.inference_mode()
    def extend(self, cache, snapshot: list[dict], ids) -> list[dict]:
        """The cache restored to ``snapshot`` and continued with ``ids``: the snapshot after them."""
        if len(ids) == 0:
            raise ValueError("extend needs at least one token")
        _restore_all(cache, snapshot)
        self._feed(cache, ids)
        return [_snapshot(layer) for layer in cache.layers]

    @torch.inference_mode()
    def answer(self, cache, snapshot: list[dict], ids, max_new_tokens: int, done=None) -> Answer:
        """Continue the prefilled ``cache`` with ``ids`` (the question's tokens) and decode greedily up to
        ``max_new_tokens``; the cache is restored to ``snapshot`` first, so questions never see each other.
        ``done(text)``: stop as soon as it is true of the text written so far (a score that more text cannot
        raise is final once it is full)."""
        if len(ids) == 0 or max_new_tokens < 1:
            raise ValueError(
                f"a question needs tokens and max_new_tokens >= 1, got {len(ids)} tokens and {max_new_tokens}"
            )
        t0 = time.perf_counter()
        _restore_all(cache, snapshot)
        step = torch.as_tensor(list(ids), device=self._device())[None]
        written: list[int] = []
        for _ in range(max_new_tokens):
            out = self.model(input_ids=step, use_cache=True, logits_to_keep=1, **{self._cache_kw: cache})
            token = int(out.logits[0, -1].argmax())
            if token in self.stop:
                break
            written.append(token)
            if done is not None and done(self.tokenizer.decode(written, skip_special_tokens=True)):
                break
            step = torch.tensor([[token]], device=self._device())
        text = self.tokenizer.decode(written, skip_special_tokens=True)
        return Answer(tuple(written), text, time.perf_counter() - t0)

    @torch.inference_mode()
    def answers(
        self, cache, snapshot: list[dict], asks: Sequence[Request], rows: int = DEFAULT_ROWS
    ) -> list[Answer]:
        """Every question of ``asks`` continued from the prefilled ``cache``, as :meth:`answer` would answer
        each (the same greedy tokens but for float rounding), in batches of up to ``rows`` whose steps read
        the prefix once for all of them (shortest questions first, so that a batch pads little; only
        questions of one length share a batch where the rotary's schedule depends on the length). A batched
        answer's ``seconds`` is its batch's time over its questions. Answers in the order of ``asks``."""
        for ask in asks:
            if len(ask.ids) == 0 or ask.max_new_tokens < 1:
                raise ValueError(
                    f"a question needs tokens and max_new_tokens >= 1, got {len(ask.ids)} tokens and "
                    f"{ask.max_new_tokens}"
                )
        if rows < 1:
            raise ValueError(f"rows must be >= 1 questions a batch, got {rows}")
        if not self.batches:
            return [self.answer(cache, snapshot, a.ids, a.max_new_tokens, a.done) for a in asks]
        groups: dict[int, list[int]] = {}
        apart = length_dependent_positions(self.model)
        for k in sorted(range(len(asks)), key=lambda k: len(asks[k].ids)):
            groups.setdefault(len(asks[k].ids) if apart else 0, []).append(k)
        found: dict[int, Answer] = {}
        for members in groups.values():
            for a in range(0, len(members), rows):
                batch = members[a : a + rows]
                _restore_all(cache, snapshot)
                found.update(zip(batch, _Batch(self, cache, [asks[k] for k in batch]).run(), strict=True))
        return [found[k] for k in range(len(asks))]

    def _goes_on(self, ask: Request, written: list[int], token: int) -> bool:
        """Whether an answer decodes on after ``token``, which it writes unless it ends the answer; as
        :meth:`answer` stops."""
        if token in self.stop:
            return False
        written.append(token)
        if len(written) >= ask.max_new_tokens:
            return False
        return ask.done is None or not ask.done(self.tokenizer.decode(written, skip_special_tokens=True))


@torch.inference_mode()
def gold_logprob(runner: Continuation, cache, snapshot: list[dict], ids, gold) -> float:
    """log p(``gold`` | the prefix of ``snapshot``, ``ids``) on ``runner``'s model, teacher-forced, in
    nats: the summed log-likelihood of every gold token given those before it (float64 from the model's
    logits). The cache is restored to ``snapshot`` first, as before a question."""
    if len(ids) == 0 or len(gold) == 0:
        raise ValueError(
            f"a gold answer needs question tokens and gold tokens, got {len(ids)} and {len(gold)}"
        )
    _restore_all(cache, snapshot)
    step = torch.as_tensor([*ids, *gold], device=runner._device())[None]
    out = runner.model(
        input_ids=step, use_cache=True, logits_to_keep=len(gold) + 1, **{runner._cache_kw: cache}
    )
    logp = torch.log_softmax(out.logits[0, : len(gold)].double(), dim=-1)
    target = torch.as_tensor(list(gold), device=logp.device)
    return float(logp.gather(-1, target[:, None]).sum())


class _Batch:
    """Questions as the rows of one batch over the prefix of ``cache``: each padded on the right to the
    longest, each answer token at its row's next position (:mod:`posenc.hf.shared_prefix`)."""

    def __init__(self, runner: Continuation, cache, asks: list[Request]):
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        self.runner, self.asks = runner, asks
        self.start = cache.get_seq_length()
        self.prefix = Prefix([c.keys for c in cache.layers], [c.values for c in cache.layers], self.start)
        self.own = DynamicCache(config=runner.model.config)
        self.own.layers = [DynamicLayer() for _ in cache.layers]  # the rows' tokens after the prefix only
        self.device = runner._device()

    def run(self) -> list[Answer]:
        t0 = time.perf_counter()
        lengths = torch.tensor([len(a.ids) for a in self.asks], device=self.device)
        width = int(lengths.max())
        step = torch.tensor([list(a.ids) + [0] * (width - len(a.ids)) for a in self.asks], device=self.device)
        span = torch.arange(self.start, self.start + width, device=self.device).expand(len(self.asks), -1)
        rows = Rows(span, span, torch.arange(width, device=self.device) < lengths[:, None])
        ends = sorted(set((lengths - 1).tolist()))  # the logits each row's first token comes from
        keep = torch.tensor(ends, device=self.device)
        written: list[list[int]] = [[] for _ in self.asks]
        live, following = list(range(len(self.asks))), self.start + lengths
        with shared_prefix(self.runner.model, self.prefix, rows):
            logits = self._forward(step, rows.queries, keep)
            picked = logits[torch.arange(len(live)), [ends.index(n - 1) for n in lengths.tolist()]]
            while True:
                tokens = picked.argmax(-1).tolist()
                kept = [
                    k
                    for k, (r, t) in enumerate(zip(live, tokens, strict=True))
                    if self.runner._goes_on(self.asks[r], written[r], t)
                ]
                if not kept:
                    break
                if len(kept) < len(live):
                    index = torch.tensor(kept, device=self.device, dtype=torch.long)
                    for layer in self.own.layers:
                        layer.batch_select_indices(index)
                    rows.select(index)
                    following = following[index]
                live = [live[k] for k in kept]
                at = following[:, None]
                rows.queries = at
                rows.positions = torch.cat((rows.positions, at), dim=1)
                rows.valid = torch.cat((rows.valid, torch.ones_like(at, dtype=torch.bool)), dim=1)
                step = torch.tensor([[written[r][-1]] for r in live], device=self.device)
                picked = self._forward(step, at, 1)[:, -1]
                following = following + 1
        seconds = (time.perf_counter() - t0) / len(self.asks)
        decode = self.runner.tokenizer.decode
        return [Answer(tuple(w), decode(w, skip_special_tokens=True), seconds) for w in written]

    def _forward(self, step: torch.Tensor, positions: torch.Tensor, keep) -> torch.Tensor:
        out = self.runner.model(
            input_ids=step,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=keep,
            **{self.runner._cache_kw: self.own},
        )
        return out.logits


def _stop_tokens(model, tokenizer) -> frozenset[int]:
    """The ids that end an answer: the generation config's end-of-sequence ids and the tokenizer's."""
    found = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        found.update(eos if isinstance(eos, (list, tuple, set)) else [] if eos is None else [eos])
    return frozenset(int(t) for t in found)


def _snapshot(layer) -> dict:
    """The layer's state: its attributes, tensors by reference (see the module docstring)."""
    if not type(layer).__name__.startswith(("Dynamic", "Reserved")):
        raise ValueError(
            f"a shared prefix needs a cache that never writes over the tokens it holds; "
            f"{type(layer).__name__} writes in place"
        )
    return copy.copy(vars(layer))


def _restore_all(cache, snapshot: list[dict]) -> None:
    """Every layer of ``cache`` back to its state in ``snapshot``: the prefix alone."""
    for layer, saved in zip(cache.layers, snapshot, strict=True):
        _restore(layer, saved)


def _restore(layer, saved: dict) -> None:
    state = vars(layer)
    state.clear()
    state.update(saved)
