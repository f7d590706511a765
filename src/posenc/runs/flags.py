"""Command-line flags generated from dataclass fields: a default, its type, its choices and its help are
written once, on the field, and every command that offers the field gets the same flag.

The shape is gpt-fast's ``ModelArgs`` (a dataclass whose presets are overrides) and torchtitan's config
dataclasses (each section a dataclass; the command line generated from the fields). A field declared with
:func:`option` carries a :class:`Flag`; :func:`like` declares a field of a composed config as the same field
of another; :func:`add_flags` adds the fields' flags to a parser; :func:`flag_values` reads them back by
field name. The laboratory's commands and ``posenc extend`` (:class:`posenc.real.settings.ExtendSettings`)
declare their flags so.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any

from posenc.cli import int_list, name_list

__all__ = ["Flag", "add_flags", "flag_of", "flag_values", "like", "option"]

_KEY = "posenc.flag"  # the fields' metadata key
_LISTS = (int_list, name_list)  # argparse types that give a list: the field holds it as a tuple


@dataclass(frozen=True)
class Flag:
    """What a dataclass field says about its command-line flag.

    help: a sentence, or a function returning one, called when the parser is built (so that it can list a
        registry as it is then, entries registered after import included).
    type: the argparse ``type`` (:mod:`posenc.cli`'s ``positive_int``, ``count``, ``seed``, ``int_list``,
        ``name_list``, or ``float``); None for a string, and for a boolean field, whose flag is a switch.
    choices: a function returning the allowed names, or a dict of them and what each means: argparse's
        ``choices`` for a single value; for a comma-separated list (``name_list``), listed in the help.
    name: the flag without its dashes when it is not the field's name with dashes (``train-len``).
    """

    help: str | Callable[[], str]
    type: Callable[[str], Any] | None = None
    choices: Callable[[], Iterable[str] | Mapping[str, str]] | None = None
    name: str | None = None

    def option_string(self, field_name: str) -> str:
        """The flag as typed: ``--`` and its name."""
        return "--" + (self.name or field_name.replace("_", "-"))

    def dest(self, field_name: str) -> str:
        """The attribute argparse stores the value under."""
        return self.option_string(field_name)[2:].replace("-", "_")


def option(default: Any = MISSING, *, help, type=None, choices=None, flag: str | None = None) -> Any:
    """A dataclass field with ``default`` and the :class:`Flag` of ``help``, ``type``, ``choices`` and
    ``flag`` (its name); without a default, the field and its flag are required."""
    return field(default=default, metadata={_KEY: Flag(help, type, choices, flag)})


def like(cls: type, name: str) -> Any:
    """A field declared as ``cls``'s field ``name``: its default and its flag, so that a config composed of
    others (a comparison's settings of the model's and the training's) writes neither twice."""
    source = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    if source is None or _KEY not in source.metadata:
        raise TypeError(f"{cls.__name__} has no field {name!r} declared with option()")
    return field(default=source.default, metadata=source.metadata)


def flag_of(cls: type, name: str) -> Flag:
    """The :class:`Flag` of ``cls``'s field ``name`` (a TypeError when it has none): what an error about
    the field's value names (``flag_of(cls, name).option_string(name)``)."""
    (found,) = _flagged(cls, [name])
    return found.metadata[_KEY]


def _flagged(cls: type, names: Iterable[str] | None) -> Iterator[dataclasses.Field]:
    """The fields of ``cls`` named ``names`` (in that order; default: every field with a flag)."""
    by_name = {f.name: f for f in dataclasses.fields(cls) if _KEY in f.metadata}
    for name in by_name if names is None else names:
        if name not in by_name:
            raise TypeError(f"{cls.__name__}.{name} is not a field declared with option()")
        yield by_name[name]


def _shown(value: Any) -> str:
    """A value as it is typed on the command line: a list comma-separated."""
    return ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def _listing(choices: Iterable[str] | Mapping[str, str]) -> str:
    if isinstance(choices, Mapping):
        return "; ".join(f"{name}: {meaning}" for name, meaning in choices.items())
    return ", ".join(choices)


def _preset_default(presets: Mapping[str, Any], name: str) -> str:
    """``(default: ...)`` of a flag that overrides a preset's field: the value, or each preset's when they
    differ (presets with the same value together)."""
    groups: dict[str, list[str]] = {}
    for preset, settings in presets.items():
        groups.setdefault(_shown(getattr(settings, name)), []).append(preset)
    if len(groups) == 1:
        return f"(default: {next(iter(groups))})"
    return "(default: the preset's: " + "; ".join(f"{', '.join(p)} {v}" for v, p in groups.items()) + ")"


def _arguments(f: dataclasses.Field, required: bool, presets: Mapping[str, Any] | None) -> dict:
    """``add_argument``'s keywords for the flag of field ``f``."""
    meta: Flag = f.metadata[_KEY]
    text = meta.help() if callable(meta.help) else meta.help
    if f.default is False:
        return {"action": "store_true", "help": text}
    kwargs: dict[str, Any] = {"dest": meta.dest(f.name)}
    if meta.type is not None:
        kwargs["type"] = meta.type
    if meta.choices is not None:
        choices = meta.choices()
        if meta.type in _LISTS:
            text += f"; comma-separated, of: {_listing(choices)}"
        else:
            kwargs["choices"] = list(choices)
    if required or f.default is MISSING:
        kwargs["required"] = True
    elif presets is not None and not (f.default is None and "(default: " in text):
        text += " " + _preset_default(presets, f.name)  # no argparse default: None is the preset's value
    else:
        kwargs["default"] = f.default
    return {**kwargs, "help": text}


def add_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    names: Iterable[str] | None = None,
    *,
    required: Iterable[str] = (),
    presets: Mapping[str, Any] | None = None,
) -> None:
    """Add the flags of ``cls``'s fields ``names`` (in that order; default: every field declared with a
    flag, in field order) to ``parser``, a parser or an argument group.

    Each flag has its field's default, type and choices; a boolean field's flag is a switch. ``required``:
    fields whose flag must be given although the field has a default. ``presets``: named instances of
    ``cls`` that the flags override: then every flag defaults to None, which leaves the chosen preset's
    value, and its help shows the presets' values.
    """
    required = set(required)
    for f in _flagged(cls, names):
        meta: Flag = f.metadata[_KEY]
        parser.add_argument(meta.option_string(f.name), **_arguments(f, f.name in required, presets))


def flag_values(cls: type, args: argparse.Namespace, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The values ``args`` holds for ``cls``'s fields ``names`` (default: every field with a flag that the
    parser had), by field name, lists as tuples: keyword arguments for ``cls`` or for a preset's
    ``replace``."""
    out = {}
    for f in _flagged(cls, names):
        dest = f.metadata[_KEY].dest(f.name)
        if names is not None or hasattr(args, dest):
            value = getattr(args, dest)
            out[f.name] = tuple(value) if isinstance(value, list) else value
    return out
