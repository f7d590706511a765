"""A small decoder-only transformer whose positional encoding is chosen by name.

Pre-norm blocks (RMSNorm, Zhang & Sennrich 2019), SwiGLU feed-forward (Shazeer 2020), tied input and
output embeddings (Press & Wolf 2017): the Llama recipe at toy size, in the spirit of nanoGPT's
``model.py``. The encoding comes from the core (:mod:`posenc`) by name through
:data:`posenc.lab.encodings.ENCODINGS`; every layer attends through the one entry point
:func:`posenc.attention`, which applies RoPE or ALiBi itself.

Shapes: token ids ``(B, T)``; residual stream ``(B, T, D)``; q, k, v ``(B, H, T, hd)`` with
``D = H * hd``; logits ``(B, T, V)``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

import posenc
from posenc.lab.checks import check_number
from posenc.lab.config import GPTConfig
from posenc.lab.context_parallel import ContextShard, check_context_parallel
from posenc.lab.encoding import Encoding
from posenc.lab.encodings import build, eval_extension
from posenc.lab.errors import LabError
from posenc.lab.extensions import rescaled_rotary

__all__ = [
    "GPT",
    "GPTConfig",
    "KVCache",
    "byte_losses",
    "eval_extension",
    "next_byte_loss",
    "rope_extension",
]


class KVCache:
    """Keys and values of the tokens seen so far, per layer: lists of ``(B, H, T_past, hd)`` tensors.

    Keys are cached *unrotated*: :func:`posenc.attention` rotates the query and every cached key on each
    call, so all keys always share one rotation schedule (which matters for length-dependent RoPE
    extensions such as dynamic NTK, whose frequencies change as the context grows). ``state`` holds, per
    layer, what the encoding's hidden-state terms keep of the cached tokens (FoX: their log forget gates,
    (B, H, T_past)), or None (:attr:`posenc.lab.encoding.Encoding.hidden_terms`).
    """

    def __init__(self, n_layer: int):
        self.k: list[torch.Tensor | None] = [None] * n_layer
        self.v: list[torch.Tensor | None] = [None] * n_layer
        self.state: list = [None] * n_layer
        self.length = 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add a layer's new keys and values; returns all of them, ``(B, H, T_past + T, hd)`` each."""
        if self.k[layer] is not None:
            k = torch.cat((self.k[layer], k), dim=-2)
            v = torch.cat((self.v[layer], v), dim=-2)
        self.k[layer], self.v[layer] = k, v
        return k, v


class SwiGLU(nn.Module):
    """FFN(x) = W2 (SiLU(W1 x) * W3 x), Shazeer 2020; hidden ~ 8/3 D keeps the FLOPs of a 4D GELU MLP."""

    def __init__(self, d_model: int):
        super().__init__()
        hidden = 32 * math.ceil(8 * d_model / 3 / 32)
        self.w13 = nn.Linear(d_model, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(a) * b)


class Block(nn.Module):
    """x + Attn(RMSNorm(x)); x + SwiGLU(RMSNorm(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.norm1 = nn.RMSNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.norm2 = nn.RMSNorm(cfg.d_model)
        self.mlp = SwiGLU(cfg.d_model)

    def forward(
        self, x: torch.Tensor, attend: dict, cache: KVCache | None = None, layer: int = 0, terms=None
    ) -> torch.Tensor:
        """``x`` (B, T, D) -> (B, T, D). ``attend``: the keyword arguments of :func:`posenc.attention` that
        carry the positional scheme (rotary, bias, positions, scale), and optionally ``query_scale``
        (H, T), which multiplies the queries first (SSMax) and the per-query bias of a hidden term that
        scales with them (``scaled_by_query``: Inkling's r). When decoding, ``cache`` holds every layer's
        past; this is ``layer``. ``terms``: the layer's hidden-state terms
        (:attr:`posenc.lab.encoding.Encoding.hidden_terms`), whose bias is the call's ``bias=``, or None."""
        B, T, D = x.shape
        h = self.norm1(x)
        q, k, v = self.qkv(h).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        factor = None
        if "query_scale" in attend:
            attend = dict(attend)
            factor = attend.pop("query_scale")[..., None]  # (H, T, 1)
            q = q * factor.to(q.dtype)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        if terms is not None:
            bias, state = terms(h, None if cache is None else cache.state[layer])
            if cache is not None:
                cache.state[layer] = state
            # a temperature on the whole score row (Inkling's tau): per-query terms scale with the query
            if factor is not None and terms.scaled_by_query:
                bias = bias.scaled(factor)
            attend = {**attend, "bias": bias}
        # Keys sit at positions 0 .. len-1 and the T queries at the last T of them, as the causal mask
        # places them, so one call serves training (T == len) and cached decoding (T < len).
        if "shard" in attend:  # context parallel: this rank's tokens against every rank's keys
            from posenc.parallel import ring_attention

            attend = dict(attend)
            shard = attend.pop("shard")
            y = ring_attention(q, k, v, indices=shard.indices, group=shard.group, causal=True, **attend)
        else:
            y = posenc.attention(q, k, v, causal=True, **attend)  # (B, H, T, hd)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.norm2(x))


def byte_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy (nats) of each target: logits ``(B, T, V)`` against target ids ``(B, T)``, ``(B, T)``."""
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")


def next_byte_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of logits ``(B, T, V)`` against target ids ``(B, T)``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class GPT(nn.Module):
    """Decoder-only transformer over bytes.

    forward(idx (B, T) int64, cache=None) -> logits (B, T, V) float32. With a :class:`KVCache`, ``idx``
    holds only the new tokens; their positions continue from ``cache.length``.

    Positions come from one :class:`~posenc.lab.encoding.Encoding` (``self.encoding``), built from the
    config's scheme; the model names no scheme and no extension. The encoding's modules are children
    (``pos_input``, ``rotary``, ``score_bias``, ``layer_biases``, ``hidden_terms``) so ``.to(device)`` and
    ``state_dict`` see them (a learned table, a bias's parameters, a gate); all but ``pos_input`` may be
    None. Per-layer parameters of the encoding's modifiers are the model's own: ``sinks`` (attention sinks)
    and ``query_scales`` (SSMax's s), each one (H,) per layer or None. An eval-time extension
    (:func:`posenc.lab.encodings.eval_extension`) swaps in a changed encoding with :meth:`use_encoding` and
    puts the trained one back.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        enc = build(cfg)
        self.pos_input, self.score_bias = enc.input, enc.bias
        self.register_module("rotary", enc.rotary)  # the trained rotary; ``rotary`` reads the current one
        self.layer_biases = None
        if enc.layer_bias is not None:
            self.layer_biases = nn.ModuleList(enc.layer_bias() for _ in range(cfg.n_layer))
        self.sinks = _sinks(cfg) if enc.sinks else None
        self.query_scales = _query_scales(cfg, enc.query_scale)
        self.hidden_terms = None
        if enc.hidden_terms is not None:
            self.hidden_terms = nn.ModuleList(enc.hidden_terms() for _ in range(cfg.n_layer))
        self.layer_modules = _layer_modules(enc)
        self.encoding = enc
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.d_model)
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2's std 0.02 for the tied table: with a final RMSNorm the logit of "repeat the current
        # byte" starts at ~d * std (2.6 at d=128), not ~sqrt(d) as with a d^-1/2 init, which would
        # waste the first steps of a short run unlearning it. The input is scaled by sqrt(d)
        # (Vaswani et al. 2017, sec. 3.4) so tokens are not swamped by a unit-scale sinusoidal table.
        nn.init.normal_(self.tok.weight, std=0.02)
        for name, p in self.blocks.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith("proj.weight") or name.endswith("w2.weight"):
                    std = 0.02 / math.sqrt(2 * self.cfg.n_layer)  # GPT-2: residual branches scaled by depth
                nn.init.normal_(p, std=std)

    @property
    def rotary(self) -> nn.Module | None:
        """The rotary of the encoding in use (an extension's, inside :func:`eval_extension`)."""
        return self.encoding.rotary

    @property
    def random_positions(self) -> int | None:
        """The range randomized positions are drawn from (Ruoss et al. 2023), or None: positions 0 .. T-1."""
        return self.encoding.random_positions

    @random_positions.setter
    def random_positions(self, value: int | None) -> None:
        self.encoding = replace(self.encoding, random_positions=value)

    @property
    def attention_window(self) -> int | None:
        """The encoding's blockwise-causal window (set by the "bca" extension), or None."""
        return self.encoding.window

    @property
    def score_temperature(self) -> float:
        """What the encoding multiplies every score by (set by the "temp" extension); 1.0 by default."""
        return self.encoding.score_scale

    def use_encoding(self, enc: Encoding) -> None:
        """Attend with ``enc`` from now on (an extension's copy of the trained encoding); its modules are
        moved to the model's device. Nothing trained changes: the trained modules stay the children."""
        for module in _modules(enc, *(layer.encoding for layer in enc.layers or ())):
            module.to(self.tok.weight.device)
        self.encoding = enc

    def set_rope_scaling(self, scaling: dict | None) -> None:
        """Swap in an eval-time RoPE context extension (a Hugging Face ``rope_scaling`` dict, or None):
        the trained rotary's RoPE with ``scaling``, ``max_position_embeddings`` the training length.

        Rotary has no parameters, so this changes nothing that was trained. Prefer
        :func:`eval_extension`, which also puts the original back.
        """
        trained = self._modules["rotary"]
        if trained is None:
            raise LabError(f"rope scaling needs a rope model; this model's encoding is {self.cfg.encoding!r}")
        rotary = rescaled_rotary(trained, scaling, self.cfg.max_len)
        self.use_encoding(replace(self.encoding, rotary=rotary))

    def forward(
        self, idx: torch.Tensor, cache: KVCache | None = None, shard: ContextShard | None = None
    ) -> torch.Tensor:
        """``shard``: this rank's share of the sequence under context parallelism (training, no cache)."""
        if shard is not None:
            return _sharded_forward(self, idx, shard)
        enc, T = self.encoding, idx.shape[1]
        offset = cache.length if cache is not None else 0
        x = self.tok(idx) * math.sqrt(self.cfg.d_model)
        positions = None
        if self.training and enc.train_positions is not None:
            positions = enc.train_positions(idx.shape[0], T, idx.device)
            x = enc.input(x, offset=offset)
        elif enc.random_positions is not None:
            if cache is not None:
                raise LabError("a model with randomized positions cannot decode with a KV cache")
            positions = self._random_positions(T, idx.device)
            x = enc.input(x, positions=positions)
        else:
            x = enc.input(x, offset=offset)
        layers = _per_layer(self, T, offset, positions, idx.device)
        for i, (block, attend) in enumerate(zip(self.blocks, layers, strict=True)):
            x = block(x, attend, cache, i, None if self.hidden_terms is None else self.hidden_terms[i])
        if cache is not None:
            cache.length += T
        return self.norm(x) @ self.tok.weight.T

    def _random_positions(self, T: int, device) -> torch.Tensor:
        """(T,) sorted distinct positions drawn from 0 .. max(random_positions, T) - 1 (Ruoss et al. 2023).

        Training draws from torch's global generator (seeded by the run); evaluation from a generator
        seeded by T, so that a model scores the same windows the same way every time.
        """
        n = max(self.random_positions, T)
        generator = None if self.training else torch.Generator().manual_seed(T)
        return torch.randperm(n, generator=generator)[:T].sort().values.to(device)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-byte cross-entropy (nats)."""
        return next_byte_loss(self(idx), targets)

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Continue ``prompt`` (B, T0) by ``max_new_tokens`` tokens -> (B, T0 + n); temperature 0 is greedy.

        With ``use_cache`` the prompt is processed once and each new token costs one position; without
        it the whole sequence is re-run each step (the reference the cache is tested against).
        """
        check_number("temperature", temperature, low=0, why="0 means greedy")
        # randomized positions are drawn per sequence length, so every step re-reads the whole sequence
        use_cache = use_cache and self.random_positions is None
        out = prompt
        cache = KVCache(self.cfg.n_layer) if use_cache else None
        step_input = prompt
        for _ in range(max_new_tokens):
            logits = self(step_input, cache) if use_cache else self(out)
            nxt = _pick(logits[:, -1, :].float(), temperature, top_k, generator)
            out = torch.cat((out, nxt), dim=1)
            step_input = nxt
        return out


def _sinks(cfg: GPTConfig) -> nn.ParameterList:
    """A learned sink logit per head for every layer, started at 0 (Xiao et al. 2023; GPT-OSS)."""
    return nn.ParameterList(nn.Parameter(torch.zeros(cfg.n_head)) for _ in range(cfg.n_layer))


def _layer_modules(enc: Encoding) -> nn.ModuleList | None:
    """The rotaries and biases of a per-layer plan's layers, children of the model so that ``.to(device)``
    moves them and ``state_dict`` holds a learned bias's parameters; None without a plan."""
    return None if enc.layers is None else nn.ModuleList(_modules(*(layer.encoding for layer in enc.layers)))


def _modules(*encodings: Encoding):
    """The input encodings, rotaries and biases of ``encodings`` that are set."""
    return (m for e in encodings for m in (e.input, e.rotary, e.bias) if m is not None)


def _query_scales(cfg: GPTConfig, query_scale) -> nn.ParameterList | None:
    """A learned query-scale s per head for every layer, started at ``query_scale.init`` (SSMax), or None."""
    if query_scale is None or not query_scale.learned:
        return None
    return nn.ParameterList(
        nn.Parameter(torch.full((cfg.n_head,), float(query_scale.init))) for _ in range(cfg.n_layer)
    )


def _sharded_forward(model: GPT, idx: torch.Tensor, shard: ContextShard) -> torch.Tensor:
    """This rank's logits (B, n, V) for its tokens at ``shard.indices``: positions are the global indices,
    every layer's attention the ring's."""
    check_context_parallel(model.encoding, model.cfg.encoding)
    positions = shard.indices.to(idx.device)
    x = model.encoding.input(model.tok(idx) * math.sqrt(model.cfg.d_model), positions=positions)
    layers = _per_layer(model, idx.shape[1], 0, positions, idx.device, shard)
    for block, attend in zip(model.blocks, layers, strict=True):
        x = block(x, attend)
    return model.norm(x) @ model.tok.weight.T


def _per_layer(model: GPT, q_len: int, offset: int, positions, device, shard: ContextShard | None = None):
    """The keyword arguments of :func:`posenc.attention` for each layer in turn, from the model's encoding
    (or the layer's own, under a per-layer plan): its rotary, its bias (shared, or the layer's own) under
    its windows, its score scale, the layer's sink logits, the positions of this call when they are not
    the ordinary ones; and the layer's query scale (H, q_len) for the block to apply, which counts every
    key a query sees, the cached ones included. Under context parallelism (``shard``), q_len tokens at the
    shard's global ``positions``: every layer attends on the ring, and a query sees position + 1 keys."""
    enc = model.encoding
    plan = [layer.encoding for layer in enc.layers] if enc.layers is not None else None

    def attend(lenc: Encoding, bias, layer: int) -> dict:
        out = lenc.attend(bias, q_len, offset + q_len, model.cfg.head_dim, device)
        if positions is not None and (lenc.rotary is not None or shard is not None):
            out["positions"] = positions
        if shard is not None:
            out["shard"] = shard
        if model.sinks is not None:
            out["sinks"] = model.sinks[layer]
        if lenc.query_scale is not None:
            seen = positions + 1 if shard is not None else lenc.keys_seen(q_len, offset + q_len, device)
            s = lenc.query_scale.init if model.query_scales is None else model.query_scales[layer]
            out["query_scale"] = lenc.query_scale.factor(s, seen)
        return out

    per_layer = plan is not None or any(
        m is not None for m in (model.layer_biases, model.sinks, model.query_scales)
    )
    shared = None if per_layer else attend(enc, enc.bias, 0)
    for i in range(len(model.blocks)):
        if shared is not None:
            yield shared
            continue
        lenc = enc if plan is None else plan[i]
        yield attend(lenc, model.layer_biases[i] if model.layer_biases is not None else lenc.bias, i)


def _pick(logits: torch.Tensor, temperature: float, top_k: int | None, generator) -> torch.Tensor:
    """The next token (B, 1) from last-position logits (B, V): argmax at temperature 0, else a sample."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)


# The name the RoPE-only version had; every extension goes through eval_extension now.
rope_extension = eval_extension
