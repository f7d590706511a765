"""The ``posenc`` command.

Each subcommand lives in the module that does the work; this file only collects them. A module
listed in ``_COMMAND_MODULES`` exposes ``add_commands(subparsers)``, which adds its subparsers and
sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit code).
Modules are imported only when the command line is parsed, so ``import posenc`` stays light.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from pathlib import Path

_COMMAND_MODULES = (
    "posenc.tools.tour",  # posenc tour
    "posenc.tools.plot",  # posenc plot ...
    "posenc.tools.bench",  # posenc bench
    "posenc.lab.arguments",  # posenc train / eval / sample / compare
    "posenc.real.commands",  # posenc extend
    "posenc.tools.zoo",  # posenc zoo
)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default after its help, unless the help already states it or there is none
    to show (None, a store_true flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or any(action.default is v for v in (None, False, argparse.SUPPRESS)):
            return text
        return super()._get_help_string(action)


def guarded(name: str, resume: str = "rerun the same command to continue"):
    """Decorate a ``posenc <name>`` handler: bad input (a ``ValueError`` such as the lab's ``LabError``, an
    ``OSError`` from a refused write, an ``IndexError``) becomes one line on stderr and exit status 2, never
    a traceback; Ctrl-C exits with 130 saying that the saved work is intact and how to ``resume``.
    ``--threads`` is applied."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(args) -> int:
            if getattr(args, "threads", None):
                import torch

                torch.set_num_threads(args.threads)
            try:
                return fn(args)
            except (
                ValueError,
                OSError,  # a write refused after the up-front checks (a full disk, a read-only mount)
                IndexError,
            ) as e:  # LabError, CorpusError, PositionError...
                print(f"posenc {name}: error: {e}", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                print(
                    f"posenc {name}: interrupted; the work saved so far is intact ({resume})",
                    file=sys.stderr,
                )
                return 130

        return run

    return wrap


# The argparse ``type``s every command shares: each refuses what no command can use at parse time, so
# argparse names the option (``argument --steps: ...``) and exits with status 2 before any work. Integers
# stop at int64, what torch and numpy hold: a larger one would otherwise fail deep inside a tensor call.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _integer(text: str, low: int, high: int, allowed: str, span: str) -> int:
    """``int(text)`` when it lies in [low, high]; else a usage error saying what is ``allowed`` and its
    ``span``."""
    try:
        value = int(text)
    except ValueError:  # not an integer, or more digits than Python converts
        value = None
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r} (allowed: {span})")
    return value


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer from 1 to 2**63 - 1, else a usage error saying what was given."""
    return _integer(text, 1, INT64_MAX, "a positive integer", "1 to 2**63 - 1")


def count(text: str) -> int:
    """An argparse ``type``: an integer from 0 to 2**63 - 1 (a count where 0 means none)."""
    return _integer(text, 0, INT64_MAX, "an integer >= 0", "0 to 2**63 - 1")


def seed(text: str) -> int:
    """An argparse ``type``: a generator's seed, any int64 (negative ones included)."""
    return _integer(text, INT64_MIN, INT64_MAX, "an integer seed", "-2**63 to 2**63 - 1")


# torch allocates per thread: a huge count runs out of memory in the OpenMP runtime (2^31 - 1 did); more
# threads than cores is slow but legitimate, so the cap is far above any machine's cores
MAX_THREADS = 1024


def threads(text: str) -> int:
    """An argparse ``type``: torch CPU threads, 1 to :data:`MAX_THREADS`."""
    return _integer(text, 1, MAX_THREADS, "a number of threads", f"1 to {MAX_THREADS}")


def _items(text: str, what: str) -> list[str]:
    """The comma-separated items of ``text``, refused when there are none or one is given twice."""
    items = [v.strip() for v in text.split(",") if v.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected one or more comma-separated {what}, got {text!r}")
    twice = sorted({v for v in items if items.count(v) > 1})
    if twice:
        raise argparse.ArgumentTypeError(
            f"{', '.join(map(repr, twice))} given more than once in {text!r}; give each once"
        )
    return items


def name_list(text: str) -> list[str]:
    """An argparse ``type``: comma-separated names, at least one, each once."""
    return _items(text, "names")


def int_list(text: str) -> list[int]:
    """An argparse ``type``: comma-separated positive integers up to 2**63 - 1, at least one, each once."""
    items = _items(text, "positive integers like 64,128,256")
    try:
        values = [_integer(v, 1, INT64_MAX, "", "") for v in items]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected positive integers, got {text!r} (allowed: comma-separated, each 1 to 2**63 - 1)"
        ) from None
    if len(set(values)) != len(values):  # "64,064" names one length twice
        raise argparse.ArgumentTypeError(f"{text!r} gives a value more than once; give each once")
    return values


def check_output_dir(flag: str, path: str | os.PathLike) -> Path:
    """``path`` when a command may create or fill it as a directory; else a ValueError naming ``flag``.

    Checked before any work, so a long run does not fail at its first write.
    """
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {str(p)!r} is an existing file; expected a directory (created if missing)")
    _check_writable(flag, p)
    return p


def check_output_file(flag: str, path: str | os.PathLike) -> Path:
    """``path`` when a command may write a file there (its folder is created); else a ValueError."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise ValueError(f"{flag} {str(p)!r} is a directory; expected a file name to write")
    _check_writable(flag, p.parent)
    return p


def _check_writable(flag: str, folder: Path) -> None:
    """Whether ``folder`` exists writable or can be created: its nearest existing ancestor decides."""
    ancestor = folder
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(
            f"{flag}: cannot create {str(folder)!r}: {str(ancestor)!r} is a file, not a directory"
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}: cannot write to {str(folder)!r}: {str(ancestor)!r} is not writable")


def check_matplotlib(what: str = "drawing figures") -> None:
    """A ValueError saying how to install matplotlib when it cannot be imported (the ``plot`` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(
            f"{what} needs matplotlib, which is not installed: pip install posenc[plot]"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posenc",
        description="Positional encodings for PyTorch transformers: library, benchmarks and laboratory.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).add_commands(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
