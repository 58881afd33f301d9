"""House style of the figures and how they are saved: PNG + SVG with their provenance, free of
timestamps so re-renders are byte-stable."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import seaborn as sns

from luksbench.formats.layout import replacing

VERDICT_COLORS = {
    "significant": "#c0392b",
    "equivalent": "#27ae60",
    "inconclusive": "#7f8c8d",
    "insufficient": "#bdc3c7",
}
#: the decision by magnitude (loss.parquet's ``decision``, "undecided: ..." as undecided): the
#: one word per row that tables, figures and the paper lead with
DECISION_COLORS = {
    "material": "#c0392b",
    "moderate": "#e67e22",
    "negligible": "#27ae60",
    "moderate gain": "#5dade2",
    "material gain": "#2471a3",
    "undecided": "#7f8c8d",
    "insufficient": "#bdc3c7",
}
STYLE = {"style": "whitegrid", "context": "paper", "palette": "colorblind", "font_scale": 1.1}
DPI = 150


def house_style() -> None:
    """Apply the house style (seaborn whitegrid, paper context, colorblind palette)."""
    sns.set_theme(**STYLE)
    plt.rcParams.update({"svg.hashsalt": "luksbench", "figure.dpi": DPI, "savefig.bbox": "tight"})


def panels(rows: int, cols: int, width: float, height: float, **share):
    """(figure, 2-D array of axes): a ``rows`` x ``cols`` grid, ``width`` x ``height`` inches."""
    return plt.subplots(
        rows, cols, figsize=(width, height), squeeze=False, layout="constrained", **share
    )


def _fmt_log_tick(value: float, _pos=None) -> str:
    """Plain numbers on log axes (600, 2k) instead of 6x10^2; minor ticks only at 2 and 5."""
    if value <= 0:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value) + 1e-9)
    if round(mantissa, 6) not in (1, 2, 5):
        return ""
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


_plain_log_formatter = matplotlib.ticker.FuncFormatter(_fmt_log_tick)


def log_y(ax) -> None:
    """Log-scale y axis with plain tick labels."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(_plain_log_formatter)
    ax.yaxis.set_minor_formatter(_plain_log_formatter)


def interval_bars(ax, x, mean, half, width, color, label, capsize=3) -> None:
    """Bars of ``mean`` with +-``half`` error bars on a log axis. An interval whose lower end is
    at or below 0 cannot be drawn there: its whisker runs to the panel's bottom edge and ends in
    an arrow (the interval goes on below), never at an invented small value. A missing interval
    draws no error bar; a mean at or under 0 draws no bar (see :func:`mark_undrawable`)."""
    x, mean, half = (np.asarray(v, float) for v in (x, mean, half))
    ax.bar(x, np.where(mean > 0, mean, np.nan), width, label=label, color=color)
    log_intervals(ax, x, mean, mean - half, mean + half, capsize=capsize, color="black")


def log_intervals(ax, x, centre, low, high, capsize=3, color="black", vertical=True) -> None:
    """Intervals [low, high] around ``centre`` on a log axis (y, or x when not ``vertical``):
    closed ones as error bars, those whose lower end is at or below 0 as a whisker from the upper
    end down to the panel's edge with an arrow head: the axis cannot show where they end."""
    x, centre, low, high = (np.asarray(v, float) for v in (x, centre, low, high))
    shown = np.isfinite(centre) & (centre > 0) & np.isfinite(low) & np.isfinite(high)
    closed = shown & (low > 0)
    err = np.vstack([centre - low, high - centre])[:, closed]
    if closed.any():
        pos, val = (x[closed], centre[closed]) if vertical else (centre[closed], x[closed])
        bars = {"yerr" if vertical else "xerr": err}
        ax.errorbar(pos, val, **bars, fmt="none", capsize=capsize, ecolor=color, elinewidth=1)
    for xi, top in zip(x[shown & ~closed], high[shown & ~closed], strict=True):
        end, start = ((xi, 0), (xi, top)) if vertical else ((0, xi), (top, xi))
        coords = ("data", "axes fraction") if vertical else ("axes fraction", "data")
        arrow = {"arrowstyle": "-|>", "color": color, "lw": 1, "shrinkA": 0, "shrinkB": 0}
        ax.annotate("", xy=end, xycoords=coords, xytext=start, textcoords="data", arrowprops=arrow)
        cap = {"marker": "_" if vertical else "|", "markersize": 2 * capsize + 1}
        ax.plot(*start, color=color, linestyle="none", **cap)


def legend_below(fig, axes, title=None, ncols: int = 4, loc: str = "outside lower center") -> None:
    """One legend for all panels (each label once), by default below them: never collides with
    the title, however narrow the figure is."""
    handles = {}
    for ax in np.ravel(axes):
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), title=title, loc=loc, ncols=ncols)


def wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width))


def figure_paths(path: Path) -> list[Path]:
    """``[<path>.png, <path>.svg]`` (a .png/.svg suffix of ``path`` is dropped first; other dots,
    e.g. in a host name, stay part of the name)."""
    path = Path(path)
    if path.suffix in (".png", ".svg"):
        path = path.with_suffix("")
    return [path.parent / f"{path.name}.png", path.parent / f"{path.name}.svg"]


def save_figure(fig: matplotlib.figure.Figure, path: Path, provenance: dict) -> list[Path]:
    """Write ``<path>.png`` (every provenance key a tEXt chunk) and ``<path>.svg`` (the provenance
    as JSON in ``Description``, no date, fixed hash salt) from one layout (``fig``'s layout engine
    is then switched off: :func:`_laid_out`); returns both paths."""
    png, svg = figure_paths(path)
    png.parent.mkdir(parents=True, exist_ok=True)
    text = {
        k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in provenance.items()
    }
    title = text.get("title", png.stem)
    description = json.dumps(provenance, sort_keys=True, default=str)
    bbox = _laid_out(fig)
    with plt.rc_context({"svg.hashsalt": "luksbench"}):
        with replacing(png) as tmp:  # never written through a link standing there
            png_meta = {**text, "Title": title}
            fig.savefig(tmp, format="png", dpi=DPI, bbox_inches=bbox, metadata=png_meta)
        svg_meta = {"Title": title, "Description": description, "Date": None}
        with replacing(svg) as tmp:
            fig.savefig(tmp, format="svg", bbox_inches=bbox, metadata=svg_meta)
    return [png, svg]


def _laid_out(fig: matplotlib.figure.Figure):
    """Lay ``fig`` out once and freeze it: its tight bounding box (inches, padded as savefig
    pads it). Both formats are then saved from that one layout: ``bbox_inches="tight"`` and the
    constrained layout would each draw the figure again per format (most of the drawing time)."""
    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    if fig.get_layout_engine() is not None:
        fig.set_layout_engine("none")
    return box.padded(plt.rcParams["savefig.pad_inches"])
