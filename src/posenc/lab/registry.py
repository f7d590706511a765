"""The laboratory's scheme registry: one :class:`Scheme` entry per positional scheme, owning every fact about
it; :mod:`posenc.lab.encodings` and :mod:`posenc.lab.layered` fill it with the built-in schemes.

A scheme's builder is ``build(cfg, **options) -> Encoding``; the options (``register_encoding(...,
options={"window": int})``) are what a per-layer plan (:mod:`posenc.lab.layers`) may set for one layer of
that kind (``--layers "local:16,rope:base=1e6"``), each a keyword of the builder with its default there.
A researcher's scheme needs no edit here: ``--schemes package.module:function`` (or
``path/to/file.py:function``) imports ``function(cfg) -> Encoding`` on first use (:func:`lookup`), and a
name that spells its own definition (``plan:rope/rope/nope``, :mod:`posenc.lab.layered`) is made by the
maker registered for its prefix (:data:`SPELLED`).

This module imports nothing of the laboratory above :mod:`posenc.lab.extensions`, so
:mod:`posenc.lab.config` can check an encoding name against :data:`ENCODINGS` without an import cycle.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from posenc.extension import MethodNames
from posenc.lab.encoding import Encoding
from posenc.lab.errors import LabError
from posenc.lab.extensions import EXTENSIONS

__all__ = [
    "ENCODINGS",
    "ModelShape",
    "SPELLED",
    "Scheme",
    "extensions_for",
    "lookup",
    "model_extensions",
    "register_encoding",
    "registered_names",
    "schemes_with",
]


class ModelShape(Protocol):
    """What a scheme's builder reads of the :class:`posenc.lab.config.GPTConfig` it gets (which this module
    does not import: config imports this one to check encoding names): the encoding's name and the shape."""

    encoding: str
    n_head: int
    d_model: int
    max_len: int
    rope_base: float

    @property
    def head_dim(self) -> int: ...


@dataclass(frozen=True)
class Scheme:
    """One registry entry: everything the laboratory knows about a positional scheme.

    name: what ``--schemes`` and ``GPTConfig.encoding`` call it.
    build: ``build(cfg) -> Encoding``.
    extensions: the eval-time extensions (names of :data:`posenc.lab.extensions.EXTENSIONS`) that apply.
    pairs: the size the scheme pairs dimensions of, which must then be even: "head_dim" (rotations pair
        the dimensions of a head), "d_model" (the sinusoidal table those of the model), or None.
    recipes: the extensions by training (:data:`posenc.lab.recipes.RECIPES`) that apply; a scheme with
        recipes reads ``cfg.rope_scaling`` and ``cfg.pose_len``.
    options: what one layer of this kind may set in a per-layer plan, each a keyword argument of ``build``
        and the type its text is read as, in order: a bare value in a plan (``local:16``) is the first.
    """

    name: str
    build: Callable[..., Encoding]
    extensions: Sequence[str] = ()
    pairs: str | None = None
    recipes: tuple[str, ...] = ()
    options: Mapping[str, type] = field(default_factory=dict)

    def __call__(self, cfg: ModelShape, **options) -> Encoding:
        unknown = [k for k in options if k not in self.options]
        if unknown:
            allowed = ", ".join(self.options) or "none"
            raise LabError(f"encoding={self.name!r} takes no option {unknown[0]!r}; allowed: {allowed}")
        return self.build(cfg, **options)

    def check(self, cfg: ModelShape) -> None:
        """Refuse a config whose paired size is odd, naming the scheme and the sizes."""
        if self.pairs == "head_dim" and cfg.head_dim % 2:
            raise LabError(
                f"encoding={self.name!r} needs an even head size: d_model={cfg.d_model} / "
                f"n_head={cfg.n_head} = {cfg.head_dim} (rotary encodings rotate pairs of dimensions within "
                f"each head)"
            )
        if self.pairs == "d_model" and cfg.d_model % 2:
            raise LabError(
                f"encoding={self.name!r} needs an even d_model, got {cfg.d_model} (each frequency fills "
                f"a sin and a cos dimension)"
            )
        changed = [k for k in ("rope_scaling", "pose_len") if getattr(cfg, k, None) is not None]
        if changed and not self.recipes:
            raise LabError(
                f"{', '.join(changed)} set for encoding={self.name!r}, which takes no extension recipe "
                f"(those with recipes: {', '.join(n for n, s in ENCODINGS.items() if s.recipes)})"
            )


ENCODINGS: dict[str, Scheme] = {}
# prefix -> make(name) -> Scheme, for scheme names that spell their own definition; filled by the modules
# that define them (posenc.lab.layered's "plan:"), which this one cannot import
SPELLED: dict[str, Callable[[str], Scheme]] = {}


def register_encoding(
    name: str,
    *,
    extensions: tuple[str, ...] = (),
    pairs: str | None = None,
    recipes: tuple[str, ...] = (),
    options: Mapping[str, type] | None = None,
):
    """Decorator adding ``fn(cfg, **options) -> Encoding`` to the registry as the :class:`Scheme` ``name``."""
    if pairs not in (None, "head_dim", "d_model"):
        raise LabError(f"pairs={pairs!r} is not known; allowed: None, 'head_dim', 'd_model'")
    unknown = [e for e in extensions if e not in EXTENSIONS]
    if unknown:
        raise LabError(
            f"extensions={list(extensions)!r}: unknown {unknown}; allowed: {', '.join(EXTENSIONS)}"
        )

    kept = extensions if isinstance(extensions, MethodNames) else tuple(extensions)  # a view stays live

    def wrap(fn):
        ENCODINGS[name] = Scheme(name, fn, kept, pairs, tuple(recipes), dict(options or {}))
        return fn

    return wrap


def registered_names() -> list[str]:
    """The names registered with :func:`register_encoding`, sorted (not the imported user specs)."""
    return sorted(n for n in ENCODINGS if ":" not in n)


def lookup(name: str) -> Scheme:
    """The scheme registered as ``name``. A ``"package.module:function"`` or ``"path/file.py:function"``
    spec is imported and registered under that spec on first use, in every process that asks (compare's
    workers included), so a researcher's scheme runs like the built-ins without editing posenc; it has no
    eval-time extensions and no dimension rule. A name with a prefix of :data:`SPELLED` is made and
    registered the same way."""
    if name in ENCODINGS:
        return ENCODINGS[name]
    for prefix, make in SPELLED.items():
        if isinstance(name, str) and name.startswith(prefix):
            ENCODINGS[name] = make(name)
            return ENCODINGS[name]
    if not isinstance(name, str) or ":" not in name:
        raise LabError(
            f"encoding={name!r} is not known; allowed: {', '.join(registered_names())}, "
            "or your own as 'package.module:function' / 'path/to/file.py:function'"
        )
    where, _, attr = name.rpartition(":")
    try:
        module = _import(where)
    except (ImportError, OSError, SyntaxError) as err:
        raise LabError(f"encoding={name!r}: cannot import {where!r}: {err}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise LabError(f"encoding={name!r}: {where!r} has no function {attr!r} (fn(cfg) -> Encoding)")
    ENCODINGS[name] = fn if isinstance(fn, Scheme) else Scheme(name, fn)
    return ENCODINGS[name]


def _import(where: str):
    if not where.endswith(".py"):
        return importlib.import_module(where)
    path = Path(where).resolve()
    spec = importlib.util.spec_from_file_location(f"posenc_user_{path.stem}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ImportError(f"no Python file at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extensions_for(scheme: str, requested) -> list[str]:
    """The extensions among ``requested`` that apply to ``scheme`` (its entry's ``extensions``)."""
    own = ENCODINGS[scheme].extensions if scheme in ENCODINGS else ()
    return [m for m in requested if m in own]


def model_extensions(cfg: ModelShape, requested) -> list[str]:
    """The extensions among ``requested`` that apply to a model of ``cfg``: its scheme's, and none for a
    model whose layers follow a per-layer plan (``cfg.layers``): an extension changes the one rotary or
    window of a model, which such a model does not have."""
    return [] if getattr(cfg, "layers", None) else extensions_for(cfg.encoding, requested)


def schemes_with(extension: str) -> list[str]:
    """The registered schemes that ``extension`` applies to, in registration order."""
    return [name for name, scheme in ENCODINGS.items() if extension in scheme.extensions]
