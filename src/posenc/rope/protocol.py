"""The rotary protocol: what :func:`posenc.attention` (``rotary=``) asks of a rotary position embedding.

A rotary embedding turns pair k of a query or key at position p by an angle theta_k(p), so that q . k
depends on the positions only through their difference (RoPE, Su et al. 2021, arxiv.org/abs/2104.09864).
posenc has five, each of which implements :class:`RotaryProtocol`:

* :class:`~.embedding.RotaryEmbedding` (RoPE and every context-extension schedule): 1-D positions;
* :class:`~.xpos.XPos` (Sun et al. 2022, arxiv.org/abs/2212.10554): RoPE times a per-pair decay, queries
  scaled by zeta^(n/B) and keys by zeta^(-n/B);
* :class:`~.mrope.MRotaryEmbedding` (M-RoPE, Wang et al. 2024, arxiv.org/abs/2409.12191): (time, height,
  width) positions;
* :class:`~.axial.AxialRotaryEmbedding` (Heo et al. 2024, arxiv.org/abs/2403.13298): grid coordinates;
* :class:`~.fope.FoPE` (Hua et al. 2024, arxiv.org/abs/2412.17739): a Fourier series per pair, per head, the
  frequencies below the training length's floor clipped to zero (a scaled rotation, not a pure one).

All five derive from :class:`~.base.Rotary`, whose ``forward`` and ``rotate`` are one dispatch over a
``tables(x, positions, offset, ...) -> (cos, sin)`` hook; a subclass overriding that hook alone is a rotary
embedding too. Anything else with these methods (and callable, as an ``nn.Module`` is: calling it runs
``forward``) passes ``isinstance(obj, RotaryProtocol)`` and works with ``posenc.attention(rotary=obj)``.

A rotary whose frequencies depend on the length of the call (dynamic NTK, LongRoPE) declares it with a true
``length_dependent`` attribute; :func:`length_dependent` is what every other part of posenc reads (a
shared prefix, a ring of ranks and a KV cache cannot reuse such a rotation across lengths).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

__all__ = ["RotaryProtocol", "is_rotary", "length_dependent"]

_MEMBERS = ("__call__", "forward", "rotate", "cos_sin")


@runtime_checkable
class RotaryProtocol(Protocol):
    """A rotary position embedding: rotates queries and keys by their positions.

    Shapes: q (batch, heads, q_len, head_dim), k (batch, kv_heads, k_len, head_dim) (1-D RoPE and xPos
    also take (..., seq, head_dim)); the outputs have the inputs' shapes and dtypes. What a position is
    depends on the embedding:

    * RoPE, xPos: (seq,) or (batch, seq), integer or fractional; default: the keys at
      offset .. offset+k_len-1 and the queries at the last q_len of them (decoding with a cache);
    * M-RoPE: (3, batch, seq) time/height/width ids, or text positions (batch, seq) / (seq,); required;
    * axial: (N, axes) grid coordinates (or ``grid=`` sizes); the first ``prefix_tokens`` tokens unrotated.

    ``forward(q, k, *, positions=None, k_positions=None, offset=0) -> (q, k)``: queries at ``positions``,
    keys at ``k_positions`` (default: ``positions`` when q and k have one length). ``offset`` is where
    1-D default positions start; an embedding whose positions are not a 1-D run refuses a non-zero one.

    ``rotate(x, positions=None) -> x``: one tensor (..., seq, head_dim). xPos rotates and scales it as
    queries unless told ``kind="k"``.

    ``cos_sin(positions) -> (cos, sin)``: the rotation's tables at ``positions``, each
    (..., seq, rotary_dim/2) float32 (RoPE: (seq, r/2) or (batch, seq, r/2); M-RoPE: (batch, seq, r/2) for
    (3, batch, seq) positions; axial: (heads or 1, N, head_dim/2)). xPos's decay is not in them (see
    :meth:`~.xpos.XPos.scale`).
    """

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        offset: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        offset: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def rotate(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor: ...

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


_conforming: set[type] = set()  # classes that define every member: isinstance on a Protocol costs ~4 us


def is_rotary(obj) -> bool:
    """``isinstance(obj, RotaryProtocol)``, remembered per class once the class itself defines every
    member (the check runs on every attention call)."""
    cls = type(obj)
    if cls in _conforming:
        return True
    if not isinstance(obj, RotaryProtocol):
        return False
    if all(callable(getattr(cls, name, None)) for name in _MEMBERS):
        _conforming.add(cls)
    return True


def length_dependent(rotary) -> bool:
    """Whether ``rotary`` declares frequencies that depend on the length of the call: its
    ``length_dependent`` attribute (False for a rotary that declares none)."""
    return bool(getattr(rotary, "length_dependent", False))
