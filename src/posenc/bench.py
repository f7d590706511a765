"""Placeholder: filled in by its own issue."""


def add_commands(subparsers):
    return None
