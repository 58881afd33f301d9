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
    """Bars of ``mean`` with +-``half`` error bars; the lower end stops just above 0 (a log axis
    cannot draw it; none below a mean at or under 0, e.g. net CPU within idle noise) and a
    missing interval draws no error bar."""
    mean, half = np.asarray(mean, float), np.asarray(half, float)
    lower = np.where(np.isfinite(half), np.clip(np.minimum(half, mean * 0.999), 0, None), 0)
    upper = np.where(np.isfinite(half), half, 0)
    ax.bar(
        x,
        mean,
        width,
        yerr=[lower, upper],
        capsize=capsize,
        label=label,
        color=color,
        error_kw={"elinewidth": 1, "ecolor": "black"},
    )


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
    as JSON in ``Description``, no date, fixed hash salt); returns both paths."""
    png, svg = figure_paths(path)
    png.parent.mkdir(parents=True, exist_ok=True)
    text = {
        k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in provenance.items()
    }
    title = text.get("title", png.stem)
    description = json.dumps(provenance, sort_keys=True, default=str)
    with plt.rc_context({"svg.hashsalt": "luksbench"}):
        with replacing(png) as tmp:  # never written through a link standing there
            png_meta = {**text, "Title": title}
            fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight", metadata=png_meta)
        svg_meta = {"Title": title, "Description": description, "Date": None}
        with replacing(svg) as tmp:
            fig.savefig(tmp, format="svg", bbox_inches="tight", metadata=svg_meta)
    return [png, svg]
