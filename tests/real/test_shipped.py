"""The models posenc names (posenc.real.shipped): found in their packages without importing them, a model
shipped in parts assembled once and checked against the shipped sha256."""

import hashlib
import importlib.util
from pathlib import Path

import pytest

from posenc.real import shipped
from posenc.real.loader import model_config, model_source


def _fake_packages(monkeypatch, tmp_path, chunks: list[bytes], listed: bytes | None = None) -> None:
    """Gemma's five packages as folders in tmp_path: the parts and a SHA256SUMS (of ``listed``, default the
    parts' concatenation)."""
    model = shipped.SHIPPED["gemma3-270m"]
    found = {}
    for (package, relative), chunk in zip(model.parts, chunks, strict=True):
        path = tmp_path / package / relative
        path.parent.mkdir(parents=True)
        path.write_bytes(chunk)
        found[package] = path.parents[len(Path(relative).parts) - 1]
    package, relative = model.checksum
    digest = hashlib.sha256(b"".join(chunks) if listed is None else listed).hexdigest()
    sums = tmp_path / package / relative
    sums.parent.mkdir(parents=True)
    sums.write_text(f"{digest}  {model.file}\n")
    found[package] = sums.parents[len(Path(relative).parts) - 1]

    class Spec:
        def __init__(self, folder):
            self.submodule_search_locations = [str(folder)]

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: Spec(found[name]) if name in found else real(name, *a)
    )


def test_a_model_in_parts_is_assembled_once_and_checked(monkeypatch, tmp_path):
    chunks = [b"GGUF" + bytes(range(7)), b"two", b"three" * 3, b"4"]
    _fake_packages(monkeypatch, tmp_path / "site", chunks)
    path = shipped.shipped_gguf("gemma3-270m", tmp_path / "cache")
    assert path.read_bytes() == b"".join(chunks) and path.name == "gemma-3-270m-q4_k_m.gguf"
    mtime = path.stat().st_mtime_ns
    assert shipped.shipped_gguf("gemma3-270m", tmp_path / "cache") == path
    assert path.stat().st_mtime_ns == mtime  # not assembled again
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    (path.parent / (path.name + ".parts.json")).write_text("[]")  # the parts installed elsewhere
    assert shipped.shipped_gguf("gemma3-270m", tmp_path / "cache") == path
    assert path.stat().st_mtime_ns == mtime  # the same file is kept: its conversion stays valid


def test_parts_that_do_not_match_the_shipped_sha256_are_refused(monkeypatch, tmp_path):
    _fake_packages(monkeypatch, tmp_path / "site", [b"a", b"b", b"c", b"d"], listed=b"something else")
    with pytest.raises(ValueError, match="its parts concatenate to sha256 .* not the shipped"):
        shipped.shipped_gguf("gemma3-270m", tmp_path / "cache")
    assert not (tmp_path / "cache" / "gemma3-270m" / "gemma-3-270m-q4_k_m.gguf").exists()


def test_a_missing_package_says_what_to_install(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name.startswith("gemma3_") else real(name, *a)
    )
    with pytest.raises(
        ValueError,
        match=r"gemma3-270m needs the .* package, which is not installed: pip install posenc\[gemma\]",
    ):
        shipped.shipped_gguf("gemma3-270m", tmp_path)
    with pytest.raises(
        ValueError, match="'llama' is not a shipped model; shipped: smollm2-135m, gemma3-270m"
    ):
        shipped.shipped_gguf("llama", tmp_path)


def test_names_select_shipped_models_and_paths_stay_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert model_config("gemma3-270m") is None  # a GGUF: its config exists once converted
    (tmp_path / "gemma3-270m").mkdir()  # a folder of that name is the folder, as given
    assert model_source("gemma3-270m") == Path("gemma3-270m")
