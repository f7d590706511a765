"""CLI subcommands of the laboratory: ``posenc train``, ``eval``, ``sample``, ``compare``.

Each handler returns an exit code. Bad input (a :class:`LabError` or ``ValueError`` from the core)
becomes a one-line message on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from posenc.cli import guarded, positive_int
from posenc.lab import defaults as D
from posenc.lab.passkey import PASSKEY_FILLERS, PASSKEY_STYLES


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 64,128,256, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _str_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", help="a text file or folder (default: this Python's standard library, *.py)")
    p.add_argument("--cache-dir", help="token cache directory (default: ~/.cache/posenc/tokens)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument(
        "--threads", type=positive_int, help="torch CPU threads for this process (default: torch's)"
    )


def _check_paths(args, out_dir: str | None = None) -> None:
    """Refuse output and cache paths that cannot be written, before any work starts."""
    from posenc.cli import check_output_dir

    if out_dir is not None:
        check_output_dir("--out", out_dir)
    if getattr(args, "cache_dir", None) is not None:
        check_output_dir("--cache-dir", args.cache_dir)


def _compile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compile",
        action="store_true",
        help="train through torch.compile (inductor): compiles for a while, then faster steps; "
        "checkpoints are the same either way (docs/lab.md has the measured speed-ups)",
    )


# ---------------------------------------------------------------------------------------------- train


@guarded("train", resume="rerun with --resume")
def cmd_train(args) -> int:
    from posenc.lab.checkpoint import latest_checkpoint
    from posenc.lab.config import GPTConfig, TrainConfig
    from posenc.lab.train import train

    _check_paths(args, args.out)
    model_cfg = GPTConfig(
        encoding=args.encoding,
        n_layer=args.n_layer,
        n_head=args.n_head,
        d_model=args.d_model,
        max_len=args.train_len,
    )
    train_cfg = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup=args.warmup,
        seed=args.seed,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
        copy_fraction=args.copy_fraction,
        passkey_fraction=args.passkey_fraction,
    )
    first_rank = os.environ.get("RANK", "0") == "0"  # under torchrun, one note rather than one per rank
    if args.resume and first_rank and latest_checkpoint(args.out) is None:
        print(
            f"posenc train: --resume: no checkpoint in {args.out!r} yet; starting a new run", file=sys.stderr
        )
    result = train(
        model_cfg,
        train_cfg,
        args.out,
        corpus=args.corpus,
        cache_dir=args.cache_dir,
        resume=args.resume,
        ckpt_every=args.ckpt_every,
        device=args.device,
        progress=not args.no_progress,
        stop_after=args.stop_after,
        compile=args.compile,
    )
    import torch.distributed as dist

    if dist.is_initialized():  # under torchrun: one line of output, and a clean shutdown
        rank = dist.get_rank()
        dist.destroy_process_group()
        if rank != 0:
            return 0
    if result.losses:
        _, loss = result.losses[-1]
        print(
            f"trained {args.encoding} to step {result.step}: loss {loss:.4f} nats/byte; "
            f"checkpoint in {args.out}"
        )
    else:
        print(f"{args.out} is already at step {result.step}; nothing to train")
    return 0


# ---------------------------------------------------------------------------------------------- eval


@guarded("eval")
def cmd_eval(args) -> int:
    from posenc.cli import check_output_file
    from posenc.lab.checkpoint import load_model
    from posenc.lab.checks import check_choices, check_int
    from posenc.lab.data import load_corpus
    from posenc.lab.evaluate import EXTENSIONS, evaluate
    from posenc.lab.passkey import check_passkey_lengths
    from posenc.lab.report import gain_table, markdown_table, past_table, sliding_table

    _check_paths(args)
    if args.json:
        check_output_file("--json", args.json)
    check_int("probe_windows", args.probe_windows, minimum=0)
    if args.passkey_lens:
        check_passkey_lengths(args.passkey_lens, args.passkey_digits, args.passkey_style)
    model, state = load_model(args.ckpt, args.device)
    train_len = model.cfg.max_len
    lens = args.lens or [train_len * m for m in D.EVAL_COMMAND_MULTS]
    exts = tuple(args.extensions) if args.extensions is not None else tuple(EXTENSIONS)
    check_choices("extensions", exts, EXTENSIONS, empty_ok=True)
    corpus = args.corpus or state.get("corpus")
    data = load_corpus(corpus, cache_dir=args.cache_dir, min_val_tokens=max(lens) + train_len + 1)
    rows = evaluate(
        model,
        data.val,
        lens,
        train_len=train_len,
        max_tokens=args.eval_tokens,
        extensions=exts,
        protocols=("windows", "sliding", "past"),
        sliding_tokens=args.sliding_tokens,
        probe_windows=args.probe_windows,
    )
    dict_rows = [r.to_dict() for r in rows]
    report = {
        "checkpoint": str(args.ckpt),
        "train_len": train_len,
        "eval_lens": sorted(lens),
        "results": dict_rows,
    }
    print(markdown_table(dict_rows, sorted(lens), train_len))
    n, L = sorted(lens), train_len
    gain = gain_table(dict_rows, n, L) if args.probe_windows else ""
    for title, table in (
        ("positions past the training length only", past_table(dict_rows, n, L)),
        (
            f"sliding protocol: stride {L}, the last {L} tokens of each window scored",
            sliding_table(dict_rows, n, L),
        ),
        (f"far-context gain: ppl(last {L} tokens as context) / ppl(whole window)", gain),
    ):
        if table:
            print(f"\n{title}:\n{table}")
    if args.passkey_lens:
        report["passkey"] = _passkey(model, args, exts, data.val)
    if args.json:
        path = Path(args.json).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
    return 0


def _passkey(model, args, exts: tuple[str, ...], val) -> dict:
    """Passkey accuracy at ``--passkey-lens`` with its 95% Wilson interval, plain and with each extension
    that applies; printed and returned as ``{method: {"<len>": {"accuracy", "hits", "trials", "ci95"}}}``."""
    from posenc.lab.encodings import extensions_for
    from posenc.lab.passkey import passkey_report

    report = passkey_report(
        model,
        args.passkey_lens,
        [None, *extensions_for(model.cfg.encoding, exts)],
        trials=args.passkey_trials,
        filler=val if args.passkey_filler == "corpus" else None,
        digits=args.passkey_digits,
        seed=args.seed,
        style=args.passkey_style,
    )
    print(
        f"\npasskey retrieval, {args.passkey_digits}-digit key, {args.passkey_style!r} prompt, "
        f"{args.passkey_filler} filler (greedy, exact match; accuracy [95% Wilson interval] of "
        f"{args.passkey_trials}):"
    )
    for method, results in report.items():
        print(f"  {method:8s} " + "  ".join(r.cell() for r in results))
    return {method: {str(r.length): r.to_json() for r in results} for method, results in report.items()}


# ---------------------------------------------------------------------------------------------- sample


@guarded("sample")
def cmd_sample(args) -> int:
    import torch

    from posenc.lab.checkpoint import load_model
    from posenc.lab.checks import check_number
    from posenc.lab.tokenizer import decode, encode

    check_number("temperature", args.temperature, low=0, finite=True, why="0 means greedy")
    model, _ = load_model(args.ckpt, args.device)
    prompt = encode(args.prompt)
    if not prompt:
        prompt = [0]  # the file separator: "start of a file"
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    out = model.generate(
        torch.tensor([prompt], device=args.device),
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        generator=gen,
    )
    sys.stdout.write(decode(out[0].tolist()).replace("\x00", "\n") + "\n")
    return 0


# ---------------------------------------------------------------------------------------------- compare


@guarded("compare")
def cmd_compare(args) -> int:
    from posenc.lab.compare import run_compare
    from posenc.lab.config import settings_for

    _check_paths(args, args.out)
    settings = settings_for(
        args.preset,
        steps=args.steps,
        train_len=args.train_len,
        eval_mults=tuple(args.eval_mults) if args.eval_mults else None,
        schemes=tuple(args.schemes) if args.schemes is not None else None,  # "," is an empty list
        seed=args.seed,
        seeds=args.seeds,
        protocols=tuple(args.protocol) if args.protocol is not None else None,
        copy_fraction=args.copy_fraction,
        passkey_fraction=args.passkey_fraction,
        passkey_trials=args.passkey_trials,
    )
    result = run_compare(
        args.out,
        settings,
        corpus=args.corpus,
        cache_dir=args.cache_dir,
        device=args.device,
        jobs=args.jobs,
        progress=not args.no_progress,
        compile=args.compile,
    )
    print(result.table)
    print(f"\nwrote results.json, results.md, extrapolation.png to {args.out} ({result.wall_s:.0f} s)")
    return 0


def add_commands(subparsers) -> None:
    """Add train, eval, sample and compare to the ``posenc`` command."""
    _add_train(subparsers)
    _add_eval(subparsers)
    _add_sample(subparsers)
    _add_compare(subparsers)


def _add_train(subparsers) -> None:
    from posenc.cli import HelpFormatter
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
    p.add_argument(
        "--train-len", type=positive_int, default=D.TRAIN_LEN, help="training sequence length (bytes)"
    )
    p.add_argument("--steps", type=positive_int, default=D.STEPS, help="optimizer steps")
    p.add_argument(
        "--batch-size", type=positive_int, default=D.BATCH_SIZE, help="global batch, split across DDP ranks"
    )
    p.add_argument("--lr", type=float, default=D.LR, help="peak learning rate (AdamW)")
    p.add_argument("--warmup", type=int, default=D.WARMUP, help="linear warmup steps, then cosine decay")
    p.add_argument(
        "--weight-decay", type=float, default=D.WEIGHT_DECAY, help="AdamW weight decay on matrices"
    )
    p.add_argument(
        "--grad-clip", type=float, default=D.GRAD_CLIP, help="clip the gradient norm to this; 0 turns it off"
    )
    p.add_argument("--seed", type=int, default=D.SEED, help="initialisation and batch order")
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
    p.add_argument("--n-layer", type=positive_int, default=D.N_LAYER, help="transformer blocks")
    p.add_argument("--n-head", type=positive_int, default=D.N_HEAD, help="attention heads")
    p.add_argument("--d-model", type=positive_int, default=D.D_MODEL, help="model width")
    p.add_argument(
        "--ckpt-every", type=positive_int, default=D.CKPT_EVERY, help="checkpoint interval in steps"
    )
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
    from posenc.cli import HelpFormatter

    p = subparsers.add_parser(
        "eval",
        help="perplexity at several lengths, eval-time extensions, passkey retrieval",
        formatter_class=HelpFormatter,
    )
    p.add_argument("ckpt", help="run directory or checkpoint directory")
    _data_args(p)
    p.add_argument(
        "--lens",
        type=_int_list,
        help="evaluation lengths, e.g. 64,128,256 (default "
        f"{','.join(map(str, D.EVAL_COMMAND_MULTS))} x train length)",
    )
    p.add_argument(
        "--eval-tokens", type=positive_int, default=D.EVAL_TOKENS, help="validation tokens per length"
    )
    p.add_argument(
        "--extensions",
        type=_str_list,
        help="eval-time extensions, those that apply to the model's scheme are run (default: all of "
        "pi,ntk,dynamic,yarn for rope, bca for xpos, temp for none)",
    )
    p.add_argument("--passkey-lens", type=_int_list, help="passkey retrieval at these lengths, e.g. 128,256")
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
    p.add_argument(
        "--sliding-tokens",
        type=positive_int,
        default=D.SLIDING_TOKENS,
        help="tokens the sliding protocol scores per length",
    )
    p.add_argument(
        "--probe-windows",
        type=int,
        default=D.PROBE_WINDOWS,
        help="windows per length of the far-context-gain and copy probes; 0 skips them",
    )
    p.add_argument("--seed", type=int, default=D.SEED, help="the passkey keys and depths")
    p.add_argument("--json", help="also write the report as JSON here")
    p.set_defaults(func=cmd_eval)


def _add_sample(subparsers) -> None:
    from posenc.cli import HelpFormatter

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
    p.add_argument("--seed", type=int, default=0, help="the sampling generator's seed")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's)")
    p.set_defaults(func=cmd_sample)


def _add_compare(subparsers) -> None:
    from posenc.cli import HelpFormatter
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
        type=_int_list,
        help="evaluation lengths as multiples of the training length (default: the preset's)",
    )
    p.add_argument(
        "--schemes",
        type=_str_list,
        help="comma-separated encodings to compare (default: the classic none,sinusoidal,learned,rope,alibi; "
        "'all': every built-in, also t5,kerple,sandwich,fire; your own as package.module:function)",
    )
    p.add_argument("--seed", type=int, help="initialisation and batch order (default: the preset's, 0)")
    p.add_argument(
        "--seeds",
        type=positive_int,
        help="models per scheme, seeds --seed, --seed + 1, ...: tables show mean ± sd (default: 1)",
    )
    p.add_argument(
        "--protocol",
        type=_str_list,
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
        type=int,
        help=f"passkey prompts per length and model (a {D.PASSKEY_DIGITS}-digit key in corpus text); 0 skips "
        f"passkey (default: {D.PASSKEY_TRIALS})",
    )
    _compile_arg(p)
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.set_defaults(func=cmd_compare)
