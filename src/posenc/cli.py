"""The ``posenc`` command.

Each subcommand lives in the module that does the work; this file only collects them. A module
listed in ``_COMMAND_MODULES`` exposes ``add_commands(subparsers)``, which adds its subparsers and
sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit code).
Modules are imported only when the command line is parsed, so ``import posenc`` stays light.
"""

from __future__ import annotations

import argparse
import importlib
import sys

_COMMAND_MODULES = (
    "posenc.tools.tour",  # posenc tour
    "posenc.tools.plot",  # posenc plot ...
    "posenc.tools.bench",  # posenc bench
    "posenc.lab.commands",  # posenc train / eval / sample / compare
)


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
