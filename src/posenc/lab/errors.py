"""Errors the laboratory raises for bad input; the CLI prints them as one line and exits non-zero."""

from __future__ import annotations


class LabError(ValueError):
    """A bad argument, corpus or checkpoint. The message names what was given and what is allowed."""


class CorpusError(LabError):
    """The corpus is missing, empty or too small for the requested lengths."""


class CheckpointError(LabError):
    """A checkpoint is missing, corrupt, or was written for a different configuration."""
