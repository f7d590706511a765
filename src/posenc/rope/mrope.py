"""Multimodal RoPE (M-RoPE; Wang et al. 2024, "Qwen2-VL", arxiv.org/abs/2409.12191, sec. 2.1).

Every token has three positions (time, height, width); text tokens have the same value on all three, so
for text M-RoPE is plain 1-D RoPE. Each frequency pair k of the head takes its angle from one of the three
axes: theta_k = p[axis(k)] * omega_k. Which axis is a matter of ``mrope_section`` (t, h, w pair counts):

* contiguous (Qwen2-VL, Qwen2.5-VL): the first t pairs follow time, the next h height, the last w width;
* interleaved (Qwen3-VL, "Interleaved-MRoPE"): pairs cycle t, h, w, t, h, w, ... while each axis has
  pairs left, then time: every axis spans the whole spectrum, fast to slow (NeoMME: rows and columns
  alternate the same way, two axes);
* spatial-interleaved (ERNIE-4.5-VL): height and width alternate over the first pairs, time takes the
  last (slowest) ones.

The interleaving is of frequency *slots*; the rotation still pairs dimension i with i + rotary_dim/2
("half", rotate_half), in both models. Text alone never shows the difference, image grids do.

:func:`mrope_positions` builds the (3, batch, seq) positions for a sequence of text and image/video grids
(the Qwen2-VL / Qwen2.5-VL / Qwen3-VL rules) and the ``rope_deltas`` that continue them while decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _checks
from .base import Checked, Placement, Rotary
from .frequencies import resolve_schedule
from .table import align_to, call_context, cos_sin_of

__all__ = ["ORDERS", "MRotaryEmbedding", "mrope_axes", "mrope_decode_positions", "mrope_positions"]

TEXT, IMAGE, VIDEO = 0, 1, 2


ORDERS = ("contiguous", "interleaved", "spatial-interleaved")
"""How the axes' frequency pairs are laid out (:func:`mrope_axes`)."""


def mrope_axes(
    mrope_section: Sequence[int], interleaved: bool = False, *, order: str | None = None
) -> torch.Tensor:
    """The position axis (0 time, then the spatial axes: height, width, ...) of each frequency pair: long
    tensor (sum(section),). ``mrope_section``: pairs per axis, 2 to 4 axes.

    ``order`` (``interleaved=True`` is ``order="interleaved"``):

    * "contiguous" (Qwen2-VL): section[0] zeros, then section[1] ones, and so on;
    * "interleaved" (Qwen3-VL; NeoMME's two axes): axis a >= 1 takes the pairs j = a mod n below
      n * section[a] (n axes), time every other pair: t, h, w, t, h, w, ..., then t;
    * "spatial-interleaved" (ERNIE-4.5-VL): the spatial axes alternate over the first pairs (h, w, h, w,
      ...), time takes the last section[0].
    """
    section = _section(mrope_section)
    order = _order(interleaved, order)
    n, axes_n = sum(section), len(section)
    if order == "contiguous":
        return torch.repeat_interleave(torch.arange(axes_n), torch.tensor(section))
    axes = torch.zeros(n, dtype=torch.long)
    if order == "interleaved":
        for axis in range(1, axes_n):
            axes[torch.arange(axis, min(axes_n * section[axis], n), axes_n)] = axis
    else:
        spatial = n - section[0]
        axes[:spatial] = 1 + torch.arange(spatial) % (axes_n - 1)
    counts = torch.bincount(axes, minlength=axes_n).tolist()
    if counts != list(section):
        rule = (
            f"each spatial axis a takes the pairs j = a mod {axes_n} below {axes_n} * section[a]"
            if order == "interleaved"
            else "the spatial axes alternate, so their sections must be equal"
        )
        raise ValueError(
            f"mrope_section {list(section)} cannot be laid out {order!r} ({rule}): the axes would get "
            f"{counts} pairs"
        )
    return axes


def _order(interleaved, order) -> str:
    if not isinstance(interleaved, bool):
        raise ValueError(f"interleaved must be True or False, got {interleaved!r}")
    if order is None:
        return "interleaved" if interleaved else "contiguous"
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
    if interleaved and order != "interleaved":
        raise ValueError(f"interleaved=True and order={order!r} disagree: give one of them")
    return order


def _section(mrope_section) -> tuple[int, ...]:
    if not isinstance(mrope_section, (list, tuple)) or not 2 <= len(mrope_section) <= 4:
        raise ValueError(
            "mrope_section must be the pair counts of 2 to 4 axes (time, height, width, ...), got "
            f"{mrope_section!r}"
        )
    return tuple(_checks.positive_int(f"mrope_section[{i}]", s) for i, s in enumerate(mrope_section))


class MRotaryEmbedding(Rotary):
    """Multimodal RoPE: pair k rotated by p[axis(k)] * omega_k (Wang et al. 2024, Qwen2-VL sec. 2.1).

    Args:
        head_dim: size of each head's query/key vector.
        mrope_section: pairs per axis (time, height, width; 2 to 4 axes); they sum to rotary_dim / 2.
        base: rope_theta.
        interleaved: Qwen3-VL's interleaved frequency slots instead of Qwen2-VL's contiguous sections.
        order: the layout of the pairs among the axes, one of :data:`ORDERS` (:func:`mrope_axes`); default
            "interleaved" or "contiguous" as ``interleaved`` says.
        scaling: a Hugging Face scaling dict (linear, ntk, yarn, llama3, dynamic, ...) or None. A
            length-dependent method (dynamic NTK) takes its length as 1 + the largest position of the call on
            any axis, as transformers does, unless ``context_len`` is given.
        layout: pairing of dimensions, "half" (Qwen, rotate_half) or "interleaved".
        rotary_dim: rotate only the first rotary_dim dimensions (default 2 * sum(mrope_section)).

    Shape:
        forward(q, k, positions, *, k_positions=None) -> (q, k): q (batch, heads, q_len, head_dim), k
        (batch, kv_heads, k_len, head_dim); positions (axes, batch, q_len) (time, height, width: one row
        per mrope_section entry), or (batch, q_len) / (q_len,) for text, the same on every axis; k_positions
        the keys' (default: ``positions``, when q and k have one length). rotate(x, positions, *,
        context_len=None) -> x. The dispatch is :class:`~.base.Rotary`'s: this class gives its
        :meth:`tables` and places its (axes, batch, seq) positions (:meth:`place`). It implements
        :class:`~.protocol.RotaryProtocol`.
    """

    def __init__(
        self,
        head_dim: int,
        mrope_section: Sequence[int],
        base: float = 10000.0,
        interleaved: bool = False,
        scaling: dict | None = None,
        layout: str = "half",
        rotary_dim: int | None = None,
        max_position_embeddings: int | None = None,
        order: str | None = None,
    ):
        super().__init__()
        section = _section(mrope_section)
        order = _order(interleaved, order)
        head_dim = _checks.even_int("head_dim", head_dim)
        if rotary_dim is None and 2 * sum(section) > head_dim:
            raise ValueError(
                f"mrope_section {list(section)} has {sum(section)} pairs, more than head_dim={head_dim} "
                f"holds ({head_dim // 2})"
            )
        rotary_dim = 2 * sum(section) if rotary_dim is None else rotary_dim
        schedule = resolve_schedule(
            head_dim,
            base=base,
            scaling=scaling,
            rotary_dim=rotary_dim,
            max_position_embeddings=max_position_embeddings,
        )
        if 2 * sum(section) != schedule.freq_dim:
            raise ValueError(
                f"mrope_section {list(section)} sums to {sum(section)} pairs, but the rotary dimension "
                f"{schedule.freq_dim} has {schedule.freq_dim // 2}"
            )
        self.head_dim, self.rotary_dim, self.base = head_dim, schedule.rotary_dim, schedule.base
        self.mrope_section, self.order = section, order
        self.interleaved = order == "interleaved"
        self.layout = _checks.layout(layout)
        self.axes = mrope_axes(section, order=order)
        self.schedule = schedule
        inv, attn = schedule.at()
        self.inv_freq64, self.attention_factor = inv, float(attn)

    @property
    def length_dependent(self) -> bool:
        """True when the frequencies depend on the sequence length (a dynamic schedule)."""
        return self.schedule.length_dependent

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32, context_len=None):
        """cos and sin (attention factor included), each (batch, seq, rotary_dim/2), of (axes, batch, seq)
        positions, or of text positions (batch, seq) / (seq,) (then (seq, rotary_dim/2)). ``context_len``:
        the length a length-dependent schedule is taken at (default 1 + the largest of ``positions``)."""
        positions = _positions(positions, len(self.mrope_section))
        inv, attn = self._frequencies(positions, context_len)
        if positions.dim() <= 2:  # text, (seq,) or (batch, seq): all three axes alike
            return cos_sin_of(positions, inv, attn, dtype)
        axes = self.axes.to(positions.device)
        # the position each pair follows: (batch, seq, pairs), then angles pair by pair
        per_pair = positions.permute(1, 2, 0)[..., axes]
        theta = per_pair.to(torch.float64) * inv.to(positions.device)
        cos, sin = torch.cos(theta) * attn, torch.sin(theta) * attn
        return cos.to(dtype), sin.to(dtype)

    def _frequencies(self, positions: torch.Tensor, context_len) -> tuple[torch.Tensor, float]:
        """inv_freq (float64) and attention factor for a call: the schedule's own unless it depends on the
        length, then at ``context_len`` or 1 + the largest position on any axis (transformers' rule)."""
        if not self.schedule.length_dependent:
            return self.inv_freq64, self.attention_factor
        inv, attn = self.schedule.at(seq_len=call_context(positions) if context_len is None else context_len)
        return inv, float(attn)

    def tables(self, x, positions=None, offset: int = 0, *, kind="q", context_len=None):
        """cos/sin for x (batch, heads, seq, head_dim) at its (axes, batch, seq) positions (or text positions
        (batch, seq) / (seq,)), shaped to broadcast against x; float64 for float64 x, else float32. Queries
        and keys (``kind``) rotate alike; ``offset`` has no meaning here (a non-zero one is refused)."""
        _no_offset(offset)
        if isinstance(positions, Checked):  # placed by forward, which checked them with q (and k)
            positions = positions.positions
        else:
            _needs_positions(positions)
            self._check("x", x, positions)
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self.cos_sin(positions.to(x.device), dtype, context_len)
        if cos.dim() == 2:
            return cos, sin
        return align_to(cos, sin, x, "positions")

    def place(self, q, k, positions, k_positions, offset, options: dict) -> Placement:
        """Queries at their (axes, batch, q_len) ``positions``, keys at ``k_positions`` (axes, batch, k_len),
        by default the queries' when q and k have one length. ``offset`` (of 1-D RoPE's default positions)
        has no meaning here: a non-zero one is refused."""
        _needs_positions(positions)
        _no_offset(offset)
        self._check("q", q, positions)
        if k_positions is None:
            self._check("k", k, positions, " (keys of another length: give the keys' k_positions=)")
            placed = Checked(positions)
            return Placement(placed, 0, placed, 0, options)
        if self.schedule.length_dependent and options.get("context_len") is None:
            # one schedule for both: a length-dependent one at the keys' length
            context = call_context(_positions(k_positions, len(self.mrope_section)))
            options = {**options, "context_len": context}
        return Placement(Checked(positions), 0, k_positions, 0, options)  # k's, its tables check

    def _check(self, name: str, x, positions, hint: str = "") -> None:
        _checks.tensor_rank(name, x, 2)
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{name} must have last dimension head_dim={self.head_dim}, got shape {tuple(x.shape)}"
            )
        positions = _positions(positions, len(self.mrope_section))
        if positions.shape[-1] != x.shape[-2]:
            raise ValueError(
                f"positions of shape {tuple(positions.shape)} do not match {name}'s seq length {x.shape[-2]}"
                + hint
            )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, mrope_section={list(self.mrope_section)}, base={self.base:g}, "
            f"order={self.order!r}, layout={self.layout!r}"
        )


def _no_offset(offset) -> None:
    if offset:
        raise ValueError(f"offset={offset!r} is not used with MRotaryEmbedding: give k_positions= instead")


def _needs_positions(positions) -> None:
    if positions is None:
        raise ValueError(
            "MRotaryEmbedding needs positions=: (axes, batch, seq) time/height/width ids, or text positions "
            "(batch, seq) / (seq,)"
        )


def _positions(positions, axes: int = 3) -> torch.Tensor:
    if not isinstance(positions, torch.Tensor) or positions.is_complex() or positions.dtype == torch.bool:
        raise ValueError(
            f"positions must be a real tensor of shape ({axes}, batch, seq), (batch, seq) or (seq,), got "
            f"{type(positions).__name__ if not isinstance(positions, torch.Tensor) else positions.dtype}"
        )
    if positions.dim() == 3 and positions.shape[0] != axes:
        raise ValueError(
            f"positions of shape (axes, batch, seq) need {axes} axes (time, height, width, ...: one per "
            f"mrope_section entry), got {tuple(positions.shape)}"
        )
    if positions.dim() not in (1, 2, 3):
        raise ValueError(
            f"positions must have shape ({axes}, batch, seq), (batch, seq) or (seq,), got "
            f"{tuple(positions.shape)}"
        )
    return _checks.position_values(positions)  # values read on the CPU only: no sync


def mrope_positions(
    token_types: torch.Tensor,
    image_grids=None,
    video_grids=None,
    *,
    attention_mask: torch.Tensor | None = None,
    spatial_merge_size: int = 1,
    video_seconds=None,
    tokens_per_second: float | None = None,
    split_video_frames: bool = False,
    document_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """M-RoPE positions of a batch of text and image/video token runs (Qwen2-VL sec. 2.1; Qwen2.5-VL
    report, arxiv.org/abs/2502.13923, sec. 2.1.3 for absolute time).

    Text tokens count up by one on all three axes. A run of vision tokens is one grid of (t, h, w) patches,
    merged spatially by ``spatial_merge_size``: token (i, j, l) of the (t, h/m, w/m) grid sits at
    (s + time(i), s + j, s + l), s the next free position; time(i) = i, or with ``video_seconds`` (seconds
    per temporal grid step, one per video) and ``tokens_per_second`` (Qwen2.5-VL's absolute time)
    int(i * tokens_per_second * seconds). The text after a grid continues at 1 + the largest position so
    far. ``split_video_frames`` (Qwen3-VL, which puts a timestamp between frames): each frame of a video is
    its own grid with t = 1.

    Args:
        token_types: (batch, seq) integers, 0 text, 1 image, 2 video.
        image_grids, video_grids: (n, 3) (t, h, w) of each image / video in patches, in order of appearance
            through the batch.
        attention_mask: (batch, seq), 0 on padding (left or right); padding gets position 0.
        document_ids: (batch, seq) integers, for packed sequences: a change of id starts a document, whose
            positions start again at 0 (grids are still consumed in order; see
            :func:`posenc.packed_positions` for text alone).

    Returns:
        positions (3, batch, seq) long, and rope_deltas (batch, 1): the shift that continues each sequence
        while decoding, position = (number of tokens so far) + delta (see :func:`mrope_decode_positions`).
    """
    types = _token_types(token_types, attention_mask)
    merge = _checks.positive_int("spatial_merge_size", spatial_merge_size)
    queues = _grid_queues(image_grids, video_grids, video_seconds, tokens_per_second, split_video_frames)
    mask = torch.ones_like(types, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    positions = torch.zeros(3, *types.shape, dtype=torch.long)
    deltas = torch.zeros(types.shape[0], 1, dtype=torch.long)
    documents = _document_ids(document_ids, types)
    for b in range(types.shape[0]):
        real = types[b][mask[b].cpu()].tolist()
        seq, last = _packed_sequence_positions(real, documents[b][mask[b].cpu()].tolist(), queues, merge)
        positions[:, b, mask[b].cpu()] = seq
        deltas[b, 0] = (int(last.max()) + 1 if last.numel() else 0) - last.shape[1]
    for kind, name in ((IMAGE, "image_grids"), (VIDEO, "video_grids")):
        if queues[kind]:
            raise ValueError(f"{name} has {len(queues[kind])} grid(s) left over after the last token run")
    return positions.to(token_types.device), deltas.to(token_types.device)


def _grid_queues(image_grids, video_grids, video_seconds, tokens_per_second, split_video_frames) -> dict:
    """{kind: [((t, h, w), time step), ...]} in order of appearance: the grids the token runs consume."""
    grids = {IMAGE: _grids("image_grids", image_grids), VIDEO: _grids("video_grids", video_grids)}
    seconds = [1.0] * len(grids[VIDEO]) if video_seconds is None else [float(s) for s in video_seconds]
    if len(seconds) != len(grids[VIDEO]):
        raise ValueError(f"video_seconds must give one value per video ({len(grids[VIDEO])}), got {seconds}")
    if video_seconds is not None and tokens_per_second is None:
        raise ValueError("video_seconds needs tokens_per_second (Qwen2.5-VL's vision_config value), got None")
    steps = {IMAGE: [1.0] * len(grids[IMAGE]), VIDEO: [(tokens_per_second or 1) * s for s in seconds]}
    if split_video_frames:  # Qwen3-VL: each frame its own grid (t = 1), placed after its timestamp text
        frames = [(g, s) for g, s in zip(grids[VIDEO], steps[VIDEO], strict=True) for _ in range(g[0])]
        grids[VIDEO], steps[VIDEO] = [(1, g[1], g[2]) for g, _ in frames], [s for _, s in frames]
    return {kind: list(zip(grids[kind], steps[kind], strict=True)) for kind in (IMAGE, VIDEO)}


def _document_ids(document_ids, types: torch.Tensor) -> torch.Tensor:
    if document_ids is None:
        return torch.zeros_like(types)
    if (
        not isinstance(document_ids, torch.Tensor)
        or document_ids.shape != types.shape
        or document_ids.dtype.is_floating_point
    ):
        got = tuple(document_ids.shape) if isinstance(document_ids, torch.Tensor) else repr(document_ids)
        raise ValueError(
            f"document_ids must be an integer tensor of token_types' shape {tuple(types.shape)}, got {got}"
        )
    return document_ids.long().cpu()


def _packed_sequence_positions(types: list[int], documents: list[int], queues, merge: int):
    """(3, n) positions of one unpadded row, each document (a run of one id) from 0, and the last
    document's (3, m) (what decoding continues)."""
    parts, i = [], 0
    while i < len(types) or not parts:
        j = next((j for j in range(i, len(types)) if documents[j] != documents[i]), len(types))
        parts.append(_sequence_positions(types[i:j], queues, merge))
        i = j
    return torch.cat(parts, dim=1), parts[-1]


def _sequence_positions(types: list[int], queues, merge: int) -> torch.Tensor:
    """(3, n) positions of one unpadded sequence, consuming grids from ``queues``."""
    parts, start, i = [], 0, 0
    while i < len(types):
        kind = types[i]
        if kind == TEXT:
            n = next((j for j in range(i, len(types)) if types[j] != TEXT), len(types)) - i
            parts.append(torch.arange(start, start + n).expand(3, n))
            start, i = start + n, i + n
            continue
        if not queues[kind]:
            raise ValueError(f"token {i} starts a {('', 'image', 'video')[kind]} run, but no grid is left")
        (t, h, w), step = queues[kind].pop(0)
        if h % merge or w % merge:
            raise ValueError(f"grid (t, h, w) = {(t, h, w)} is not divisible by spatial_merge_size={merge}")
        grid = _grid_positions(t, h // merge, w // merge, step) + start
        if types[i : i + grid.shape[1]] != [kind] * grid.shape[1]:
            raise ValueError(
                f"grid {(t, h, w)} needs {grid.shape[1]} {('', 'image', 'video')[kind]} tokens from token "
                f"{i}, the sequence has fewer"
            )
        parts.append(grid)
        start, i = int(grid.max()) + 1, i + grid.shape[1]
    return torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)


def _grid_positions(t: int, h: int, w: int, step: float) -> torch.Tensor:
    """(3, t*h*w) offsets of a grid's tokens, row-major over (t, h, w); time i at int(i * step)."""
    time = (torch.arange(t, dtype=torch.float64) * step).long()
    tt, hh, ww = torch.meshgrid(time, torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([tt, hh, ww]).reshape(3, -1)


def _token_types(token_types, attention_mask) -> torch.Tensor:
    if not isinstance(token_types, torch.Tensor) or token_types.dim() != 2:
        raise ValueError(f"token_types must be a (batch, seq) tensor of 0/1/2, got {token_types!r}")
    types = token_types.long().cpu()
    if types.numel() and not bool(((types >= TEXT) & (types <= VIDEO)).all()):
        raise ValueError(
            f"token_types must hold 0 (text), 1 (image) or 2 (video), got {types.unique().tolist()}"
        )
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(types.shape):
        raise ValueError(
            f"attention_mask must have token_types' shape {tuple(types.shape)}, got "
            f"{tuple(attention_mask.shape)}"
        )
    return types


def _grids(name: str, grids) -> list[tuple[int, int, int]]:
    if grids is None:
        return []
    rows = grids.tolist() if isinstance(grids, torch.Tensor) else [list(g) for g in grids]
    out = []
    for row in rows:
        if len(row) != 3:
            raise ValueError(f"{name} rows must be (t, h, w), got {row!r}")
        out.append(tuple(_checks.positive_int(f"{name} entries", int(v)) for v in row))
    return out


def mrope_decode_positions(rope_deltas: torch.Tensor, seen, new_tokens: int = 1) -> torch.Tensor:
    """(3, batch, new_tokens) positions of the next text tokens while decoding: ``seen`` (int or (batch,)
    tensor: real tokens so far per sequence, padding not counted) + 0 .. new_tokens-1 + rope_deltas."""
    seen = torch.as_tensor(seen, device=rope_deltas.device).reshape(-1, 1)
    pos = seen + torch.arange(_checks.positive_int("new_tokens", new_tokens), device=rope_deltas.device)
    return (pos + rope_deltas.reshape(-1, 1)).expand(3, -1, -1)
