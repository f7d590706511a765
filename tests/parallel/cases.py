"""Ring-attention cases shared by the virtual-ring tests and the gloo workers: a whole sequence, one
position term, the single-process reference (posenc.attention on the gathered sequence) and the
comparison of a ring's shards against it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import posenc
from posenc.parallel import shard, shard_indices, shard_positions

TERMS = (
    "none",
    "rope",
    "xpos",
    "mrope",
    "dynamic",
    "alibi",
    "t5",
    "kerple",
    "sandwich",
    "fire",
    "window",
    "window-alibi",
    "documents",
    "sinks",
    "selfextend",
    "rerope",
    "leaky-rerope",
    "string",
    "dual-chunk",
    "fox",
    "banded",
    "shaw",
    "shaw-documents",
    "cope",
    "cope-documents",
)
REMAPS = {
    "selfextend": lambda: posenc.SelfExtend(3, 4),
    "rerope": lambda: posenc.ReRoPE(4, log_n_length=8),
    "leaky-rerope": lambda: posenc.ReRoPE(4, leaky=2.0),
    "string": lambda: posenc.STRING(6, 2, attention_factor=1.1),
    "dual-chunk": lambda: posenc.DualChunk(8, 2),
}
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


@dataclass
class Case:
    term: str
    length: int
    causal: bool
    dtype: torch.dtype
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    options: dict
    positions: torch.Tensor | None = None
    documents: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    params: list = field(default_factory=list)
    gates: torch.Tensor | None = None  # FoX's log forget gates of the whole sequence (batch, heads, length)
    rel: tuple | None = None  # the banded bias's r (batch, heads, length, d_rel) and P (d_rel, extent)

    def reference(self) -> torch.Tensor:
        """posenc.attention on the whole sequence with the same term."""
        o = self.options
        rotary, bias = o.get("rotary"), o.get("bias")
        if self.gates is not None:
            bias = posenc.ForgetBias(self.gates)
        if self.rel is not None:
            bias = posenc.BandedBias(*self.rel)
        if isinstance(bias, (posenc.ShawRelative, posenc.CoPE)) and self.documents is not None:
            return _per_document(self, bias)
        mask = _allowed(self)
        if mask is None:
            return posenc.attention(
                self.q,
                self.k,
                self.v,
                rotary=rotary,
                bias=bias,
                causal=self.causal,
                positions=self.positions,
                sinks=o.get("sinks"),
                remap=o.get("remap"),
            )
        if bias is None:
            return posenc.attention(
                self.q, self.k, self.v, rotary=rotary, bias=mask, causal=False, positions=self.positions
            )
        p = self.positions if self.positions is not None else torch.arange(self.length)
        scores = bias.tile(p, p).to(self.dtype).masked_fill(~mask, float("-inf"))
        return posenc.attention(self.q, self.k, self.v, rotary=rotary, bias=scores, causal=False, positions=p)

    def shard_kwargs(self, indices: torch.Tensor) -> dict:
        """ring_attention's keywords for the rank holding ``indices``."""
        kw = {k: v for k, v in self.options.items() if k != "layout"}
        if self.positions is not None:
            kw["positions"] = shard_positions(indices, positions=self.positions)
        if self.documents is not None:
            kw["document_ids"] = shard(self.documents, indices, fill=-1)
        if self.gates is not None:  # each rank's gates: its own tokens'
            kw["bias"] = posenc.ForgetBias(shard(self.gates, indices))
        if self.rel is not None:  # each rank's r, one shared table
            kw["bias"] = posenc.BandedBias(shard(self.rel[0], indices, dim=2), self.rel[1])
        return kw

    def indices(self, world: int, rank: int, layout: str) -> torch.Tensor:
        if self.cu_seqlens is not None and layout == "headtail":
            return shard_indices(self.length, world, rank, layout, cu_seqlens=self.cu_seqlens, pad=True)
        return shard_indices(self.length, world, rank, layout, pad=True)


def _per_document(case: Case, bias) -> torch.Tensor:
    """posenc.attention on each packed document alone (Shaw's and CoPE's terms take no mask), side by
    side: what a document mask over the whole sequence means for them."""
    cuts = case.cu_seqlens.tolist()
    parts = [
        posenc.attention(
            case.q[:, :, a:b], case.k[:, :, a:b], case.v[:, :, a:b], bias=bias, causal=case.causal
        )
        for a, b in zip(cuts[:-1], cuts[1:], strict=True)
    ]
    return torch.cat(parts, dim=2)


def _allowed(case: Case) -> torch.Tensor | None:
    window = case.options.get("window")
    if window is None and case.documents is None:
        return None
    i = torch.arange(case.length)
    ok = torch.ones(case.length, case.length, dtype=torch.bool)
    if case.causal:
        ok &= i[None, :] <= i[:, None]
    if window is not None:
        ok &= (i[:, None] - i[None, :]).abs() < window
    if case.documents is not None:
        ok &= case.documents[:, None] == case.documents[None, :]
    return ok


def make_case(
    term: str, length: int, causal: bool, dtype=torch.float64, seed: int = 0, heads=4, kv_heads=2, v_dim=8
):
    """One term's case; values as wide as queries (v_dim 8) take the flash path on the CPU, narrower ones
    the ring's own arithmetic."""
    gen = torch.Generator().manual_seed(seed * 1000 + length)
    dim = 8

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_(True)

    q, k, v = rand(2, heads, length, dim), rand(2, kv_heads, length, dim), rand(2, kv_heads, length, v_dim)
    options: dict = {"causal": causal}
    case = Case(term, length, causal, dtype, q, k, v, options)
    if term in ("rope", "window", "window-alibi", "documents", "sinks", *REMAPS):
        options["rotary"] = posenc.RotaryEmbedding(dim)
    if term == "xpos":
        options["rotary"] = posenc.XPos(dim, scale_base=16.0)
    if term == "dynamic":
        scaling = {"rope_type": "dynamic", "factor": 2.0}
        options["rotary"] = posenc.RotaryEmbedding(dim, scaling=scaling, max_position_embeddings=8)
    if term == "mrope":
        options["rotary"] = posenc.MRotaryEmbedding(dim, [2, 1, 1])
        case.positions = torch.randint(0, 3 * length, (3, 2, length), generator=gen)
    biases = {
        "alibi": lambda: posenc.ALiBi(heads),
        "window-alibi": lambda: posenc.ALiBi(heads),
        "documents": lambda: posenc.ALiBi(heads),
        "t5": lambda: posenc.T5Bias(heads, num_buckets=8, max_distance=16),
        "kerple": lambda: posenc.KerpleBias(heads),
        "sandwich": lambda: posenc.SandwichBias(heads, dim=8),
        "fire": lambda: posenc.FireBias(heads, hidden=8, train_len=16),
    }
    if term in biases:
        torch.manual_seed(seed)
        bias = biases[term]().to(dtype)
        options["bias"] = bias
        case.params = [p for p in bias.parameters() if p.requires_grad]
    if term.startswith("window"):
        options["window"] = max(2, length // 5)
    if term.endswith("documents"):
        cuts = sorted(torch.randperm(length - 1, generator=gen)[:2].add(1).tolist())
        case.cu_seqlens = torch.tensor([0, *cuts, length])
        case.documents = torch.repeat_interleave(torch.arange(3), case.cu_seqlens.diff())
        case.positions = posenc.packed_positions(cu_seqlens=case.cu_seqlens)
    if term == "sinks":
        options["sinks"] = torch.randn(heads, generator=gen, dtype=dtype).requires_grad_(True)
        case.params = [options["sinks"]]
    if term in REMAPS:
        options["remap"] = REMAPS[term]()
    if term == "fox":  # with RoPE: FoX's decay on top of rotated scores
        options["rotary"] = posenc.RotaryEmbedding(dim)
        gates = torch.nn.functional.logsigmoid(torch.randn(2, heads, length, generator=gen, dtype=dtype) + 2)
        case.gates = gates.requires_grad_(True)
        case.params = [case.gates]
    if term == "banded":  # Inkling's banded bias over the last 5 keys, no other position term
        rel = torch.randn(2, heads, length, 3, generator=gen, dtype=dtype).requires_grad_(True)
        table = torch.randn(3, 5, generator=gen, dtype=dtype).requires_grad_(True)
        case.rel, case.params = (rel, table), [rel, table]
    if term.startswith(("shaw", "cope")):  # Shaw's tables, or CoPE's with positions past its end (8)
        torch.manual_seed(seed)
        bias = posenc.ShawRelative(dim, 4, v_dim=v_dim) if term.startswith("shaw") else posenc.CoPE(dim, 8)
        bias = bias.to(dtype)
        if term.startswith("cope"):  # CoPE starts at zero: random embeddings, so its positions count
            bias.pos_emb.data = torch.randn(dim, 8, generator=gen, dtype=dtype)
        options["bias"] = bias
        case.params = list(bias.parameters())
    if term in ("sinks", "fox", "banded", "cope", "cope-documents", *REMAPS) and not causal:
        options["causal"] = case.causal = True  # sinks and remaps are causal only, as posenc.attention's
    return case


def gradients(case: Case, out: torch.Tensor, weight: torch.Tensor) -> list[torch.Tensor]:
    """d(sum(out * weight)) / d(q, k, v, the term's parameters)."""
    return list(torch.autograd.grad((out * weight).sum(), [case.q, case.k, case.v, *case.params]))


def parameter_error(mine: torch.Tensor, theirs: torch.Tensor) -> float:
    """The largest difference of a parameter's gradient, in float32 relative to its largest entry when
    that is over 1: such a gradient sums over every pair of the batch, and at float32 the single-process
    reference's own error grows with it (Shaw's a^V at 37 tokens: entries of 20, the reference 1.4e-5 from
    float64's; the ring 4e-6)."""
    err = (mine - theirs).abs().max().item()
    if theirs.dtype == torch.float32:
        err /= max(1.0, theirs.abs().max().item())
    return err


def weight_for(case: Case) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(2, case.q.shape[1], case.length, case.v.shape[-1], generator=gen, dtype=case.dtype)
