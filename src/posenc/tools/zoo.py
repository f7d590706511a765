"""posenc across the transformers zoo: every registered model type whose code has a rotary module, built
tiny from its own config class (with the config options that switch its rotary embedding on),
patched with :func:`posenc.hf.patch_model` and classified.

A model is checked as a user would run it, with transformers' own rotary modules made to hand out wrong
cos/sin (so that a silent fallback to them shows): logits at positions 0..11, again 12 tokens starting
near position 3000 (or the end of a shorter ``max_position_embeddings``), and the last two tokens decoded
one at a time from a cache, against the unpatched model.
Each model type gets one :class:`ZooResult`:

- ``exact``: equal to float32 rounding: within 1e-5 of the logits' scale, or, where sharp attention
  amplifies rounding, within 1e-4 of what wrong cos/sin (a 10% change) move them by at positions 0..11,
  and near 3000 within 5e-3 of that or of the logits' scale: a 5e-4 change of cos/sin, about twice what
  transformers' float32 angles are off there (their ulp is 2.4e-4 rad, and float32 inverse frequencies
  add up to 3000 x 6e-8 rad); a wrong schedule moves them by a fair share of what wrong cos/sin do;
- ``exact, positions unseen``: equal, but its tiny model's outputs barely depend on positions, so the
  check could not tell a wrong schedule (the gap is under 10x the tolerance);
- ``refused``: ``patch_model`` raised ValueError before patching anything;
- ``no rotary module``, ``not built tiny``, ``does not run tiny`` (a vision or audio encoder, whose
  forward takes no token ids, or a tiny config the model's code cannot run unpatched): not checked, with
  the reason;
- the failures, which must never occur: ``silently wrong``, ``accepted then crashed`` (patched, then the
  forward raised), ``crashed when patched`` (an error other than ValueError).

Where the model patches exactly, it is patched again with ``remap=`` (SelfExtend in groups of one: every
distance as it is, through the remap kernels) and classified the same way (``ZooResult.remap``).
``posenc zoo --scaling`` runs the sweep under each of :func:`scalings` instead.

``posenc zoo`` runs the sweep and writes its table into docs/models.md; ``tests/tools/test_zoo.py`` runs it
for every model type and fails on any failure or on a table row that says otherwise.
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys
import types
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from posenc.hf.replica import decoded, output_of
from posenc.hf.source import modeling_source
from posenc.hf.tiny import MAX_PARAMETERS, shrunk

__all__ = [
    "FAILURES",
    "ROTARY_ON",
    "ZooResult",
    "check",
    "markdown",
    "rope_model_types",
    "sweep",
    "tiny_config",
]

FAILURES = ("silently wrong", "accepted then crashed", "crashed when patched")
LENGTH = 12
FAR = 3000


@dataclass(frozen=True)
class ZooResult:
    """One model type's outcome. ``prefill``, ``far`` and ``decode``: max |Δlogits| against the unpatched
    model at positions 0.., near 3000 and in cached decoding of the last two tokens (None for a model
    without a cache); ``shows``: how far wrong cos/sin move the unpatched model's logits;
    ``scale``: the largest |logit|. ``remap``: the outcome of ``patch_model(model, remap=)`` with a remap
    that moves no distance (checked where the model patches exactly), and ``remap_detail`` its reason."""

    model_type: str
    status: str
    detail: str = ""
    prefill: float | None = None
    far: float | None = None
    decode: float | None = None
    shows: float | None = None
    scale: float | None = None
    remap: str = ""
    remap_detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status in FAILURES or self.remap in FAILURES


def rope_model_types() -> list[str]:
    """The model types transformers registers a model class for whose modeling code has a
    ``*RotaryEmbedding``, sorted."""
    from transformers.models.auto import modeling_auto

    registered = set(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(modeling_auto.MODEL_MAPPING_NAMES)
    return sorted(t for t in registered if "RotaryEmbedding" in modeling_source(t))


# The config options that switch a family's rotary embedding on where its default is another encoding (or
# none), with what the rotary variant's released checkpoints set for it to run tiny (attention layers among
# the six kept, the token ids its code reads): the zoo checks the rotary variant, what patch_model is given
ROTARY_ON = {
    # ESM-2 (ESM-1b's absolute positions are the config's default); its embeddings read the mask token
    "esm": {"position_embedding_type": "rotary", "mask_token_id": 32, "pad_token_id": 1},
    # Granite 4.0-H: its config defaults to NoPE and to Mamba layers only
    "granitemoehybrid": {
        "position_embedding_type": "rope",
        "layer_types": ["linear_attention", "full_attention"] * 3,
    },
    # Zamba2: RoPE in the shared attention blocks, which the default puts from layer 6 on
    "zamba2": {"use_mem_rope": True, "layers_block_type": ["linear_attention", "hybrid"] * 3},
}


def tiny_config(model_type: str):
    """The config of ``model_type`` with every size made small and its rotary embedding switched on
    (:data:`ROTARY_ON`); defaults for everything else."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    return cls(**shrunk(cls().to_dict()) | ROTARY_ON.get(model_type, {}))


def _model_class(model_type: str):
    """The causal LM class of ``model_type``, or its base model where there is none or where the causal LM
    class takes another config (a composite's text-only class, Qwen3.5's)."""
    import transformers
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    def named(mapping):
        name = mapping.get(model_type)
        return getattr(transformers, name[0] if isinstance(name, tuple | list) else name) if name else None

    causal = named(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if causal is not None and issubclass(CONFIG_MAPPING[model_type], causal.config_class):
        return causal
    return named(modeling_auto.MODEL_MAPPING_NAMES) or causal


def _rotary_modules(model) -> list:
    return [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]


def _moved(out):
    """Wrong cos/sin (or whatever a rotary module hands out), of the same shapes and dtypes."""
    if isinstance(out, torch.Tensor):
        return out * 0.9 + 0.05 if out.is_floating_point() or out.is_complex() else out
    if isinstance(out, tuple):
        return tuple(_moved(o) for o in out)
    return out


def _sabotage(model) -> None:
    """Make every rotary module posenc did not patch hand out wrong cos/sin."""
    for module in _rotary_modules(model):
        if "forward" not in module.__dict__:
            own = type(module).forward
            module.forward = types.MethodType(lambda self, *a, _f=own, **k: _moved(_f(self, *a, **k)), module)


def _restore(model) -> None:
    for module in _rotary_modules(model):
        if "forward" in module.__dict__ and not hasattr(module, "posenc_rotary"):
            del module.forward


def _axis_positions(length: int) -> torch.Tensor:
    """(3, 1, length) M-RoPE position ids whose three axes differ, as an image grid's do."""
    p = torch.arange(length)[None]
    return torch.stack((p, p // 2 + 1, p % 3 + 2))


def _logits(model, ids, offset) -> torch.Tensor:
    """Logits (or the last hidden state) at positions offset.. (an int), or at given position ids."""
    if isinstance(offset, torch.Tensor):
        kwargs = {"position_ids": offset}
    else:
        kwargs = {"position_ids": torch.arange(offset, offset + ids.shape[1])[None]} if offset else {}
    with torch.no_grad():
        return output_of(model(input_ids=ids, use_cache=False, **kwargs))


def _decoded(model, ids) -> torch.Tensor | None:
    """Logits of the last two tokens decoded one at a time after a cached prefill of the others; None for
    a model without a cache, or one whose cache needs more than token ids (an encoder)."""
    try:
        return decoded(model, ids)
    except Exception:
        return None


def _largest(diffs) -> float:
    return max(d.abs().max().item() for d in diffs)


def _short(error: BaseException, limit: int = 160) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:limit] if not isinstance(error, ValueError) else text[:limit]


def scaled(config, scaling: dict):
    """``config`` with ``scaling`` (a rope_type and its keys) over its RoPE parameters, per layer type too;
    ``original_max_position_embeddings`` where a method takes it is the config's max_position_embeddings."""
    values = config.to_dict()
    where = values if isinstance(values.get("rope_parameters"), dict) else values.get("text_config") or {}
    params = where.get("rope_parameters")
    if not isinstance(params, dict):
        raise ValueError("no rope_parameters")
    scaling = dict(scaling)
    if scaling.get("original_max_position_embeddings") == "max_position_embeddings":
        scaling["original_max_position_embeddings"] = where.get("max_position_embeddings")
    keep = ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")
    nested = all(isinstance(v, dict) for v in params.values())
    layers = params.items() if nested else [(None, params)]
    new = {key: {**{k: v for k, v in p.items() if k in keep}, **scaling} for key, p in layers}
    where["rope_parameters"] = new if nested else new[None]
    return type(config)(**values)


def check(model_type: str, scaling: dict | None = None) -> ZooResult:
    """Build ``model_type`` tiny (with ``scaling`` over its RoPE parameters, see :func:`scaled`), patch it
    and classify it (see the module docstring)."""
    from posenc.hf import patch_model

    built = _build(model_type, scaling)
    if isinstance(built, ZooResult):
        return built
    config, model = built
    if not _rotary_modules(model):
        return ZooResult(model_type, "no rotary module")
    ids = torch.randint(3, 100, (1, LENGTH), generator=torch.Generator().manual_seed(0))
    try:
        offsets, want = _unpatched(model, config, ids)
    except Exception as e:
        return ZooResult(model_type, "does not run tiny", _short(e))
    want_decoded = _decoded(model, ids)
    _sabotage(model)
    try:
        shows = _largest(_logits(model, ids, o) - w for o, w in zip(offsets, want, strict=True))
    except Exception:
        shows = float("inf")  # wrong cos/sin break it outright: positions certainly show
    _restore(model)
    try:
        patch_model(model)
    except ValueError as e:
        return ZooResult(model_type, "refused", _short(e))
    except Exception as e:
        return ZooResult(model_type, "crashed when patched", _short(e))
    _sabotage(model)
    try:
        got = [_logits(model, ids, o) for o in offsets]
        got_decoded = _decoded(model, ids) if want_decoded is not None else None
        if want_decoded is not None and got_decoded is None:
            raise RuntimeError("cached decoding failed once patched")
    except Exception as e:
        return ZooResult(model_type, "accepted then crashed", _short(e))
    return _classify(model_type, model, ids, (got, got_decoded), (want, want_decoded), shows)


def _build(model_type: str, scaling: dict | None):
    """(config, model) of ``model_type`` built tiny with seed 0, or the ZooResult saying why not."""
    try:
        config = tiny_config(model_type)
        if scaling is not None:
            config = scaled(config, scaling)
        with torch.device("meta"):
            size = sum(p.numel() for p in _model_class(model_type)(config).parameters())
        if size > MAX_PARAMETERS:
            return ZooResult(model_type, "not built tiny", f"{size / 1e6:.0f}M parameters after shrinking")
        torch.manual_seed(0)
        return config, _unzeroed(_model_class(model_type)(config).eval())
    except Exception as e:  # transformers' own validation of a config it was not made for
        return ZooResult(model_type, "not built tiny", _short(e))


def _unzeroed(model):
    """``model`` with its zero-initialised weight matrices drawn at random (N(0, 0.02^2), seeded): an
    output projection that starts at zero (NeoMME's) would hide what attention does with positions."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and p.is_floating_point() and not p.any():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    return model


def _unpatched(model, config, ids) -> tuple[tuple, list]:
    """The positions checked (offset 0, a far offset, and three differing M-RoPE axes where the model takes
    them) and the model's own logits at each."""
    from posenc.hf.handout import takes_axis_positions

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    far = max(0, min(FAR, (getattr(text, "max_position_embeddings", None) or 2 * FAR) - 2 * LENGTH))
    offsets = (0, far)
    want = [_logits(model, ids, o) for o in offsets]
    if any(takes_axis_positions(m) for m in _rotary_modules(model)):
        try:  # M-RoPE: three axes that differ, where a wrong section layout shows
            want.append(_logits(model, ids, _axis_positions(LENGTH)))
            offsets = (*offsets, _axis_positions(LENGTH))
        except Exception:  # its model builds the axes itself
            pass
    return offsets, want


def _classify(model_type: str, model, ids, patched, unpatched, shows: float) -> ZooResult:
    """Exact, exact with positions unseen, or silently wrong, from the patched and unpatched logits
    (each ``(per offset, decoded)``); for the exact, the remap column too."""
    (got, got_decoded), (want, want_decoded) = patched, unpatched
    prefill, far_diff, *axes = (_largest([g - w]) for g, w in zip(got, want, strict=True))
    prefill = max([prefill, *axes])
    decode = None if got_decoded is None else _largest([got_decoded - want_decoded])
    scale = _largest(want)
    numbers = dict(prefill=prefill, far=far_diff, decode=decode, shows=shows, scale=scale)
    tol = 1e-5 * scale + 1e-7
    # float32 rounding, amplified by sharp attention: a wrong schedule moves the logits by a fair share of
    # what a 10% change of cos/sin does (``shows``); near 3000 transformers' float32 angles are ~2e-4 rad
    # off, and the sharpest tiny models (Gemma 4's) turn that into 2e-3 of it
    near = max(prefill, decode or 0.0)
    moved = shows if math.isfinite(shows) else 0.0  # wrong cos/sin that broke the model size no allowance
    if near > max(tol, 1e-4 * moved) or far_diff > max(tol, 5e-3 * max(scale, moved)):
        return ZooResult(model_type, "silently wrong", "", **numbers)
    remap, remap_detail = _remap_outcome(model, ids, want[0], want_decoded, max(tol, 1e-4 * moved))
    status = "exact, positions unseen" if shows < 10 * tol else "exact"
    return ZooResult(model_type, status, "", **numbers, remap=remap, remap_detail=remap_detail)


def _remap_outcome(model, ids, want, want_decoded, tol: float) -> tuple[str, str]:
    """``patch_model(model, remap=)`` with SelfExtend in groups of one (every distance as it is, through
    two views) against the unpatched logits and cached decoding: exact, refused, or a failure."""
    from posenc.hf import patch_model, unpatch_model
    from posenc.remap import SelfExtend

    unpatch_model(model)
    _sabotage(model)  # a rotary module the remap path left alone would show
    try:
        try:
            patch_model(model, remap=SelfExtend(1, 1 << 20))
        except ValueError as e:
            return "refused", _short(e)
        except Exception as e:
            return "crashed when patched", _short(e)
        try:
            got = _logits(model, ids, 0)
            got_decoded = _decoded(model, ids) if want_decoded is not None else None
            if want_decoded is not None and got_decoded is None:
                raise RuntimeError("cached decoding failed once patched")
        except Exception as e:
            return "accepted then crashed", _short(e)
        gap = _largest([got - want] + ([] if got_decoded is None else [got_decoded - want_decoded]))
        return ("exact", "") if gap <= tol else ("silently wrong", f"logits moved by {gap:.2g}")
    finally:
        unpatch_model(model)
        _restore(model)


@functools.cache
def scalings() -> dict[str, dict]:
    """The scaling variants ``posenc zoo --scaling`` checks every type under (:func:`scaled`): every frequency
    method of the registry (:data:`posenc.extension.METHODS`) that transformers implements too, by its
    rope_type, at factor 4; the trained length a method takes is each config's max_position_embeddings."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from posenc.extension import METHODS

    return {
        m.rope_type: m.scaling(4.0, "max_position_embeddings")
        for m in METHODS.values()
        if m.kind == "frequencies" and m.rope_type in ROPE_INIT_FUNCTIONS
    }


def sweep(model_types=None, progress=None, scaling: dict | None = None) -> list[ZooResult]:
    """:func:`check` of each of ``model_types`` (default :func:`rope_model_types`), with ``scaling`` over
    their RoPE parameters if given; ``progress`` is called with each result."""
    import transformers

    verbosity, threads = transformers.logging.get_verbosity(), torch.get_num_threads()
    transformers.logging.set_verbosity_error()  # tiny configs make transformers warn about each of them
    torch.set_num_threads(1)  # tiny models gain nothing from more, and one thread rounds the same anywhere
    try:
        results = []
        for model_type in model_types or rope_model_types():
            results.append(check(model_type, scaling))
            if progress is not None:
                progress(results[-1])
        return results
    finally:
        transformers.logging.set_verbosity(verbosity)
        torch.set_num_threads(threads)


BEGIN, END = "<!-- posenc zoo: begin -->", "<!-- posenc zoo: end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_row(result: ZooResult) -> str:
    """The docs table's row of one result (the numbers stay out: they move with the machine's rounding)."""
    return f"| {result.model_type} | {result.status} | {_cell(result.detail)} | {result.remap} |"


def _tally(labels) -> str:
    """ "label n, ..." for each label, the most frequent first."""
    return ", ".join(f"{label} {n}" for label, n in Counter(labels).most_common())


def markdown(results: list[ZooResult]) -> str:
    """The counts and the table of a sweep, between the markers docs/models.md keeps them in."""
    summary = _tally(r.status for r in results)
    remap_summary = _tally(r.remap for r in results if r.remap)
    lines = [
        BEGIN,
        f"{len(results)} model types with a rotary module in transformers {_transformers_version()}: "
        f"{summary}. With `remap=`, of those that patch exactly: {remap_summary}.",
        "",
        "| model type | status | why | remap= |",
        "|---|---|---|---|",
        *(table_row(r) for r in results),
        END,
    ]
    return "\n".join(lines)


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _docs_text(path: Path, flag: str = "--docs") -> str:
    """The text of the markdown file ``path`` whose table the sweep rewrites; a ValueError naming ``flag``
    and the path unless it is a readable, writable file with both markers."""
    if not path.is_file():
        kind = "a directory" if path.is_dir() else "not an existing file"
        raise ValueError(f"{flag} {str(path)!r} is {kind}; expected a markdown file with the zoo's markers")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{flag} {str(path)!r} cannot be read: {e}") from None
    if BEGIN not in text or END not in text:
        raise ValueError(f"{flag} {str(path)!r} has no {BEGIN} ... {END} markers to put the table between")
    if not os.access(path, os.W_OK):
        raise ValueError(f"{flag} {str(path)!r} is not writable")
    return text


def write_docs(path: Path, results: list[ZooResult]) -> None:
    """Replace the table between the markers in ``path`` with this sweep's."""
    text = _docs_text(path)
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    path.write_text(pattern.sub(lambda _: markdown(results), text))


def _chosen_types(text: str | None) -> list[str] | None:
    """The model types ``--types`` names (None: every one with a rotary module); a ValueError naming an
    unknown one, with the closest registered names."""
    import difflib

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if text is None:
        return None
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    if not chosen:
        raise ValueError(f"--types {text!r} names no model type")
    twice = sorted({t for t in chosen if chosen.count(t) > 1})
    if twice:  # the sweep would check each twice
        raise ValueError(f"--types {text!r} names {', '.join(twice)} more than once; give each once")
    known = list(CONFIG_MAPPING.keys())
    for name in chosen:
        if name not in CONFIG_MAPPING:
            close = difflib.get_close_matches(name, rope_model_types(), n=3) or difflib.get_close_matches(
                name, known, n=3
            )
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"--types: {name!r} is not a model type transformers registers{hint}")
    return chosen


def _command(args) -> int:
    import json

    from posenc.cli import check_output_file

    # every argument checked before the sweep, which takes minutes
    chosen = _chosen_types(args.types)
    if args.json:
        check_output_file("--json", args.json)
    if args.docs:
        _docs_text(Path(args.docs))
    width = max(map(len, chosen or rope_model_types()))

    def show(r: ZooResult) -> None:
        said = r.detail[:100]
        if r.far is not None:
            decode = "" if r.decode is None else f", decode {r.decode:.1e}"
            said = f"prefill {r.prefill:.1e}, far {r.far:.1e}{decode}, wrong cos/sin {r.shows:.1e}"
            said += f"; remap= {r.remap}" + (f" ({r.remap_detail[:80]})" if r.remap_detail else "")
        print(f"{r.model_type:<{width}}  {r.status:<26} {said}", flush=True)

    if args.scaling:
        return _scaling_command(chosen, args.quiet, width)
    results = sweep(chosen, progress=None if args.quiet else show)
    if args.json:
        out = check_output_file("--json", args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps([asdict(r) for r in results], indent=1))
    if args.docs:
        write_docs(Path(args.docs), results)
    failed = [r.model_type for r in results if r.failed]
    print(markdown(results).splitlines()[1])
    if failed:
        print(f"failures: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _scaling_command(chosen, quiet: bool, width: int) -> int:
    """``posenc zoo --scaling``: every type under each of :func:`scalings`; the counts, and each failure."""
    failed = []
    for name, scaling in scalings().items():
        results = sweep(chosen, scaling=scaling)
        for r in results:
            if r.failed:
                failed.append(f"{r.model_type}/{name}")
                print(f"{r.model_type:<{width}}  {name}: {r.status}, remap= {r.remap} {r.remap_detail}")
            elif not quiet and r.status == "refused":
                print(f"{r.model_type:<{width}}  {name}: refused: {r.detail[:100]}")
        summary = _tally(r.status + (f" (remap= {r.remap})" if r.remap else "") for r in results)
        print(f"{name}: {summary}", flush=True)
    if failed:
        print(f"failures: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def add_commands(subparsers) -> None:
    """Add ``posenc zoo``."""
    from posenc.cli import HelpFormatter, guarded

    zoo = subparsers.add_parser(
        "zoo",
        help="patch a tiny model of every RoPE family transformers registers and classify each",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
    )
    zoo.add_argument("--types", help="comma-separated model types (default: every one with a rotary module)")
    zoo.add_argument("--docs", help="a markdown file whose zoo table to rewrite, e.g. docs/models.md")
    zoo.add_argument("--json", help="write every result, with its numbers, to this JSON file")
    zoo.add_argument("--quiet", action="store_true", help="print only the counts")
    zoo.add_argument(
        "--scaling",
        action="store_true",
        help="check every type under linear, dynamic, yarn and llama3 scaling instead (counts per method)",
    )
    zoo.set_defaults(func=guarded("zoo")(_command))
