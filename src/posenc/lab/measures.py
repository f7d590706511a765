"""What an evaluation measures at each length: one table of typed records, read by
:mod:`posenc.lab.evaluate` (a :class:`~posenc.lab.evaluate.Row` has one dict per measure),
:mod:`posenc.lab.stats` (which dicts it averages over seeds) and :mod:`posenc.lab.report` (which it
writes). This module imports nothing of the laboratory."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BY_LENGTH", "MEASURES", "MEASURE_NAMES", "Measure", "measured"]


@dataclass(frozen=True)
class Measure:
    """One per-length measure.

    name: the :class:`~posenc.lab.evaluate.Row` field and the results.json key (``"<name>_sd"`` beside it).
    needs: what must be asked for it to be measured: None (always), a protocol ("past", "sliding"),
        "probe" (probe windows > 0) or "passkey" (passkey trials > 0).
    meaning: one line, for readers of results.json.
    keyed_by: what its values are keyed by: "length" (the evaluation length) or "context" (a context
        length inside the training length, measured at the training length).
    """

    name: str
    needs: str | None
    meaning: str
    keyed_by: str = "length"


MEASURES: tuple[Measure, ...] = (
    Measure("ppl", None, "perplexity (bytes) of the windows protocol"),
    Measure("ppl_past", "past", "the windows protocol on positions at or past the training length"),
    Measure("ppl_sliding", "sliding", "the sliding protocol: the last L tokens of windows at stride L"),
    Measure("gain", "probe", "far-context gain: ppl(last L as context) / ppl(whole window)"),
    Measure(
        "reach",
        "probe",
        "far-context gain inside the training length: ppl(last c tokens as context) / ppl(whole window of "
        "L), c = L/4 and L/2",
        keyed_by="context",
    ),
    Measure("copy_first", "probe", "copy probe: ppl on a segment's first occurrence"),
    Measure("copy_repeat", "probe", "copy probe: ppl on the segment's repeat"),
    Measure("recall", "probe", "recall probe: share of queries answered exactly, distances (n/2, n]"),
    Measure("recall_ppl", "probe", "recall probe: ppl on the value bytes with the whole window as context"),
    Measure(
        "recall_gain",
        "probe",
        "recall probe: far-context gain on the value bytes, ppl(last L as context) / ppl(whole window)",
    ),
    Measure("passkey", "passkey", "share of passkey prompts answered exactly"),
)
MEASURE_NAMES: tuple[str, ...] = tuple(m.name for m in MEASURES)
BY_LENGTH: tuple[str, ...] = tuple(m.name for m in MEASURES if m.keyed_by == "length")


def measured(protocols, probe_windows: int, passkey_trials: int) -> list[str]:
    """The names of the measures an evaluation with these settings fills, in :data:`MEASURES` order."""
    asked = (
        set(protocols) | ({"probe"} if probe_windows else set()) | ({"passkey"} if passkey_trials else set())
    )
    return [m.name for m in MEASURES if m.needs is None or m.needs in asked]
