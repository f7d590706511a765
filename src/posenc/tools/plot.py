"""``posenc plot ...``: pictures of what the encodings do.

``posenc plot frequencies [--factor 8 --head-dim 128 --base 10000 --original-length 4096 --out FILE.png]``
draws the wavelength 2 pi / omega_k of every dimension pair under each context-extension method at one
factor, on a log scale. Position interpolation lifts the whole spectrum by the factor; NTK-aware scaling
leaves the fastest pair and lifts the slowest by the factor, smoothly in between; YaRN and Llama 3.1 keep
the pairs that turn many times within the original context, interpolate those that turn less than
once, and ramp in between.

``posenc plot plan CONFIG [--out FILE.png]`` draws a model's per-layer position plan
(:func:`posenc.hf.position_plan`): one bar per layer, as high as the keys it attends to (its window, or
the whole context), coloured by its encoding, and each layer type's RoPE wavelength spectrum. CONFIG is
a config.json file or a model id already in the local Hugging Face cache (nothing is downloaded). It
prints one line per layer type.

matplotlib is imported only when a figure is built; figures are plain ``matplotlib.figure.Figure``
objects (no pyplot state, no display needed).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

import posenc
from posenc.cli import guarded
from posenc.runs import figures as runs_figures

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "add_commands",
    "check_image_path",
    "frequency_figure",
    "image_path",
    "load_config",
    "plan_figure",
    "plan_summary",
    "plot_frequencies",
    "save_figure",
    "wavelengths",
]


def _scalings(factor: float, original_length: int) -> dict[str, dict]:
    """The Hugging Face scaling dict of every frequency method of the registry whose schedule does not
    depend on the sequence length (:data:`posenc.extension.METHODS`, with their published defaults), by the
    title the figure gives it (PI's with the factor)."""
    from posenc.extension import METHODS

    static = [m for m in METHODS.values() if m.kind == "frequencies" and not m.length_dependent]
    return {
        "default RoPE": {"rope_type": "default"},
        **{
            f"{m.title} x{factor:g}" if m.rope_type == "linear" else m.title: m.scaling(
                factor, original_length
            )
            for m in static
        },
    }


def wavelengths(
    head_dim: int = 128, base: float = 10000.0, factor: float = 8.0, original_length: int = 4096
) -> dict[str, np.ndarray]:
    """Wavelength (tokens per full turn) of each pair under each method: (head_dim/2,) float64 each.

    Raises ValueError (from :func:`posenc.rope_frequencies`) for a bad head_dim, base or factor.
    """
    waves = {}
    for name, scaling in _scalings(factor, original_length).items():
        inv_freq, _ = posenc.rope_frequencies(
            head_dim, scaling={**scaling, "rope_theta": base}, dtype=torch.float64
        )
        waves[name] = (2 * math.pi / inv_freq).numpy()
    return waves


def frequency_figure(
    head_dim: int = 128, base: float = 10000.0, factor: float = 8.0, original_length: int = 4096
) -> Figure:
    """:func:`wavelengths` on a log scale: one line per method (in its order), then two horizontal lines
    at the original and the extended context length."""
    waves = wavelengths(head_dim, base, factor, original_length)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=120)
    ax = fig.subplots()
    pairs = np.arange(head_dim // 2)
    for (name, w), style in zip(waves.items(), ["-", "--", "-.", "-", ":"], strict=True):
        ax.plot(pairs, w, style, label=name, linewidth=2 if name in ("YaRN", "Llama 3.1") else 1.5)
    for length, style, what in (
        (original_length, "-", "original"),
        (original_length * factor, "--", "extended"),
    ):
        ax.axhline(length, color="grey", linewidth=0.8, linestyle=style)
        ax.text(0, length * 1.15, f"{what} context {int(length):,}", color="grey", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("dimension pair k (fast to slow)")
    ax.set_ylabel("wavelength 2\u03c0/\u03c9\u2096 (tokens)")
    ax.set_title(f"RoPE wavelengths at factor {factor:g} (head_dim {head_dim}, base {base:g})")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def image_path(path: str | Path) -> Path:
    """The file a figure saved at ``path`` lands in: matplotlib appends ``.png`` to a name without a suffix
    (``plan`` is written as ``plan.png``), so that is the name reported; an existing folder is kept as
    given, for :func:`check_image_path` to refuse."""
    path = Path(path)
    return path if path.suffix or path.is_dir() else path.with_name(path.name + ".png")


def check_image_path(flag: str, path: str | Path) -> Path:
    """:func:`image_path` of ``path`` when a figure can be written there in a format matplotlib knows (from
    the suffix); else a ValueError naming ``flag``. Checked before any work; needs matplotlib."""
    from posenc.cli import check_matplotlib, check_output_file

    out = image_path(path)
    check_output_file(flag, out)
    check_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if out.suffix[1:].lower() not in formats:
        raise ValueError(
            f"{flag} {str(path)!r}: matplotlib cannot write {out.suffix!r} images; give a name ending in one "
            f"of {', '.join('.' + f for f in sorted(formats))} (a name without a suffix gets .png)"
        )
    return out


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix, ``.png`` appended to a name without one),
    creating its folder, atomically (:func:`posenc.runs.figures.save_figure`); returns the path of the file
    written."""
    return runs_figures.save_figure(fig, image_path(path))


def plot_frequencies(
    out: str | Path = "frequencies.png",
    head_dim: int = 128,
    base: float = 10000.0,
    factor: float = 8.0,
    original_length: int = 4096,
) -> Path:
    """Draw :func:`frequency_figure` to a PNG file and return its path."""
    return save_figure(frequency_figure(head_dim, base, factor, original_length), out)


@guarded("plot frequencies")
def _frequencies_command(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.factor) and args.factor >= 1):
        raise ValueError(f"--factor must be a finite number >= 1, got {args.factor!r}")
    if not args.base > 1:  # also NaN
        raise ValueError(
            f"--base {args.base!r} must be > 1: the frequencies base^(-2k/d) must fall from pair to "
            f"pair (YaRN's and Llama 3.1's ramps divide by log(base))"
        )
    wavelengths(args.head_dim, args.base, args.factor, args.original_length)  # refuses an odd head_dim
    out = check_image_path("--out", args.out)
    print(plot_frequencies(out, args.head_dim, args.base, args.factor, args.original_length))
    return 0


def load_config(spec: str) -> dict:
    """A config.json as a dict: ``spec`` is a path to the file (or to a folder holding it) or a model id
    in the local Hugging Face cache (``HF_HUB_CACHE`` or the default folder); never downloads."""
    import json
    import os

    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"folder {spec!r} holds no config.json")
        path = path / "config.json"
    elif not path.exists() and (  # a path, not a model id ("org/name")
        path.is_absolute()
        or spec.startswith((".", "~"))
        or path.suffix
        or path.parent.is_dir()
        and path.parent != Path(".")
    ):
        raise ValueError(f"{spec!r} does not exist; give a config.json file or a model id")
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError as err:
            raise ValueError(f"{spec!r} is not a file, and model ids need huggingface_hub installed") from err
        cached = try_to_load_from_cache(spec, "config.json", cache_dir=os.environ.get("HF_HUB_CACHE"))
        if not isinstance(cached, str):
            raise ValueError(
                f"config {spec!r} is neither a config.json file nor a model in the local Hugging Face cache "
                "(posenc never downloads: fetch it first, or give the path to its config.json)"
            )
        path = Path(cached)
    try:
        raw = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"config {str(path)!r} cannot be read: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise ValueError(f"config {str(path)!r} is not text: {err}") from err
    except json.JSONDecodeError as err:
        raise ValueError(f"config {str(path)!r} is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise ValueError(f"config {str(path)!r} holds a JSON {type(raw).__name__}, not a config object")
    return raw


def _layer_types(plan) -> dict[str, list[int]]:
    """Layers grouped by what they do: description (the plan entry without its index) -> layer indices."""
    groups: dict[str, list[int]] = {}
    for lp in plan:
        groups.setdefault(repr(lp).split(": ", 1)[1], []).append(lp.layer)
    return groups


def plan_summary(plan) -> list[str]:
    """One line per layer type: its layers and what they do."""
    lines = []
    for what, layers in _layer_types(plan).items():
        shown = ",".join(map(str, layers)) if len(layers) <= 12 else f"{layers[0]}..{layers[-1]}"
        lines.append(f"{len(layers):3d} layer(s) [{shown}]: {what}")
    return lines


def _wavelengths_of(rope) -> np.ndarray:
    """2 pi / omega_k of a plan's Rope, inf for pairs that do not turn (NoPE fraction of p-RoPE)."""
    module = rope.module()
    inv = module.inv_freq64 if hasattr(module, "inv_freq64") else module.frequencies()[0]
    inv = inv.numpy()
    with np.errstate(divide="ignore"):
        return np.where(inv > 0, 2 * math.pi / inv, np.inf)


def plan_figure(plan, title: str = "", context: int | None = None) -> Figure:
    """Two axes: (1) one bar per layer, height = the keys a query sees (its window or chunk, else
    ``context``), colour = its encoding (legend: each distinct encoding); (2) one line per distinct RoPE:
    wavelength of each pair, log scale (pairs that do not turn are left out)."""
    from matplotlib.figure import Figure

    encodings = list(dict.fromkeys(repr(lp.rope) if lp.rope else "NoPE" for lp in plan))
    context = context or max([lp.window or 0 for lp in plan] + [1]) * 4
    fig = Figure(figsize=(9, 7), dpi=110)
    top, bottom = fig.subplots(2, 1)
    colours = {e: f"C{i}" for i, e in enumerate(encodings)}
    for name in encodings:
        layers = [lp for lp in plan if (repr(lp.rope) if lp.rope else "NoPE") == name]
        top.bar(
            [lp.layer for lp in layers],
            [lp.window or context for lp in layers],
            color=colours[name],
            label=name,
            hatch=["//" if lp.attention == "chunked" else "" for lp in layers],
        )
    top.set_yscale("log")
    top.set_xlabel("layer")
    top.set_ylabel("keys seen (window, chunk or context)")
    top.set_title(f"{title}: encoding and attention span per layer".lstrip(": "))
    top.legend(fontsize=7, loc="upper left")
    ropes = list(dict.fromkeys(lp.rope for lp in plan if lp.rope is not None))
    for rope in ropes:
        waves = _wavelengths_of(rope)
        bottom.plot(
            np.arange(len(waves)),
            np.where(np.isfinite(waves), waves, np.nan),
            color=colours[repr(rope)],
            label=repr(rope),
        )
    bottom.set_yscale("log")
    bottom.set_xlabel("dimension pair k (fast to slow)")
    bottom.set_ylabel("wavelength 2\u03c0/\u03c9\u2096 (tokens)")
    bottom.set_title("RoPE wavelength spectrum of each layer type")
    if ropes:
        bottom.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


@guarded("plot plan")
def _plan_command(args: argparse.Namespace) -> int:
    from posenc.hf import position_plan, text_config

    out = check_image_path("--out", args.out)
    try:
        raw = load_config(args.config)
        plan = position_plan(raw)
        text = text_config(raw)
    except ValueError as err:  # the positional argument named, as argparse names an option
        raise ValueError(f"CONFIG: {err}") from None
    title = f"{args.config} ({text.get('model_type', '?')}, {len(plan)} layers)"
    fig = plan_figure(plan, title, text.get("max_position_embeddings"))
    for line in plan_summary(plan):
        print(line)
    print(save_figure(fig, out))
    return 0


def add_commands(subparsers) -> None:
    """Add ``posenc plot`` and its kinds (``frequencies``)."""
    from posenc.cli import positive_int

    plot = subparsers.add_parser("plot", help="draw pictures of positional encodings")
    kinds = plot.add_subparsers(dest="plot", metavar="WHAT")
    plot.set_defaults(func=lambda args: (plot.print_help(), 2)[1])
    freq = kinds.add_parser(
        "frequencies",
        help="wavelength of each RoPE dimension pair under default, PI, NTK, YaRN and Llama 3.1 scaling",
        description=__doc__.split("\n\n")[1],
    )
    freq.add_argument("--factor", type=float, default=8.0, help="context extension factor (default 8)")
    freq.add_argument("--head-dim", type=positive_int, default=128, help="head dimension (default 128)")
    freq.add_argument("--base", type=float, default=10000.0, help="RoPE base, rope_theta (default 10000)")
    freq.add_argument(
        "--original-length",
        type=positive_int,
        default=4096,
        help="pretraining context length (default 4096)",
    )
    freq.add_argument(
        "--out",
        default="frequencies.png",
        help="output image file; .png is appended to a name without a suffix (default frequencies.png)",
    )
    freq.set_defaults(func=_frequencies_command)
    plan = kinds.add_parser(
        "plan",
        help="a model's per-layer position plan: encoding and window per layer, RoPE spectra",
        description=__doc__.split("\n\n")[2],
    )
    plan.add_argument("config", help="config.json path, or a model id in the local Hugging Face cache")
    plan.add_argument("--out", default="plan.png", help="output PNG file (default plan.png)")
    plan.set_defaults(func=_plan_command)
