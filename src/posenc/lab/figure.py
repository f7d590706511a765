"""The comparison's plot: perplexity and far-context gain against evaluation length, and passkey
accuracy and associative recall when they were measured, one line per scheme, from the content of results.json
(:func:`posenc.lab.report.results_payload`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from posenc.lab.stats import pooled_wilson

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["extrapolation_figure"]


def _points(r: dict, name: str) -> tuple[list[int], list[float], list[float]]:
    """Lengths, values and sds (0 where unknown) of the finite values of ``r[name]``, by length."""
    sds = r.get(f"{name}_sd") or {}
    pts = sorted(
        (int(n), v, sds.get(n) or 0.0)
        for n, v in (r.get(name) or {}).items()
        if v is not None and math.isfinite(v)
    )
    return [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]


def _passkey_interval(r: dict, trials: int) -> tuple[list[int], list[float], list[list[float]]]:
    """Lengths, accuracies and ``[below, above]`` distances to the 95% Wilson interval (all seeds' trials)."""
    xs, ys, _ = _points(r, "passkey")
    bounds = [pooled_wilson(r, y, trials) for y in ys]
    below = [y - low for y, (low, _) in zip(ys, bounds, strict=True)]
    above = [high - y for y, (_, high) in zip(ys, bounds, strict=True)]
    return xs, ys, [below, above]


def extrapolation_figure(payload: dict) -> Figure:
    """Perplexity vs evaluation length (log-log) and far-context gain vs length; passkey accuracy and the
    recall probe's exact answers vs length as further panels when they were measured.

    ``payload`` is the content of results.json. One line per scheme, extensions (``scheme+X``) dashed,
    recipes (``scheme~R``) dash-dotted,
    error bars of one seed sd where there are several seeds (the 95% Wilson interval for passkey
    accuracy), the training length marked; schemes with nothing finite to draw are left out of a panel.
    The figure is not attached to pyplot.
    """
    from matplotlib.figure import Figure  # the lab's optional dependency, imported when used

    rows = payload["results"]
    trials = payload.get("passkey_trials") or 0
    names = ["ppl", "gain"] + (["passkey"] if trials and any(_points(r, "passkey")[0] for r in rows) else [])
    names += ["recall"] if any(_points(r, "recall")[0] for r in rows) else []
    legend_rows = math.ceil((len(rows) + 1) / 6)
    fig = Figure(figsize=((6 if len(names) < 4 else 5) * len(names), 4.5 + 0.22 * legend_rows), dpi=120)
    panels = dict(zip(names, fig.subplots(1, len(names)), strict=True))
    _draw_rows(panels, rows, trials)
    _label_panels(panels, payload["train_len"])
    inch = 1.0 / fig.get_figheight()  # one inch in figure coordinates
    panels["ppl"].legend(
        loc="upper center",
        bbox_to_anchor=(0.5, (0.12 + 0.22 * legend_rows) * inch),
        bbox_transform=fig.transFigure,
        ncol=6,
        fontsize=8,
        frameon=False,
    )
    fig.subplots_adjust(
        left=0.08 / len(names) * 2,
        right=0.98,
        top=0.93,
        bottom=(0.7 + 0.22 * legend_rows) * inch,
        wspace=0.25,
    )
    return fig


def _draw_rows(panels: dict, rows: list[dict], trials: int) -> None:
    """One line per row in every panel that has finite values of it, with its error bars."""
    from matplotlib import colormaps

    # 20 distinct colours (ten would repeat with `--schemes all`), one per row in every panel; one legend
    # for all, below them, so that no line is hidden behind it
    colours = colormaps["tab20"].colors
    for i, r in enumerate(rows):
        style = "--" if "+" in r["scheme"] else "-." if "~" in r["scheme"] else "-"
        colour = colours[(2 * i) % 20 + (2 * i) // 20 % 2]  # dark shades first, then the light ones
        for name, panel in panels.items():
            if name == "passkey":
                xs, ys, bars = _passkey_interval(r, trials)
            else:
                xs, ys, sds = _points(r, name)
                bars = sds if any(sds) else None
            if not xs:
                continue
            panel.plot(xs, ys, style, marker="o", color=colour, label=r["scheme"])
            if bars is not None:
                panel.errorbar(xs, ys, yerr=bars, fmt="none", ecolor=colour, capsize=0)


def _label_panels(panels: dict, train_len: int) -> None:
    """Axes, titles, the training length and the reference lines of each panel."""
    ax, gx = panels["ppl"], panels["gain"]
    ax.axvline(train_len, color="grey", lw=1, ls=":", label=f"train length {train_len}")
    ax.set_yscale("log")
    ax.set_ylabel("perplexity (bytes)")
    ax.set_title("Length extrapolation: trained short, evaluated long", fontsize=10)
    reference = gx.axhline(1.0, color="grey", lw=1, ls=":", label="no gain (a window of the training length)")
    gx.set_ylabel(f"ppl(last {train_len} as context) / ppl(whole window)")
    gx.set_title("Far-context gain: above 1, tokens past the training length help", fontsize=10)
    gx.legend(handles=[reference], fontsize=8)
    # the accuracy panels: a share between 0 and 1 against length
    accuracies = {
        "passkey": ("passkey accuracy (95% Wilson interval)", "Passkey retrieval: a key hidden in the text"),
        "recall": ("recall: values answered exactly", "Associative recall: pairs read from far back"),
    }
    for name, (ylabel, title) in accuracies.items():
        if name in panels:
            panels[name].axvline(train_len, color="grey", lw=1, ls=":")
            panels[name].set_ylim(-0.03, 1.03)
            panels[name].set_ylabel(ylabel)
            panels[name].set_title(title, fontsize=10)
    for panel in panels.values():
        panel.set_xscale("log", base=2)
        panel.set_xlabel("evaluation length (tokens)")
        panel.grid(True, which="both", alpha=0.3)
