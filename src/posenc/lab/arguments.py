"""The arguments of the laboratory's commands: ``posenc train``, ``eval``, ``sample``, ``compare``.

Every flag is a dataclass field's (:mod:`posenc.runs.flags`): the model's, training's and evaluation's
from their configs (:mod:`posenc.lab.config`, :mod:`posenc.lab.eval_config`), ``compare``'s from the
settings its ``--preset`` gives, and each command's own below. Each command's handler is in
:mod:`posenc.lab.commands`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from posenc import cli
from posenc.cli import HelpFormatter
from posenc.lab import defaults as D
from posenc.lab.commands import cmd_compare, cmd_eval, cmd_sample, cmd_train
from posenc.lab.config import PRESETS, GPTConfig, Settings, TrainConfig
from posenc.lab.encodings import ENCODINGS
from posenc.lab.eval_config import EVAL_COMMAND_FLAGS, EvalConfig
from posenc.lab.passkey import PASSKEY_FILLERS, PASSKEY_STYLES
from posenc.runs.flags import add_flags, like, option

__all__ = ["add_commands"]

_CKPT_HELP = "run directory or checkpoint directory"


@dataclass(frozen=True)
class DataOptions:
    """Where the text comes from and where the work runs (every command's)."""

    corpus: str | None = option(
        None, help="a text file or folder (default: this Python's standard library, *.py)"
    )
    cache_dir: str | None = option(None, help="token cache directory (default: ~/.cache/posenc/tokens)")
    device: str = option("cpu", help="cpu, cuda or cuda:N")
    threads: int | None = option(
        None, type=cli.threads, help="torch CPU threads for this process (default: torch's)"
    )


@dataclass(frozen=True)
class TrainOptions:
    """``posenc train``'s own options: the run directory, checkpoints, resuming, compiling."""

    out: str = option(help="run directory (checkpoints, run.json); created if missing")
    ckpt_every: int = like(Settings, "ckpt_every")
    resume: bool = option(
        False,
        help="continue from the run directory's last checkpoint; when there is none yet, start a new run "
        "(and say so on stderr)",
    )
    stop_after: int | None = option(
        None,
        type=cli.positive_int,
        help="stop at this step; the schedule still targets --steps (default: run to --steps)",
    )
    compile: bool = option(
        False,
        help="train through torch.compile (inductor): compiles for a while, then faster steps; "
        "checkpoints are the same either way (docs/lab-results.md has the measured speed-ups)",
    )
    context_parallel: int = option(
        1,
        type=cli.positive_int,
        help="ranks that share each sequence under torchrun (context parallelism: each holds a head-tail "
        "share, attention on posenc.parallel's ring; docs/parallel.md); it must divide the processes",
    )
    no_progress: bool = option(False, help="no progress bar")


def _extensions_help() -> str:
    """What ``--extensions`` of ``posenc eval`` runs by default: every scheme's own (the registry's)."""
    own = ", ".join(f"{','.join(s.extensions)} for {n}" for n, s in ENCODINGS.items() if s.extensions)
    return f"eval-time extensions, those that apply to the model's scheme are run (default: all of {own})"


@dataclass(frozen=True)
class EvalOptions:
    """``posenc eval``'s own options: the lengths, the extensions, passkey retrieval, the JSON report."""

    lens: tuple[int, ...] | None = option(
        None,
        type=cli.int_list,
        help="evaluation lengths, e.g. 64,128,256 (default "
        f"{','.join(map(str, D.EVAL_COMMAND_MULTS))} x train length)",
    )
    extensions: tuple[str, ...] | None = option(None, type=cli.name_list, help=_extensions_help)
    passkey_lens: tuple[int, ...] | None = option(
        None,
        type=cli.int_list,
        help="passkey retrieval at these lengths, e.g. 128,256 (default: no passkey retrieval)",
    )
    passkey_trials: int = option(
        D.EVAL_COMMAND_PASSKEY_TRIALS, type=cli.positive_int, help="passkey prompts per length"
    )
    passkey_digits: int = option(D.PASSKEY_DIGITS, type=cli.positive_int, help="digits of the hidden key")
    passkey_style: str = option(
        D.PASSKEY_STYLE,
        choices=lambda: sorted(PASSKEY_STYLES),
        help="code: a Python assignment and assert (34 bytes besides the key), short enough to ask inside "
        "the training length; sentences: Mohtashami & Jaggi's needle and question (87 bytes besides the key)",
    )
    passkey_filler: str = option(
        D.PASSKEY_FILLER,
        choices=lambda: sorted(PASSKEY_FILLERS),
        help="corpus: filler drawn from the validation text (in distribution); repeat: repeated sentences",
    )
    seed: int = option(D.SEED, type=cli.seed, help="the passkey keys and depths")
    json: str | None = option(None, help="also write the report as JSON here (default: print it only)")


@dataclass(frozen=True)
class SampleOptions:
    """``posenc sample``'s options: the prompt and how to sample its continuation."""

    prompt: str = option("def ", help="the text to continue")
    max_new_tokens: int = option(200, type=cli.positive_int, help="tokens (bytes) to generate")
    temperature: float = option(0.8, type=float, help="sampling temperature; 0 is greedy")
    top_k: int | None = option(
        None, type=cli.positive_int, help="sample among the k likeliest (default: all)"
    )
    seed: int = option(0, type=cli.seed, help="the sampling generator's seed")


@dataclass(frozen=True)
class CompareOptions:
    """``posenc compare``'s own options: the output, the preset, the workers."""

    out: str = option("runs/compare", help="output directory; created if missing")
    preset: str = option(
        "quick",
        choices=lambda: PRESETS,
        help="quick: <10 min on 2 CPU cores; standard: longer training, in-distribution perplexities "
        "close, <40 min on 2 CPU cores; gpu: bigger, for --device cuda; long: training length 512, 4 "
        "layers of d 256, for --device cuda with --mix (docs/lab.md has its cost); tiny: seconds, for tests",
    )
    jobs: int | None = option(
        None,
        type=cli.positive_int,
        help="models trained in parallel (default: on CPU all at once, one thread each; 1 on GPU)",
    )
    compile: bool = like(TrainOptions, "compile")
    context_parallel: int = option(
        1,
        type=cli.positive_int,
        help="train each model on N gloo processes on the CPU that share every sequence (context "
        "parallelism: each a head-tail share, attention on posenc.parallel's ring; docs/parallel.md)",
    )
    no_progress: bool = option(False, help="no progress display")


# the settings a comparison's flags override, in the order --help lists them
COMPARE_FLAGS = (
    "steps",
    "train_len",
    "eval_mults",
    "schemes",
    "seed",
    "seeds",
    "protocols",
    "copy_fraction",
    "passkey_fraction",
    "mix",
    "answer_weight",
    "passkey_trials",
    "extend_steps",
    "extend_to",
    "recipes",
)


def add_commands(subparsers) -> None:
    """Add train, eval, sample and compare to the ``posenc`` command."""
    _add_train(subparsers)
    _add_eval(subparsers)
    _add_sample(subparsers)
    _add_compare(subparsers)


def _add_train(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a small GPT with one positional encoding", formatter_class=HelpFormatter
    )
    add_flags(p, GPTConfig, ["encoding"], required=["encoding"])
    add_flags(p, TrainOptions, ["out"])
    add_flags(p.add_argument_group("data and device"), DataOptions)
    add_flags(p.add_argument_group("model"), GPTConfig, ["max_len", "n_layer", "n_head", "d_model", "layers"])
    add_flags(p.add_argument_group("training"), TrainConfig)
    add_flags(p.add_argument_group("the run"), TrainOptions, [n for n in _names(TrainOptions) if n != "out"])
    p.set_defaults(func=cmd_train)


def _add_eval(subparsers) -> None:
    p = subparsers.add_parser(
        "eval",
        help="perplexity at several lengths, eval-time extensions, passkey retrieval",
        formatter_class=HelpFormatter,
    )
    p.add_argument("ckpt", help=_CKPT_HELP)
    add_flags(p.add_argument_group("data and device"), DataOptions)
    measures = p.add_argument_group("what is measured")
    add_flags(measures, EvalOptions, ["lens", "extensions"])
    add_flags(measures, EvalConfig, EVAL_COMMAND_FLAGS)
    add_flags(p.add_argument_group("passkey retrieval"), EvalOptions, _names(EvalOptions, "passkey", "seed"))
    add_flags(p.add_argument_group("the report"), EvalOptions, ["json"])
    p.set_defaults(func=cmd_eval)


def _add_sample(subparsers) -> None:
    p = subparsers.add_parser(
        "sample", help="generate text from a checkpoint (KV-cached)", formatter_class=HelpFormatter
    )
    p.add_argument("ckpt", help=_CKPT_HELP)
    add_flags(p, SampleOptions)
    add_flags(p, DataOptions, ["device", "threads"])
    p.set_defaults(func=cmd_sample)


def _add_compare(subparsers) -> None:
    p = subparsers.add_parser(
        "compare",
        help="train every encoding short, evaluate long: table + plot",
        formatter_class=HelpFormatter,
    )
    add_flags(p, CompareOptions, ["out", "preset"])
    add_flags(p.add_argument_group("data and device"), DataOptions)
    group = p.add_argument_group("the comparison (each flag replaces the preset's value)")
    add_flags(group, Settings, COMPARE_FLAGS, presets=PRESETS)
    add_flags(
        p.add_argument_group("the run"),
        CompareOptions,
        ["jobs", "compile", "context_parallel", "no_progress"],
    )
    p.set_defaults(func=cmd_compare)


def _names(cls, *prefixes: str) -> list[str]:
    """The fields of ``cls`` (those whose names start with one of ``prefixes``, when given)."""
    names = [f.name for f in fields(cls)]
    return [n for n in names if n.startswith(prefixes)] if prefixes else names
