"""The arguments of the laboratory's commands: ``posenc train``, ``eval``, ``sample``, ``compare``.

Each parser's defaults come from :mod:`posenc.lab.defaults`; its handler is in :mod:`posenc.lab.commands`.
"""

from __future__ import annotations

import argparse

from posenc.cli import HelpFormatter, count, int_list, name_list, positive_int, seed, threads
from posenc.lab import defaults as D
from posenc.lab.commands import cmd_compare, cmd_eval, cmd_sample, cmd_train
from posenc.lab.passkey import PASSKEY_FILLERS, PASSKEY_STYLES


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", help="a text file or folder (default: this Python's standard library, *.py)")
    p.add_argument("--cache-dir", help="token cache directory (default: ~/.cache/posenc/tokens)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--threads", type=threads, help="torch CPU threads for this process (default: torch's)")


def _compile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compile",
        action="store_true",
        help="train through torch.compile (inductor): compiles for a while, then faster steps; "
        "checkpoints are the same either way (docs/lab.md has the measured speed-ups)",
    )


def add_commands(subparsers) -> None:
    """Add train, eval, sample and compare to the ``posenc`` command."""
    _add_train(subparsers)
    _add_eval(subparsers)
    _add_sample(subparsers)
    _add_compare(subparsers)


def _add_train(subparsers) -> None:
    from posenc.lab.encodings import ENCODINGS

    p = subparsers.add_parser(
        "train", help="train a small GPT with one positional encoding", formatter_class=HelpFormatter
    )
    p.add_argument(
        "--encoding",
        required=True,
        help=f"the positional encoding: one of {', '.join(sorted(ENCODINGS))}, or package.module:function",
    )
    p.add_argument("--out", required=True, help="run directory (checkpoints, run.json); created if missing")
    _data_args(p)
    _optim_args(p)
    p.add_argument(
        "--copy-fraction",
        type=float,
        default=0.0,
        help="share of training windows whose second half repeats the first, 0..1",
    )
    p.add_argument(
        "--passkey-fraction",
        type=float,
        default=0.0,
        help="share of training windows made into passkey prompts with their answer (teaches retrieval), "
        "0..1; with --copy-fraction at most 1 in all",
    )
    _model_args(p)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the run directory's last checkpoint; when there is none yet, start a new run "
        "(and say so on stderr)",
    )
    p.add_argument(
        "--stop-after",
        type=positive_int,
        help="stop at this step; the schedule still targets --steps (default: run to --steps)",
    )
    _compile_arg(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)


def _add_eval(subparsers) -> None:
    p = subparsers.add_parser(
        "eval",
        help="perplexity at several lengths, eval-time extensions, passkey retrieval",
        formatter_class=HelpFormatter,
    )
    p.add_argument("ckpt", help="run directory or checkpoint directory")
    _data_args(p)
    p.add_argument(
        "--lens",
        type=int_list,
        help="evaluation lengths, e.g. 64,128,256 (default "
        f"{','.join(map(str, D.EVAL_COMMAND_MULTS))} x train length)",
    )
    p.add_argument(
        "--eval-tokens", type=positive_int, default=D.EVAL_TOKENS, help="validation tokens per length"
    )
    p.add_argument(
        "--extensions",
        type=name_list,
        help="eval-time extensions, those that apply to the model's scheme are run (default: all of "
        "pi,ntk,dynamic,yarn for rope, bca for xpos, temp for none)",
    )
    _passkey_args(p)
    p.add_argument(
        "--sliding-tokens",
        type=positive_int,
        default=D.SLIDING_TOKENS,
        help="tokens the sliding protocol scores per length",
    )
    p.add_argument(
        "--probe-windows",
        type=count,
        default=D.PROBE_WINDOWS,
        help="windows per length of the far-context-gain and copy probes; 0 skips them",
    )
    p.add_argument("--seed", type=seed, default=D.SEED, help="the passkey keys and depths")
    p.add_argument("--json", help="also write the report as JSON here")
    p.set_defaults(func=cmd_eval)


def _add_sample(subparsers) -> None:
    p = subparsers.add_parser(
        "sample", help="generate text from a checkpoint (KV-cached)", formatter_class=HelpFormatter
    )
    p.add_argument("ckpt", help="run directory or checkpoint directory")
    p.add_argument("--prompt", default="def ", help="the text to continue")
    p.add_argument("--max-new-tokens", type=positive_int, default=200, help="tokens (bytes) to generate")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature; 0 is greedy")
    p.add_argument(
        "--top-k", type=positive_int, default=None, help="sample among the k likeliest (default: all)"
    )
    p.add_argument("--seed", type=seed, default=0, help="the sampling generator's seed")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--threads", type=threads, help="torch CPU threads (default: torch's)")
    p.set_defaults(func=cmd_sample)


def _add_compare(subparsers) -> None:
    from posenc.lab.config import PRESETS

    p = subparsers.add_parser(
        "compare",
        help="train every encoding short, evaluate long: table + plot",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--out", default="runs/compare", help="output directory; created if missing")
    p.add_argument(
        "--preset",
        default="quick",
        choices=list(PRESETS),
        help="quick: <10 min on 2 CPU cores; standard: longer training, in-distribution perplexities "
        "close, <40 min on 2 CPU cores; gpu: bigger, for --device cuda; tiny: seconds, for tests",
    )
    _data_args(p)
    p.add_argument(
        "--jobs",
        type=positive_int,
        help="models trained in parallel (default: on CPU all at once, one thread each; 1 on GPU)",
    )
    p.add_argument("--steps", type=positive_int, help="training steps (default: the preset's)")
    p.add_argument("--train-len", type=positive_int, help="training length (default: the preset's)")
    p.add_argument(
        "--eval-mults",
        type=int_list,
        help="evaluation lengths as multiples of the training length (default: the preset's)",
    )
    p.add_argument(
        "--schemes",
        type=name_list,
        help="comma-separated encodings to compare (default: the classic none,sinusoidal,learned,rope,alibi; "
        "'all': every built-in, also t5,kerple,sandwich,fire; your own as package.module:function)",
    )
    p.add_argument("--seed", type=seed, help="initialisation and batch order (default: the preset's, 0)")
    p.add_argument(
        "--seeds",
        type=positive_int,
        help="models per scheme, seeds --seed, --seed + 1, ...: tables show mean ± sd (default: 1)",
    )
    _compare_measure_args(p)
    _recipe_args(p)
    _compile_arg(p)
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.set_defaults(func=cmd_compare)


def _optim_args(p: argparse.ArgumentParser) -> None:
    """The training length and the optimisation (AdamW, warmup then cosine decay)."""
    p.add_argument(
        "--train-len", type=positive_int, default=D.TRAIN_LEN, help="training sequence length (bytes)"
    )
    p.add_argument("--steps", type=positive_int, default=D.STEPS, help="optimizer steps")
    p.add_argument(
        "--batch-size", type=positive_int, default=D.BATCH_SIZE, help="global batch, split across DDP ranks"
    )
    p.add_argument("--lr", type=float, default=D.LR, help="peak learning rate (AdamW)")
    p.add_argument("--warmup", type=count, default=D.WARMUP, help="linear warmup steps, then cosine decay")
    p.add_argument(
        "--weight-decay", type=float, default=D.WEIGHT_DECAY, help="AdamW weight decay on matrices"
    )
    p.add_argument(
        "--grad-clip", type=float, default=D.GRAD_CLIP, help="clip the gradient norm to this; 0 turns it off"
    )
    p.add_argument("--seed", type=seed, default=D.SEED, help="initialisation and batch order")


def _model_args(p: argparse.ArgumentParser) -> None:
    """The model's size and how often it is checkpointed."""
    p.add_argument("--n-layer", type=positive_int, default=D.N_LAYER, help="transformer blocks")
    p.add_argument("--n-head", type=positive_int, default=D.N_HEAD, help="attention heads")
    p.add_argument("--d-model", type=positive_int, default=D.D_MODEL, help="model width")
    p.add_argument(
        "--ckpt-every", type=positive_int, default=D.CKPT_EVERY, help="checkpoint interval in steps"
    )


def _passkey_args(p: argparse.ArgumentParser) -> None:
    """Passkey retrieval of ``posenc eval``: lengths, prompts per length, the key, the prompt, the filler."""
    p.add_argument("--passkey-lens", type=int_list, help="passkey retrieval at these lengths, e.g. 128,256")
    p.add_argument(
        "--passkey-trials",
        type=positive_int,
        default=D.EVAL_COMMAND_PASSKEY_TRIALS,
        help="passkey prompts per length",
    )
    p.add_argument(
        "--passkey-digits", type=positive_int, default=D.PASSKEY_DIGITS, help="digits of the hidden key"
    )
    p.add_argument(
        "--passkey-style",
        choices=sorted(PASSKEY_STYLES),
        default=D.PASSKEY_STYLE,
        help="code: a Python assignment and assert (34 bytes besides the key), short enough to ask inside "
        "the training length; sentences: Mohtashami & Jaggi's needle and question (87 bytes besides the key)",
    )
    p.add_argument(
        "--passkey-filler",
        choices=sorted(PASSKEY_FILLERS),
        default=D.PASSKEY_FILLER,
        help="corpus: filler drawn from the validation text (in distribution); repeat: repeated sentences",
    )


def _compare_measure_args(p: argparse.ArgumentParser) -> None:
    """What a comparison reports, and the training mix that makes its probes mean something."""
    p.add_argument(
        "--protocol",
        type=name_list,
        help="evaluation protocols to report, comma-separated: windows (non-overlapping windows), sliding "
        "(stride = train length, last tokens scored), past (positions past the train length) "
        "(default: all three)",
    )
    p.add_argument(
        "--copy-fraction",
        type=float,
        help="share of training windows whose second half repeats the first, 0..1 (default: 0)",
    )
    p.add_argument(
        "--passkey-fraction",
        type=float,
        help="share of training windows made into passkey prompts with their answer, so that the models "
        "learn retrieval inside the training length, 0..1 (default: 0)",
    )
    p.add_argument(
        "--passkey-trials",
        type=count,
        help=f"passkey prompts per length and model (a {D.PASSKEY_DIGITS}-digit key in corpus text); 0 skips "
        f"passkey (default: {D.PASSKEY_TRIALS})",
    )


def _recipe_args(p: argparse.ArgumentParser) -> None:
    """Extension by training: each recipe continues the trained RoPE models (posenc.lab.recipes)."""
    p.add_argument(
        "--extend-steps",
        type=count,
        help="continue each RoPE model this many steps with each of --recipes, every recipe with the same "
        "tokens per step (default: 0, no recipes)",
    )
    p.add_argument(
        "--extend-to",
        type=positive_int,
        help=f"the recipes' target length in training lengths (default: {D.EXTEND_TO})",
    )
    p.add_argument(
        "--recipes",
        type=name_list,
        help="comma-separated: pi, yarn, abf (fine-tuned at the target length), pose (at the training "
        "length, positions skipping over the target), none (the control) (default: all)",
    )
