"""Next-token losses and greedy answers of a causal LM over long inputs, without (length, vocab) logits.

At 16384 tokens and a 49152-token vocabulary, a model's full logits are 3.2 GB in float32, more than the
model's own activations; :class:`Scorer` runs the model's body once and applies its output head to 1024
positions at a time. The split is checked against the model's own forward on a short input when the
scorer is built: a model whose head does more than a linear map (logit soft-capping, scaling) fails the
check and is scored through its full forward instead, as it would run.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["Scorer", "window_stats"]

_CHUNK = 1024
_CHECK_TOKENS = 16


class Scorer:
    """``nll(ids)``: the loss of every next token; ``answers(ids, n)``: the greedy choice at the last n.

    Args:
        model: a transformers causal LM (``model(input_ids=...).logits``), in eval mode.
    """

    def __init__(self, model):
        self.model = model
        self._body = getattr(model, "base_model", None)
        self._head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        self.split = self._body is not None and self._head is not None and self._split_matches()

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def _split_matches(self) -> bool:
        vocab = getattr(self._head, "out_features", None) or self._head.weight.shape[0]
        ids = torch.arange(_CHECK_TOKENS, device=self._device())[None] * 7 % vocab
        whole = self.model(input_ids=ids).logits.float()
        split = self._head(self._body(input_ids=ids).last_hidden_state).float()
        return whole.shape == split.shape and bool(torch.allclose(whole, split, rtol=1e-4, atol=1e-4))

    def _logits(self, ids: torch.Tensor, start: int, stop: int):
        """Logits of positions start..stop-1, chunk by chunk: yields (chunk_start, logits (n, vocab))."""
        if not self.split:
            logits = self.model(input_ids=ids).logits[0]
            for s in range(start, stop, _CHUNK):
                yield s, logits[s : min(stop, s + _CHUNK)].float()
            return
        hidden = self._body(input_ids=ids).last_hidden_state[0]
        for s in range(start, stop, _CHUNK):
            yield s, self._head(hidden[s : min(stop, s + _CHUNK)]).float()

    @torch.inference_mode()
    def nll(self, ids) -> torch.Tensor:
        """-log p(token t+1 | tokens 0..t) for t = 0..L-2: float64 (L-1,) on the CPU. ``ids``: (L,) ints."""
        ids = torch.as_tensor(ids, device=self._device()).reshape(1, -1)
        length = ids.shape[1]
        out = torch.empty(length - 1, dtype=torch.float64)
        for s, logits in self._logits(ids, 0, length - 1):
            n = logits.shape[0]
            target = ids[0, s + 1 : s + 1 + n]
            out[s : s + n] = F.cross_entropy(logits, target, reduction="none").double().cpu()
        return out

    @torch.inference_mode()
    def answers(self, ids, n: int) -> list[int]:
        """The most likely token at each of the last ``n`` positions of ``ids`` given those before it: what
        greedy decoding writes there when the tokens before are the prompt and its first answers."""
        ids = torch.as_tensor(ids, device=self._device()).reshape(1, -1)
        length = ids.shape[1]
        picks = [logits.argmax(-1) for _, logits in self._logits(ids, length - 1 - n, length - 1)]
        return torch.cat(picks).tolist()


def _edges(n: int, first: int = 64) -> list[int]:
    edges, e = [0], first
    while e < n:
        edges.append(e)
        e *= 2
    return [*edges, n]


def window_stats(nll: torch.Tensor, tail: int, head: int) -> dict:
    """The summed losses a report needs from one window's ``nll`` (:meth:`Scorer.nll`, (L-1,)), JSON-ready:
    ``{"tail": [sum, n], "all": [sum, n], "head": [sum, n], "buckets": [[start, end, sum, n], ...],
    "tail_nll": [...]}``.

    tail: the last ``tail`` predictions (the tokens every length scores alike), and each of their losses
    (tail_nll: LongPPL's key tokens are read from them, :mod:`posenc.real.longppl`); all: every prediction;
    head: the first ``head`` predictions (contexts of at most ``head`` tokens, a short prompt); buckets: the
    predictions at context lengths [0, 64), [64, 128), [128, 256), ... doubling to the window's end.
    """
    n = nll.shape[0]
    values = nll.tolist()

    def part(a: int, b: int) -> list:
        return [math.fsum(values[a:b]), b - a]

    edges = _edges(n)
    return {
        "tail": part(n - min(tail, n), n),
        "all": part(0, n),
        "head": part(0, min(head, n)),
        "buckets": [[a, b, *part(a, b)] for a, b in zip(edges, edges[1:], strict=False)],
        "tail_nll": [round(v, 6) for v in values[n - min(tail, n) :]],
    }
