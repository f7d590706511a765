"""``posenc compare``: train every encoding the same way at a short length, evaluate each at longer ones.

The reproduction of the ALiBi paper's headline figure (Press et al. 2021, fig. 1) and of the chapter's
length-extrapolation section at toy scale: same corpus, seed, model size, steps and batches for
every scheme; only the positional encoding differs. RoPE is additionally evaluated with eval-time
context extensions (PI, NTK, YaRN) at factor = eval length / train length.

Output in ``--out``:
    results.json       {"train_len", "eval_lens", "corpus", "results": [{"scheme", "ppl", "note"}]}
    results.md         the table (also printed), plus the loss on positions past the training length
    details.json       per-scheme perplexity past the training length, settings, timings
    extrapolation.png  perplexity vs evaluation length, log scale
    models/<scheme>/   each model's checkpoints and eval.json: a killed compare resumes, skipping finished work

Models train in parallel worker processes (one thread each on CPU, all schemes at once by default), which
on a small CPU is faster than one process using all cores for these small matrices, and is robust to
other load on the machine. Results do not depend on --jobs.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import queue
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from posenc.lab.checkpoint import write_text_atomic
from posenc.lab.data import load_corpus
from posenc.lab.errors import LabError
from posenc.lab.evaluate import EXTENSIONS, check_lengths, perplexities
from posenc.lab.model import ENCODINGS, GPTConfig
from posenc.lab.train import TrainConfig, check_device, is_complete, load_model, train

SCHEMES = ("none", "sinusoidal", "learned", "rope", "alibi")
COMPARE_EXTENSIONS = ("pi", "ntk", "yarn")


@dataclass(frozen=True)
class Settings:
    """Everything that defines a comparison. Presets are instances; CLI flags override fields."""

    train_len: int = 64
    eval_mults: tuple[int, ...] = (1, 2, 4, 8, 16)
    steps: int = 1200
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 50
    n_layer: int = 4
    n_head: int = 8
    d_model: int = 128
    eval_tokens: int = 32768
    seed: int = 0
    schemes: tuple[str, ...] = SCHEMES
    extensions: tuple[str, ...] = COMPARE_EXTENSIONS
    ckpt_every: int = 100

    def __post_init__(self):
        unknown = [s for s in self.schemes if s not in ENCODINGS]
        if unknown or not self.schemes:
            raise LabError(
                f"schemes={list(self.schemes)!r}: unknown {unknown}; allowed: {', '.join(sorted(ENCODINGS))}"
            )
        bad = [e for e in self.extensions if e not in EXTENSIONS]
        if bad:
            raise LabError(
                f"extensions={list(self.extensions)!r}: unknown {bad}; allowed: {', '.join(EXTENSIONS)}"
            )
        check_lengths("eval_mults", self.eval_mults)
        for name in ("train_len", "eval_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LabError(f"{name}={v!r} must be a positive integer")

    @property
    def eval_lens(self) -> list[int]:
        return [self.train_len * m for m in sorted(self.eval_mults)]

    def model_config(self, scheme: str) -> GPTConfig:
        return GPTConfig(
            encoding=scheme,
            n_layer=self.n_layer,
            n_head=self.n_head,
            d_model=self.d_model,
            max_len=self.train_len,
        )

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            steps=self.steps, batch_size=self.batch_size, lr=self.lr, warmup=self.warmup, seed=self.seed
        )


PRESETS: dict[str, Settings] = {
    # Seconds, for tests: proves the pipeline, measures nothing.
    "tiny": Settings(
        train_len=16,
        eval_mults=(1, 2, 4),
        steps=4,
        batch_size=4,
        warmup=1,
        n_layer=1,
        n_head=2,
        d_model=16,
        eval_tokens=256,
        ckpt_every=2,
    ),
    # Under 10 minutes on 2 CPU cores, training and evaluation together.
    "quick": Settings(),
    # A GPU (--device cuda): longer training length, bigger model, more steps and evaluation tokens.
    "gpu": Settings(
        train_len=256,
        eval_mults=(1, 2, 4, 8, 16),
        steps=4000,
        batch_size=64,
        lr=1e-3,
        warmup=200,
        n_layer=6,
        n_head=8,
        d_model=384,
        eval_tokens=262144,
        ckpt_every=500,
    ),
}


def settings_for(preset: str, **overrides) -> Settings:
    """A preset with some fields replaced (None values are ignored)."""
    if preset not in PRESETS:
        raise LabError(f"preset={preset!r} is not known; allowed: {', '.join(PRESETS)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return replace(PRESETS[preset], **overrides)


# ---------------------------------------------------------------------------------------------- workers


def _worker_init(threads: int) -> None:
    torch.set_num_threads(threads)


def _train_and_eval(
    scheme: str,
    s: Settings,
    out: str,
    corpus: str | None,
    cache_dir: str | None,
    device: str,
    events,
    extension: str | None = None,
) -> dict:
    """One task in a worker process: train a scheme (if needed) and evaluate its own row, or, with
    ``extension``, evaluate an already trained RoPE model with that eval-time extension. Returns the row.

    Each row is saved under ``models/<scheme>/`` keyed by the settings, so a rerun skips it.
    """
    run_dir = Path(out) / "models" / scheme
    label = scheme + (f"+{extension}" if extension else "")
    eval_path = run_dir / (f"eval-{extension}.json" if extension else "eval.json")
    key = {"settings": _settings_json(s), "corpus": corpus}
    if eval_path.exists():
        saved = json.loads(eval_path.read_text())
        if saved.get("key") == key:
            events.put(("done", label, "cached"))
            return saved["row"]
    data = load_corpus(corpus, cache_dir=cache_dir)
    t0 = time.perf_counter()
    if extension is None and not is_complete(run_dir, s.steps):
        train(
            s.model_config(scheme),
            s.train_config(),
            run_dir,
            corpus=data,
            resume=True,
            ckpt_every=s.ckpt_every,
            device=device,
            progress=False,
            callback=lambda step, loss, tps: events.put(("step", scheme, step, loss, tps)),
        )
    train_s = time.perf_counter() - t0
    model, _ = load_model(run_dir, device)
    events.put(("eval", label, None))
    t1 = time.perf_counter()
    r = perplexities(
        model,
        data.val,
        s.eval_lens,
        train_len=s.train_len,
        max_tokens=s.eval_tokens,
        extension=extension,
        progress=lambda what: events.put(("eval", label, what.split(" @ ")[-1])),
    )
    row = {
        "scheme": r.scheme,
        "ppl": {str(k): v for k, v in r.ppl.items()},
        "ppl_past": {str(k): v for k, v in r.ppl_past.items()},
        "note": r.note,
        "train_s": round(train_s, 1),
        "eval_s": round(time.perf_counter() - t1, 1),
    }
    write_text_atomic(eval_path, json.dumps({"key": key, "row": row}, indent=2))
    events.put(("done", label, None))
    return row


def _settings_json(s: Settings) -> dict:
    d = asdict(s)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


class _InlineQueue:
    """The queue interface for jobs=1: events go straight to the progress display."""

    def __init__(self, sink):
        self.sink = sink

    def put(self, event):
        self.sink(event)


# ---------------------------------------------------------------------------------------------- driver


@dataclass
class CompareResult:
    settings: Settings
    rows: list[dict]
    wall_s: float
    out: Path
    table: str = field(default="")


def run_compare(
    out: str | os.PathLike,
    settings: Settings,
    *,
    corpus: str | None = None,
    cache_dir: str | None = None,
    device: str = "cpu",
    jobs: int | None = None,
    progress: bool = True,
) -> CompareResult:
    """Train and evaluate every scheme of ``settings``, write the report files into ``out``."""
    t0 = time.perf_counter()
    check_device(device)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # Load once here: errors about the corpus surface before any worker starts, and the token cache is built once.
    data = load_corpus(
        corpus,
        cache_dir=cache_dir,
        min_train_tokens=settings.train_len * settings.batch_size + 2,
        min_val_tokens=max(settings.eval_lens) + 1,
    )
    corpus_path = str(Path(data.path).resolve())
    cores = os.cpu_count() or 1
    if jobs is None:
        # On CPU all schemes train at once, one thread each: the cores are shared fairly and no core
        # idles at the end waiting for a last model (5 models on 2 workers would leave one alone).
        jobs = 1 if device != "cpu" else max(1, min(len(settings.schemes), 8))
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise LabError(f"jobs={jobs!r} must be a positive integer")
    threads = max(1, cores // jobs) if device == "cpu" else torch.get_num_threads()

    # RoPE first (it has extension evaluations to follow); its extensions are separate tasks, queued as
    # soon as it is trained, so they run in parallel instead of one after another in one worker.
    order = sorted(settings.schemes, key=lambda s: (s != "rope", s != "alibi", s == "learned", s))
    followups = {"rope": list(settings.extensions)} if "rope" in settings.schemes else {}
    display = _Progress(settings, order, enabled=progress)
    rows: dict[tuple[str, str | None], dict] = {}
    common = (settings, str(out), corpus, cache_dir, device)
    if jobs == 1:
        sink = _InlineQueue(display.handle)
        for scheme in order:
            rows[scheme, None] = _train_and_eval(scheme, *common, sink)
            for ext in followups.get(scheme, []):
                rows[scheme, ext] = _train_and_eval(scheme, *common, sink, ext)
    else:
        ctx = mp.get_context("spawn")
        with ctx.Manager() as manager:
            events = manager.Queue()
            with ProcessPoolExecutor(
                jobs, mp_context=ctx, initializer=_worker_init, initargs=(threads,)
            ) as pool:
                tasks = {pool.submit(_train_and_eval, sc, *common, events): (sc, None) for sc in order}
                while tasks:
                    try:
                        display.handle(events.get(timeout=0.5))
                    except queue.Empty:
                        pass
                    for f in [f for f in tasks if f.done()]:
                        scheme, ext = tasks.pop(f)
                        rows[scheme, ext] = f.result()  # re-raises a worker's error here
                        if ext is None:
                            for follow in followups.get(scheme, []):
                                tasks[pool.submit(_train_and_eval, scheme, *common, events, follow)] = (
                                    scheme,
                                    follow,
                                )
                while True:
                    try:
                        display.handle(events.get_nowait())
                    except queue.Empty:
                        break
    display.close()

    ordered = [rows[sc, ext] for sc in settings.schemes for ext in [None, *followups.get(sc, [])]]
    wall = time.perf_counter() - t0
    result = CompareResult(settings=settings, rows=ordered, wall_s=wall, out=out)
    write_reports(result, corpus_path, device)
    return result


class _Progress:
    """One tqdm bar over all training steps of all schemes; the postfix says what each worker is doing."""

    def __init__(self, settings: Settings, order, enabled: bool):
        self.enabled = enabled
        self.steps = {s: 0 for s in order}
        self.status: dict[str, str] = {}
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=settings.steps * len(order), desc="compare", unit="step", dynamic_ncols=True
            )

    def handle(self, event) -> None:
        kind, scheme = event[0], event[1]
        if kind == "step":
            _, _, step, loss, tps = event
            delta, self.steps[scheme] = step - self.steps[scheme], step
            self.status[scheme] = f"{loss:.2f} {tps:,.0f}tok/s"
            if self.bar is not None:
                self.bar.update(max(0, delta))
        elif kind == "eval":
            self.status[scheme] = f"eval {event[2] or ''}".strip()
        elif kind == "done":
            self.status.pop(scheme, None)
            if self.bar is not None and event[2] == "cached":
                self.bar.write(f"{scheme}: already trained and evaluated, reusing")
        if self.bar is not None:
            self.bar.set_postfix_str(" | ".join(f"{k}: {v}" for k, v in self.status.items()))

    def close(self):
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------------------------------------- reports


def ratio(row: dict, num: int, den: int) -> float | None:
    a, b = row["ppl"].get(str(num)), row["ppl"].get(str(den))
    return a / b if a is not None and b is not None else None


def _fmt(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def markdown_table(rows: list[dict], eval_lens: list[int], train_len: int) -> str:
    """The main table: perplexity at each length, and ppl(4L)/ppl(L) when 4L was evaluated."""
    has4 = 4 * train_len in eval_lens
    head = ["scheme"] + [
        f"ppl@{n} ({n // train_len}x)" if n % train_len == 0 else f"ppl@{n}" for n in eval_lens
    ]
    head += ["ppl(4L)/ppl(L)"] if has4 else []
    head += ["note"]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(head) - 2) + ["---"]) + "|",
    ]
    for r in rows:
        cells = [r["scheme"]] + [_fmt(r["ppl"].get(str(n))) for n in eval_lens]
        if has4:
            cells.append(_fmt(ratio(r, 4 * train_len, train_len), 3))
        cells.append((r.get("note") or "").replace("|", "/"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def past_table(rows: list[dict], eval_lens: list[int], train_len: int) -> str:
    longer = [n for n in eval_lens if n > train_len]
    if not longer:
        return ""
    head = ["scheme"] + [f"ppl past {train_len} @{n}" for n in longer]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * len(longer)) + "|"]
    for r in rows:
        lines.append(
            "| " + " | ".join([r["scheme"]] + [_fmt(r["ppl_past"].get(str(n))) for n in longer]) + " |"
        )
    return "\n".join(lines)


def write_reports(result: CompareResult, corpus: str, device: str) -> None:
    s, out = result.settings, result.out
    eval_lens = s.eval_lens
    payload = {
        "train_len": s.train_len,
        "eval_lens": eval_lens,
        "corpus": corpus,
        "results": [
            {
                "scheme": r["scheme"],
                "ppl": {str(n): r["ppl"].get(str(n)) for n in eval_lens},
                "note": r["note"],
            }
            for r in result.rows
        ],
    }
    write_text_atomic(out / "results.json", json.dumps(payload, indent=2))
    details = {
        "settings": _settings_json(s),
        "device": device,
        "wall_s": round(result.wall_s, 1),
        "rows": result.rows,
    }
    write_text_atomic(out / "details.json", json.dumps(details, indent=2))
    table = markdown_table(result.rows, eval_lens, s.train_len)
    md = [
        "# posenc compare: train short, test long",
        "",
        f"Trained at length {s.train_len} on `{corpus}` for {s.steps} steps of {s.batch_size} sequences "
        f"({s.n_layer} layers, d={s.d_model}, {s.n_head} heads, seed {s.seed}); perplexity (bytes) on "
        f"non-overlapping validation windows of each length, {s.eval_tokens} tokens per length. "
        f"rope+X: eval-time extension at factor = length / {s.train_len}. Wall time {result.wall_s:.0f} s on {device}.",
        "",
        table,
        "",
    ]
    past = past_table(result.rows, eval_lens, s.train_len)
    if past:
        md += ["Perplexity on positions at or past the training length only:", "", past, ""]
    write_text_atomic(out / "results.md", "\n".join(md))
    plot(payload, out / "extrapolation.png")
    result.table = table


def plot(payload: dict, path: Path) -> None:
    """Perplexity vs evaluation length (log-log), one line per scheme, the training length marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in payload["results"]:
        pts = [(int(n), v) for n, v in r["ppl"].items() if v is not None and math.isfinite(v)]
        if not pts:
            continue
        xs, ys = zip(*sorted(pts), strict=True)
        style = "--" if "+" in r["scheme"] else "-"
        ax.plot(xs, ys, style, marker="o", label=r["scheme"])
    ax.axvline(payload["train_len"], color="grey", lw=1, ls=":", label=f"train length {payload['train_len']}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity (bytes)")
    ax.set_title("Length extrapolation: trained short, evaluated long")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
