"""The laboratory's tokenizer: UTF-8 bytes, a vocabulary of 256 (no merges, so every scheme sees the same
tokens and a model can be probed on any text)."""

from __future__ import annotations

__all__ = ["VOCAB_SIZE", "decode", "encode"]

VOCAB_SIZE = 256


def decode(tokens) -> str:
    """Bytes to text, replacing invalid UTF-8 (a byte model can emit half a character)."""
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def encode(text: str) -> list[int]:
    """Text to its UTF-8 bytes."""
    return list(text.encode("utf-8"))
