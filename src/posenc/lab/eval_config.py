"""What is measured at each evaluation length: :class:`EvalConfig`, the protocols, the probes, passkey.

``posenc eval`` takes its flags from these fields and a comparison's settings (:mod:`posenc.lab.config`)
are composed of them; :mod:`posenc.lab.evaluate` measures them.
"""

from __future__ import annotations

from dataclasses import dataclass

from posenc import cli
from posenc.lab import defaults as D
from posenc.lab.checks import check_choices, check_int
from posenc.runs.flags import option

__all__ = ["EVAL_COMMAND_FLAGS", "PROTOCOLS", "PROTOCOL_MEANINGS", "EvalConfig"]

# The evaluation protocols (posenc.lab.evaluate's docstring has each one's source), in report order.
PROTOCOL_MEANINGS = {
    "windows": "non-overlapping windows",
    "sliding": "stride = train length, last tokens scored",
    "past": "positions past the train length",
}
PROTOCOLS = tuple(PROTOCOL_MEANINGS)


@dataclass(frozen=True)
class EvalConfig:
    """What is measured at each evaluation length: the protocols and their tokens, the probes, passkey."""

    eval_tokens: int = option(D.EVAL_TOKENS, type=cli.positive_int, help="validation tokens per length")
    protocols: tuple[str, ...] = option(
        PROTOCOLS,
        type=cli.name_list,
        choices=lambda: PROTOCOL_MEANINGS,
        flag="protocol",
        help="evaluation protocols to report",
    )
    sliding_tokens: int = option(
        D.SLIDING_TOKENS, type=cli.positive_int, help="tokens the sliding protocol scores per length"
    )
    probe_windows: int = option(
        D.PROBE_WINDOWS,
        type=cli.count,
        help="windows per length of the far-context-gain, copy and recall probes; 0 skips them",
    )
    passkey_trials: int = option(
        D.PASSKEY_TRIALS,
        type=cli.count,
        help=f"passkey prompts per length and model (a {D.PASSKEY_DIGITS}-digit key in corpus text); "
        "0 skips passkey",
    )

    def __post_init__(self):
        check_int("passkey_trials", self.passkey_trials, minimum=0)
        check_choices("protocols", self.protocols, PROTOCOLS)
        object.__setattr__(self, "protocols", tuple(p for p in PROTOCOLS if p in self.protocols))
        check_int("sliding_tokens", self.sliding_tokens)
        check_int("probe_windows", self.probe_windows, minimum=0)
        check_int("eval_tokens", self.eval_tokens)


# The fields `posenc eval` offers as flags; it measures every protocol, and passkey retrieval its own way.
EVAL_COMMAND_FLAGS = ("eval_tokens", "sliding_tokens", "probe_windows")
