"""CLI subcommands of the laboratory: ``posenc train``, ``eval``, ``sample``, ``compare``.

Each handler returns an exit code. Bad input (a :class:`LabError` or ``ValueError`` from the core)
becomes a one-line message on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from posenc.cli import guarded
from posenc.lab import defaults as D


def _check_paths(args, out_dir: str | None = None) -> None:
    """Refuse output and cache paths that cannot be written, and a corpus that cannot be read, before any
    work starts."""
    from posenc.cli import check_output_dir
    from posenc.lab.data import check_corpus_path

    if out_dir is not None:
        check_output_dir("--out", out_dir)
    if getattr(args, "cache_dir", None) is not None:
        check_output_dir("--cache-dir", args.cache_dir)
    if getattr(args, "corpus", None) is not None:
        try:
            check_corpus_path(args.corpus)
        except ValueError as e:
            raise type(e)(f"--corpus: {e}") from None


def _load_checkpoint(args):
    """``(model, state)`` of the positional ``ckpt``; a bad one is refused naming the argument."""
    from posenc.lab.checkpoint import load_model
    from posenc.lab.errors import CheckpointError

    try:
        return load_model(args.ckpt, args.device)
    except (ValueError, OSError) as e:  # missing, not a run, unreadable, or a config that does not build
        raise CheckpointError(f"CKPT: {e}") from None


# ---------------------------------------------------------------------------------------------- train


@guarded("train", resume="rerun with --resume")
def cmd_train(args) -> int:
    from posenc.lab.checkpoint import latest_checkpoint
    from posenc.lab.config import GPTConfig, TrainConfig
    from posenc.lab.train import train
    from posenc.runs.flags import flag_values

    _check_paths(args, args.out)
    model_cfg = GPTConfig(**flag_values(GPTConfig, args))
    train_cfg = TrainConfig(**flag_values(TrainConfig, args))
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
        context_parallel=args.context_parallel,
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
    from posenc.lab.checks import check_choices
    from posenc.lab.data import load_corpus
    from posenc.lab.eval_config import EVAL_COMMAND_FLAGS, EvalConfig
    from posenc.lab.evaluate import EXTENSIONS, evaluate
    from posenc.lab.passkey import check_passkey_lengths
    from posenc.runs.flags import flag_values

    _check_paths(args)
    if args.json:
        check_output_file("--json", args.json)
    measures = EvalConfig(**flag_values(EvalConfig, args, EVAL_COMMAND_FLAGS))  # checked before any work
    if args.passkey_lens:
        check_passkey_lengths(args.passkey_lens, args.passkey_digits, args.passkey_style)
    model, state = _load_checkpoint(args)
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
        max_tokens=measures.eval_tokens,
        extensions=exts,
        protocols=measures.protocols,
        sliding_tokens=measures.sliding_tokens,
        probe_windows=measures.probe_windows,
    )
    dict_rows = [r.to_dict() for r in rows]
    report = {
        "checkpoint": str(args.ckpt),
        "train_len": train_len,
        "eval_lens": sorted(lens),
        "results": dict_rows,
    }
    _print_tables(dict_rows, sorted(lens), train_len, gain=bool(measures.probe_windows))
    if args.passkey_lens:
        report["passkey"] = _passkey(model, args, exts, data.val)
    if args.json:
        path = Path(args.json).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
    return 0


def _print_tables(dict_rows: list[dict], n: list[int], L: int, *, gain: bool) -> None:
    """The windows protocol's table, then those of the past and sliding protocols and the gain probe."""
    from posenc.lab.report import gain_table, markdown_table, past_table, sliding_table

    print(markdown_table(dict_rows, n, L))
    for title, table in (
        ("positions past the training length only", past_table(dict_rows, n, L)),
        (
            f"sliding protocol: stride {L}, the last {L} tokens of each window scored",
            sliding_table(dict_rows, n, L),
        ),
        (
            f"far-context gain: ppl(last {L} tokens as context) / ppl(whole window)",
            gain_table(dict_rows, n, L) if gain else "",
        ),
    ):
        if table:
            print(f"\n{title}:\n{table}")


def _passkey(model, args, exts: tuple[str, ...], val) -> dict:
    """Passkey accuracy at ``--passkey-lens`` with its 95% Wilson interval, plain and with each extension
    that applies; printed and returned as ``{method: {"<len>": {"accuracy", "hits", "trials", "ci95"}}}``."""
    from posenc.lab.encodings import model_extensions
    from posenc.lab.passkey import passkey_report

    report = passkey_report(
        model,
        args.passkey_lens,
        [None, *model_extensions(model.cfg, exts)],
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

    from posenc.lab.checks import check_number
    from posenc.lab.tokenizer import decode, encode

    check_number("temperature", args.temperature, low=0, finite=True, why="0 means greedy")
    _check_paths(args)
    model, _ = _load_checkpoint(args)
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
    from posenc.lab.config import Settings, settings_for
    from posenc.lab.errors import LabError
    from posenc.runs.flags import flag_values

    _check_paths(args, args.out)
    for flag, value in (("--recipes", args.recipes), ("--extend-to", args.extend_to)):
        if value is not None and not args.extend_steps:  # else ignored: say so rather than run nothing
            given = ",".join(value) if isinstance(value, list) else value
            raise LabError(
                f"{flag} {given} needs --extend-steps K > 0 (the steps each recipe continues a RoPE model); "
                f"without it no recipe runs"
            )
    settings = settings_for(args.preset, **flag_values(Settings, args))  # None: the preset's
    result = run_compare(
        args.out,
        settings,
        corpus=args.corpus,
        cache_dir=args.cache_dir,
        device=args.device,
        jobs=args.jobs,
        progress=not args.no_progress,
        compile=args.compile,
        context_parallel=args.context_parallel,
    )
    print(result.table)
    print(f"\nwrote results.json, results.md, extrapolation.png to {args.out} ({result.wall_s:.0f} s)")
    return 0
