"""Questions that share one long prefix: the prefix is run once, each question continues from its cache.

A trial's haystack is long (thousands of tokens) and its questions short (tens). :class:`Continuation`
runs the prefix once with a ``DynamicCache``, keeps a snapshot of the cache's layers, and for each question
feeds the question's tokens and decodes greedily from there, restoring the snapshot before the next one.
Every question therefore sees exactly the cache a fresh forward of ``prefix + question`` would build (the
tests check it token for token against ``model.generate`` on the whole prompt), at the cost of one long
forward per trial instead of one per question.

The snapshot holds references, not copies: a ``DynamicCache`` layer grows by concatenation into new
tensors (``torch.cat``), never writing into the tensors it had, so the prefix's keys and values stay intact
while a question runs; a sliding-window layer's trimmed tail is restored the same way. A cache whose layers
write in place (a static cache) is refused.
"""

from __future__ import annotations

import copy
import inspect
import time
from dataclasses import dataclass

import torch

__all__ = ["Answer", "Continuation"]


@dataclass(frozen=True)
class Answer:
    """What the model wrote after one question: ``tokens`` (greedy, up to the question's budget or an
    end-of-sequence token, which is not included), their ``text``, and the ``seconds`` the question took
    (its continuation and decoding, not the shared prefix)."""

    tokens: tuple[int, ...]
    text: str
    seconds: float


class Continuation:
    """Runs prefixes and the questions that continue them on ``model`` (a transformers causal LM in eval
    mode), decoding with ``tokenizer``."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.stop = _stop_tokens(model, tokenizer)
        # transformers 5 renames past_key_values to cache (the old name warns on every call, then goes)
        takes = inspect.signature(type(model).forward).parameters
        self._cache_kw = "cache" if "cache" in takes else "past_key_values"

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def prefill(self, prefix) -> tuple[object, list[dict]]:
        """Run ``prefix`` (token ids) once: its cache and the snapshot its questions restore."""
        from transformers import DynamicCache

        if len(prefix) == 0:
            raise ValueError("prefix is empty: a trial needs at least one token before its questions")
        cache = DynamicCache(config=self.model.config)
        ids = torch.as_tensor(list(prefix), device=self._device())[None]
        self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._cache_kw: cache})
        return cache, [_snapshot(layer) for layer in cache.layers]

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
        for layer, saved in zip(cache.layers, snapshot, strict=True):
            _restore(layer, saved)
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


def _stop_tokens(model, tokenizer) -> frozenset[int]:
    """The ids that end an answer: the generation config's end-of-sequence ids and the tokenizer's."""
    found = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        found.update(eos if isinstance(eos, (list, tuple, set)) else [] if eos is None else [eos])
    return frozenset(int(t) for t in found)


def _snapshot(layer) -> dict:
    """The layer's state: its attributes, tensors by reference (see the module docstring)."""
    if not type(layer).__name__.startswith("Dynamic"):
        raise ValueError(
            f"a shared prefix needs a cache that grows by concatenation; {type(layer).__name__} writes in "
            "place"
        )
    return copy.copy(vars(layer))


def _restore(layer, saved: dict) -> None:
    state = vars(layer)
    state.clear()
    state.update(saved)
