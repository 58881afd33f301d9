"""Figures: one house style, functions that take DataFrames and return matplotlib figures.

``throughput_figure``  SCS-style grouped bars for one rw pattern: block size on x, one bar per stack,
                       log-scale y, mean over repetitions with a t-interval, one panel per iodepth.
``loss_figure``        loss / increase in % per cell with its confidence interval, one panel per metric.
``loss_heatmap``       block size x rw per stack and iodepth, annotated with loss [CI] and verdict.
``latency_figure``     completion-latency percentile curves from the json+ histograms, per stack.
``cpu_figure``         CPU seconds per GiB by block size, per stack (rw x iodepth panels).
``cipher_figure``      ``cryptsetup benchmark`` cipher throughput bars.
``ceiling_figure``     measured encrypted bandwidth under the crypto ceiling (cipher speed x CPUs),
                       or, when the cipher benchmark is unavailable, the reason written on the figure.
``hosts_figure``       several test boxes side by side: effect per cell and host with its interval.
``compare_figure``     ``luksbench compare``: change from run A to run B per cell with its interval.
``save_figure``        PNG (provenance as text chunks) + SVG (provenance in the metadata), both
                       free of timestamps so re-renders are byte-stable.
``make_figures``       all of the above for one processed run folder.

Every figure carries its provenance: run, figure name, drawing function, SHA-256 of the input
tables, git commit, config hash (of the plan in env.json), fio and cryptsetup versions, notebook.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd
import seaborn as sns
from scipy import stats as sps

from luksbench.formats.layout import bs_label

METRIC_LABELS = {
    "bw_bytes": ("Bandwidth", "MiB/s", 2**20),
    "iops": ("IOPS", "IO/s", 1),
    "clat_p99_ns": ("p99 completion latency", "ms", 1e6),
    "clat_p50_ns": ("median completion latency", "ms", 1e6),
    "clat_mean_ns": ("mean completion latency", "ms", 1e6),
    "clat_p999_ns": ("p99.9 completion latency", "ms", 1e6),
    "lat_mean_ns": ("mean latency", "ms", 1e6),
    "busy_cpu_s_per_gib": ("CPU time per GiB", "CPU s/GiB", 1),
    "sys_cpu_s_per_gib": ("system CPU time per GiB", "CPU s/GiB", 1),
}
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


def metric_label(metric: str) -> str:
    name, unit, _ = METRIC_LABELS.get(metric, (metric, "", 1))
    return f"{name} ({unit})" if unit else name


# ----------------------------------------------------------------------------------------- saving


def _provenance_text(provenance: dict) -> dict[str, str]:
    return {
        str(k): v if isinstance(v, str) else json.dumps(v, sort_keys=True)
        for k, v in provenance.items()
    }


def figure_paths(path: Path) -> list[Path]:
    """``[<path>.png, <path>.svg]`` (a .png/.svg suffix of ``path`` is dropped first; other dots,
    e.g. in a host name, stay part of the name)."""
    path = Path(path)
    if path.suffix in (".png", ".svg"):
        path = path.with_suffix("")
    return [path.parent / f"{path.name}.png", path.parent / f"{path.name}.svg"]


def save_figure(fig: matplotlib.figure.Figure, path: Path, provenance: dict) -> list[Path]:
    """Write ``<path>.png`` and ``<path>.svg`` (``path`` without suffix); returns both paths.

    PNG: every provenance key becomes a tEXt chunk (plus ``Software``/``Title``). SVG: the provenance
    as JSON in ``Description``, no date, fixed hash salt.
    """
    png, svg = figure_paths(path)
    png.parent.mkdir(parents=True, exist_ok=True)
    text = _provenance_text(provenance)
    title = text.get("title", png.stem)
    with plt.rc_context({"svg.hashsalt": "luksbench"}):
        fig.savefig(png, dpi=DPI, bbox_inches="tight", metadata={**text, "Title": title})
        fig.savefig(
            svg,
            bbox_inches="tight",
            metadata={
                "Title": title,
                "Description": json.dumps(provenance, sort_keys=True, default=str),
                "Date": None,
            },
        )
    return [png, svg]


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------- throughput


def _fmt_log_tick(value: float, _pos=None) -> str:
    """Plain numbers on log axes (600, 2k) instead of 6x10^2; minor ticks only at 2 and 5."""
    if value <= 0:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value) + 1e-9)
    if round(mantissa, 6) not in (1, 2, 5):
        return ""
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


_plain_log_formatter = matplotlib.ticker.FuncFormatter(_fmt_log_tick)


def rep_summary(fio: pd.DataFrame, metric: str, confidence: float = 0.95) -> pd.DataFrame:
    """Mean over repetitions per (host, stack, pattern, rw, bs_bytes, iodepth, direction) with a
    t-interval.

    Multi-entry jobs are combined first as in :func:`luksbench.analysis.stats.rep_values`.
    """
    from luksbench.analysis.stats import CELL_KEYS, rep_values

    vals = rep_values(fio, [metric])
    keys = ["host", "stack", "pattern", "rw", "bs_bytes", "iodepth", "direction", "job_slot"]
    rows = []
    for key, g in vals.groupby(keys, sort=True, dropna=False):
        v = pd.to_numeric(g[metric], errors="coerce").dropna().to_numpy(float)
        n = v.size
        mean = float(v.mean()) if n else math.nan
        if n >= 2:
            half = (
                float(sps.t.ppf(0.5 + confidence / 2, n - 1)) * float(v.std(ddof=1)) / math.sqrt(n)
            )
        else:
            half = math.nan
        rows.append({**dict(zip(keys, key, strict=True)), "n": n, "mean": mean, "ci_half": half})
    assert set(CELL_KEYS) - {"workload"} <= set(keys)
    return pd.DataFrame(rows)


def throughput_figure(
    fio: pd.DataFrame,
    rw: str,
    metric: str = "bw_bytes",
    stacks: Iterable[str] | None = None,
    confidence: float = 0.95,
    host: str | None = None,
    pattern: str | None = None,
) -> matplotlib.figure.Figure:
    """Grouped bars for one rw pattern: block size on x, stacks side by side, log y, one panel per
    iodepth; bar = mean over repetitions, error bar = t-interval (lower end clipped for the log axis).

    ``pattern``: only the cells of that config pattern ("" = the main matrix); None = all, cells of
    different patterns kept apart as separate bar groups."""
    from luksbench.analysis.stats import with_pattern

    house_style()
    df = with_pattern(fio[fio["rw"] == rw])
    if host is not None:
        df = df[df["host"] == host]
    if pattern is not None:
        df = df[df["pattern"] == pattern]
    summ = rep_summary(df, metric, confidence)
    if summ.empty:
        raise ValueError(f"no {rw} results to plot")
    stacks = list(stacks) if stacks is not None else sorted(summ["stack"].unique())
    summ = summ[summ["stack"].isin(stacks)]
    # several directions (randrw) or hosts: sum of none — keep them apart as separate bar groups
    summ = summ.assign(group=summ["bs_bytes"].map(bs_label))
    if summ["direction"].nunique() > 1:
        summ["group"] = summ["group"] + " " + summ["direction"]
    if summ["host"].nunique() > 1:
        summ["group"] = summ["host"] + " " + summ["group"]
    if summ["job_slot"].nunique() > 1:
        summ["group"] = summ["group"] + " #" + summ["job_slot"].astype(str)
    if summ["pattern"].nunique() > 1:
        tag = summ["pattern"].astype(str).map(lambda p: f" [{p}]" if p else "")
        summ["group"] = summ["group"].astype(str) + tag
    depths = sorted(summ["iodepth"].unique())
    _, _, scale = METRIC_LABELS.get(metric, (metric, "", 1))
    colors = dict(zip(stacks, sns.color_palette(n_colors=len(stacks)), strict=True))
    fig, axes = plt.subplots(
        1,
        len(depths),
        figsize=(max(4.0, 3.2 * len(depths)) + 1.2, 3.8),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    width = 0.8 / max(1, len(stacks))
    for ax, qd in zip(axes[0], depths, strict=True):
        sub = summ[summ["iodepth"] == qd]
        order = sub.sort_values(["bs_bytes", "group"])["group"].drop_duplicates().tolist()
        x = np.arange(len(order))
        for i, stack in enumerate(stacks):
            s = sub[sub["stack"] == stack].set_index("group").reindex(order)
            mean = s["mean"].to_numpy(float) / scale
            half = s["ci_half"].to_numpy(float) / scale
            lower = np.where(np.isfinite(half), np.minimum(half, mean * 0.999), 0)
            upper = np.where(np.isfinite(half), half, 0)
            ax.bar(
                x + (i - (len(stacks) - 1) / 2) * width,
                mean,
                width,
                yerr=[lower, upper],
                capsize=3,
                label=stack,
                color=colors[stack],
                error_kw={"elinewidth": 1, "ecolor": "black"},
            )
        long_labels = max((len(o) for o in order), default=0) > 8
        ax.set_xticks(
            x, order, rotation=30 if long_labels else 0, ha="right" if long_labels else "center"
        )
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_plain_log_formatter)
        ax.yaxis.set_minor_formatter(_plain_log_formatter)
        ax.set_title(f"iodepth {qd}")
        ax.set_xlabel("block size")
    axes[0][0].set_ylabel(metric_label(metric))
    # an interval reaching 0 or below cannot be drawn on a log axis: let it run off the bottom
    # (clipped) instead of stretching the axis over decades no bar reaches
    smallest = float(np.nanmin(summ["mean"].to_numpy(float))) / scale
    if np.isfinite(smallest) and smallest > 0:
        axes[0][0].set_ylim(bottom=smallest / 4)
    n_reps = int(summ["n"].max())
    named = [p for p in summ["pattern"].unique() if p]
    fig.suptitle(
        f"{rw}{' [' + ', '.join(sorted(named)) + ']' if named else ''}: "
        f"{metric_label(metric).split(' (')[0]}\n"
        f"mean of {n_reps} repetitions, {confidence:.0%} CI",
        fontsize="medium",
    )
    # legend below the panels: never collides with the title, however narrow the figure is
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, title="stack", loc="outside lower center", ncols=len(stacks))
    return fig


# ------------------------------------------------------------------------------------------- loss


def cell_label(row) -> str:
    label = f"{row['rw']} {bs_label(int(row['bs_bytes']))} qd{int(row['iodepth'])}"
    if row["rw"] in ("rw", "readwrite", "randrw"):
        label += f" {row['direction']}"
    if row.get("_multi_job"):
        label += f" [{row['job']}]"
    pattern = row.get("pattern")
    if isinstance(pattern, str) and pattern:
        label += f" ({pattern})"
    return label


def loss_figure(
    loss: pd.DataFrame,
    metrics: Iterable[str] | None = None,
    comparison: tuple[str, str] | None = None,
) -> matplotlib.figure.Figure:
    """Effect in % (loss for throughput, increase for latency/CPU) per cell with its CI; one panel per
    metric; colour = verdict; zero line marks "no cost". One comparison per figure:
    ``comparison`` (baseline, variant), or the only one the table holds."""
    house_style()
    metrics = list(metrics) if metrics is not None else list(dict.fromkeys(loss["metric"]))
    if loss.empty or not metrics:
        raise ValueError("empty loss table")
    loss = _one_comparison(loss, comparison)
    df = loss[loss["metric"].isin(metrics)].copy()
    multi = df.groupby(["host", "workload"])["job_slot"].nunique().max() > 1
    df["_multi_job"] = bool(multi)
    df["cell"] = df.apply(cell_label, axis=1)
    if df["host"].nunique() > 1:
        df["cell"] = df["host"] + ": " + df["cell"]
    cells = df.sort_values(
        ["host", "pattern", "rw", "bs_bytes", "iodepth", "job_slot", "direction"]
    )["cell"]
    cells = list(dict.fromkeys(cells))
    y = {c: i for i, c in enumerate(cells)}
    fig, axes = plt.subplots(
        1,
        len(metrics),
        figsize=(3.4 * len(metrics) + 1.5, 0.4 * len(cells) + 1.6),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    for ax, metric in zip(axes[0], metrics, strict=True):
        sub = df[df["metric"] == metric]
        for verdict_name, g in sub.groupby("verdict"):
            ys = g["cell"].map(y).to_numpy(float)
            eff = g["effect_pct"].to_numpy(float)
            lo = g["ci_low"].to_numpy(float)
            hi = g["ci_high"].to_numpy(float)
            err = np.vstack([np.nan_to_num(eff - lo), np.nan_to_num(hi - eff)])
            ax.errorbar(
                eff,
                ys,
                xerr=err,
                fmt="o",
                capsize=3,
                color=VERDICT_COLORS.get(verdict_name, "black"),
                label=verdict_name,
            )
        ax.axvline(0, color="black", linewidth=0.8)
        kind = "increase" if (sub["effect"] == "increase").any() else "loss"
        ax.set_xlabel(f"{kind} (%)")
        ax.set_title(metric_label(metric).split(" (")[0])
        ax.set_yticks(range(len(cells)), cells)
        ax.set_ylim(len(cells) - 0.5, -0.5)
    conf = float(df["confidence"].iloc[0])
    base, var = df["baseline"].iloc[0], df["variant"].iloc[0]
    fig.suptitle(f"Cost of {var} vs {base} (paired, {conf:.0%} CI)")
    handles = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), title="verdict", loc="outside right upper")
    return fig


def _one_comparison(loss: pd.DataFrame, comparison: tuple[str, str] | None) -> pd.DataFrame:
    """The rows of one comparison; ValueError when ``comparison`` is None and there are several
    (their cells would be drawn on top of each other)."""
    from luksbench.analysis.stats import with_pattern

    loss = with_pattern(loss)
    pairs = list(dict.fromkeys(zip(loss["baseline"], loss["variant"], strict=True)))
    if comparison is None:
        if len(pairs) > 1:
            raise ValueError(f"the loss table holds {len(pairs)} comparisons: name one")
        return loss
    out = loss[(loss["baseline"] == comparison[0]) & (loss["variant"] == comparison[1])]
    if out.empty:
        raise ValueError(f"no rows of {comparison[1]} against {comparison[0]}")
    return out


# ---------------------------------------------------------------------------------------- heatmap

#: metrics that get a heatmap (IOPS repeats bandwidth at a fixed block size; every metric is in
#: the loss chart and the paper's tables)
HEATMAP_METRICS = ("bw_bytes", "clat_p99_ns")
#: the SCS post's order of access patterns
RW_ORDER = ("read", "write", "randread", "randwrite", "rw", "readwrite", "randrw")
VERDICT_MARKS = {
    "significant": "●",
    "equivalent": "≈",
    "inconclusive": "○",
    "insufficient": "\u2013",
}


def _row_label(row, multi_job: bool, multi_pattern: bool = False) -> str:
    label = str(row["rw"])
    if row["rw"] in ("rw", "readwrite", "randrw", "trimwrite", "randtrimwrite"):
        label += f" {row['direction']}"
    if multi_job:
        label += f" #{int(row['job_slot'])}"
    if multi_pattern:
        label += f" ({row['pattern'] or 'main'})"
    return label


def loss_heatmap(
    losses: pd.DataFrame, metric: str = "bw_bytes", host: str | None = None
) -> matplotlib.figure.Figure:
    """Block size (x) x rw pattern (y), one panel per comparison (rows: variant against its
    baseline) and iodepth (columns); colour = effect in %, each cell annotated with effect,
    interval and a verdict mark. Cells of different config patterns get rows of their own."""
    from luksbench.analysis.stats import with_pattern

    house_style()
    df = with_pattern(losses[losses["metric"] == metric])
    if host is not None:
        df = df[df["host"] == host]
    if df.empty:
        raise ValueError(f"no {metric} rows to draw")
    multi_job = df.groupby(["host", "workload"])["job_slot"].nunique().max() > 1
    multi_pattern = df["pattern"].nunique() > 1
    df = df.assign(row=df.apply(lambda r: _row_label(r, multi_job, multi_pattern), axis=1))
    comparisons = list(dict.fromkeys(zip(df["baseline"], df["variant"], strict=True)))
    depths = sorted(df["iodepth"].unique())
    bss = sorted(df["bs_bytes"].unique())
    order = {rw: i for i, rw in enumerate(RW_ORDER)}
    df = df.assign(_o=df["rw"].map(lambda r: order.get(r, len(order))))
    rows = list(
        dict.fromkeys(df.sort_values(["pattern", "_o", "rw", "direction", "job_slot"])["row"])
    )
    lim = float(np.nanmax(np.abs(df["effect_pct"].to_numpy(float)))) if len(df) else 1.0
    lim = min(max(lim, 1.0), 100.0) if df["higher_is_better"].all() else max(lim, 1.0)
    cmap = sns.color_palette("vlag", as_cmap=True)
    fig, axes = plt.subplots(
        len(comparisons),
        len(depths),
        figsize=(
            1.0 + 1.9 * len(bss) * len(depths),
            0.8 + 0.75 * len(rows) * len(comparisons) + 1,
        ),
        squeeze=False,
        layout="constrained",
    )
    kind = str(df["effect"].iloc[0])
    mesh = None
    for i, (base, var) in enumerate(comparisons):
        for j, qd in enumerate(depths):
            ax = axes[i][j]
            sub = df[(df["baseline"] == base) & (df["variant"] == var) & (df["iodepth"] == qd)]
            sub = sub.set_index(["row", "bs_bytes"])
            grid = np.full((len(rows), len(bss)), np.nan)
            for a, r in enumerate(rows):
                for b, bs in enumerate(bss):
                    if (r, bs) in sub.index:
                        cell = sub.loc[(r, bs)]
                        cell = cell.iloc[0] if isinstance(cell, pd.DataFrame) else cell
                        grid[a, b] = cell["effect_pct"]
                        text = (
                            f"{_fmt_pct(cell['effect_pct'])} "
                            f"{VERDICT_MARKS.get(cell['verdict'], '?')}\n"
                            f"[{_fmt_num(cell['ci_low'])}, {_fmt_num(cell['ci_high'])}]"
                        )
                        dark = abs(cell["effect_pct"]) > 0.6 * lim
                        ax.text(
                            b,
                            a,
                            text,
                            ha="center",
                            va="center",
                            fontsize="small",
                            color="white" if dark else "black",
                        )
                    else:
                        ax.text(b, a, "not measured", ha="center", va="center", fontsize="x-small")
            mesh = ax.imshow(grid, cmap=cmap, vmin=-lim, vmax=lim, aspect="auto")
            ax.set_xticks(range(len(bss)), [bs_label(int(b)) for b in bss])
            ax.set_yticks(range(len(rows)), rows)
            ax.grid(False)
            ax.set_title(f"{var} vs {base}, iodepth {qd}", fontsize="medium")
            ax.set_xlabel("block size")
    conf = float(df["confidence"].iloc[0])
    fig.suptitle(
        f"{(host + ': ') if host else ''}{metric_label(metric).split(' (')[0]} {kind} in % "
        f"[{conf:.0%} CI]\n● significant (BH-adjusted)  ≈ equivalent  ○ inconclusive  \u2013 fewer than two pairs",
        fontsize="medium",
    )
    if mesh is not None:
        fig.colorbar(mesh, ax=axes, label=f"{kind} (%)", shrink=0.8)
    return fig


# ------------------------------------------------------------------------------------------ hosts

#: metrics that get a hosts-side-by-side figure in a run with several hosts
HOSTS_METRICS = ("bw_bytes", "clat_p99_ns")
#: the hosts figure's axis stops at -this % (intervals reaching further are labelled at the edge)
HOSTS_AXIS_MIN_PCT = 100.0


def hosts_figure(losses: pd.DataFrame, metric: str = "bw_bytes") -> matplotlib.figure.Figure:
    """Several test boxes side by side: the effect per cell (rows) with its interval, one colour
    per host (dodged), one panel per comparison. Each host's effect comes from its own pairs
    only; the figure sets them beside each other, it does not pool them."""
    from luksbench.analysis.stats import with_pattern

    house_style()
    df = with_pattern(losses[losses["metric"] == metric].copy())
    if df.empty or df["host"].nunique() < 2:
        raise ValueError(f"need {metric} rows of at least two hosts")
    multi_job = df.groupby(["host", "workload"])["job_slot"].nunique().max() > 1
    df["_multi_job"] = bool(multi_job)
    df["cell"] = df.apply(cell_label, axis=1)
    order = {rw: i for i, rw in enumerate(RW_ORDER)}
    df["_o"] = df["rw"].map(lambda r: order.get(r, len(order)))
    cells = list(
        dict.fromkeys(
            df.sort_values(["pattern", "_o", "bs_bytes", "iodepth", "job_slot", "direction"])[
                "cell"
            ]
        )
    )
    hosts = sorted(df["host"].unique())
    comparisons = list(dict.fromkeys(zip(df["baseline"], df["variant"], strict=True)))
    colors = dict(zip(hosts, sns.color_palette(n_colors=len(hosts)), strict=True))
    step = 0.7 / len(hosts)
    fig, axes = plt.subplots(
        1,
        len(comparisons),
        figsize=(4.2 * len(comparisons) + 2.2, 0.45 * len(cells) + 1.8),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    kind = str(df["effect"].iloc[0])
    for ax, (baseline, variant) in zip(axes[0], comparisons, strict=True):
        sub = df[(df["baseline"] == baseline) & (df["variant"] == variant)]
        for k, host in enumerate(hosts):
            h = sub[sub["host"] == host]
            y = h["cell"].map({c: i for i, c in enumerate(cells)}).to_numpy(float)
            y = y + (k - (len(hosts) - 1) / 2) * step
            eff = h["effect_pct"].to_numpy(float)
            err = np.vstack(
                [
                    np.nan_to_num(eff - h["ci_low"].to_numpy(float)),
                    np.nan_to_num(h["ci_high"].to_numpy(float) - eff),
                ]
            )
            ax.errorbar(eff, y, xerr=err, fmt="o", capsize=2, color=colors[host], label=host)
            sig = (h["verdict"] == "significant").to_numpy(bool)
            ax.scatter(eff[sig], y[sig], s=70, facecolors="none", edgecolors="black", zorder=3)
            # an interval far below -100 % (a noisy cell, the variant maybe faster) would squash
            # every other cell: cut the axis there and write the bound at the edge
            for yy, lo in zip(y, h["ci_low"].to_numpy(float), strict=True):
                if np.isfinite(lo) and lo < -HOSTS_AXIS_MIN_PCT:
                    ax.annotate(
                        f"\u25c0 {lo:,.0f}",
                        (-HOSTS_AXIS_MIN_PCT, yy),
                        xytext=(2, 0),
                        textcoords="offset points",
                        va="center",
                        fontsize="x-small",
                        color=colors[host],
                    )
        low = float(np.nanmin(sub[["ci_low", "effect_pct"]].to_numpy(float)))
        high = float(np.nanmax(sub[["ci_high", "effect_pct"]].to_numpy(float)))
        span = max(high, 0) - max(min(low, 0), -HOSTS_AXIS_MIN_PCT)
        ax.set_xlim(max(min(low, 0), -HOSTS_AXIS_MIN_PCT) - 0.05 * span, max(high, 0) + 0.05 * span)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(cells)), cells)
        ax.set_ylim(len(cells) - 0.5, -0.5)
        ax.set_xlabel(f"{kind} (%)")
        ax.set_title(f"{variant} vs {baseline}", fontsize="medium")
    conf = float(df["confidence"].iloc[0])
    fig.suptitle(
        f"{metric_label(metric).split(' (')[0]} {kind} per host, {conf:.0%} CI\n"
        "each host paired with its own baseline; black ring = significant (BH-adjusted)",
        fontsize="medium",
    )
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, title="host", loc="outside lower center", ncols=len(hosts))
    return fig


def _fmt_num(x, decimals: int = 1) -> str:
    if x is None or not np.isfinite(float(x)):
        return "n/a"
    return f"{float(x):,.{decimals}f}"


def _fmt_pct(x) -> str:
    return "n/a" if x is None or not np.isfinite(float(x)) else f"{float(x):.1f} %"


# ---------------------------------------------------------------------------------------- latency

_NINES = [0.5, 0.9, 0.99, 0.999, 0.9999, 0.99999]


def percentile_curve(hist: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(x, latency_ns) of a histogram (columns ns, count): x = -log10(1 - p) at each bin's
    mid-rank, so p50, p90, p99 ... are evenly spaced."""
    h = hist.groupby("ns", sort=True)["count"].sum()
    counts = h.to_numpy(float)
    total = counts.sum()
    if total <= 0:
        return np.array([]), np.array([])
    p = (np.cumsum(counts) - counts / 2) / total
    return -np.log10(1 - p), h.index.to_numpy(float)


def latency_figure(
    lat: pd.DataFrame,
    rw: str,
    stacks: Iterable[str] | None = None,
    host: str | None = None,
    pattern: str | None = None,
) -> matplotlib.figure.Figure:
    """Completion-latency percentile curves for one rw pattern: rows = block size (and config
    pattern, when there are several), columns = iodepth; per stack one thick curve pooled over
    repetitions and a thin one per repetition. ``pattern``: only that config pattern's cells."""
    house_style()
    df = lat[lat["rw"] == rw]
    if "pattern" not in df.columns:
        df = df.assign(pattern="")
    if host is not None:
        df = df[df["host"] == host]
    if pattern is not None:
        df = df[df["pattern"] == pattern]
    if df.empty:
        raise ValueError(f"no {rw} latency histograms to plot")
    stacks = list(stacks) if stacks is not None else sorted(df["stack"].unique())
    stacks = [s for s in stacks if s in set(df["stack"])]
    colors = dict(zip(stacks, sns.color_palette(n_colors=len(stacks)), strict=True))
    # one row per (pattern, block size): cells of two patterns are never pooled
    bss = sorted(map(tuple, df[["pattern", "bs_bytes"]].drop_duplicates().to_numpy().tolist()))
    multi_pattern = df["pattern"].nunique() > 1
    depths = sorted(df["iodepth"].unique())
    directions = sorted(df["direction"].unique())
    styles = dict(zip(directions, ["-", "--", ":"], strict=False))
    fig, axes = plt.subplots(
        len(bss),
        len(depths),
        figsize=(1.2 + 3.4 * len(depths), 1.2 + 2.6 * len(bss)),
        squeeze=False,
        sharex=True,
        layout="constrained",
    )
    max_x = 0.0
    for i, (pat, bs) in enumerate(bss):
        for j, qd in enumerate(depths):
            ax = axes[i][j]
            cell = df[(df["pattern"] == pat) & (df["bs_bytes"] == bs) & (df["iodepth"] == qd)]
            for stack in stacks:
                for direction in directions:
                    one = cell[(cell["stack"] == stack) & (cell["direction"] == direction)]
                    if one.empty:
                        continue
                    for _, rep in one.groupby(["rep", "job_slot"]):
                        x, y = percentile_curve(rep)
                        ax.plot(x, y / 1e6, color=colors[stack], alpha=0.35, linewidth=0.7)
                    x, y = percentile_curve(one)
                    max_x = max(max_x, float(x.max()) if len(x) else 0.0)
                    label = stack if len(directions) == 1 else f"{stack} {direction}"
                    ax.plot(
                        x,
                        y / 1e6,
                        color=colors[stack],
                        linestyle=styles[direction],
                        linewidth=1.8,
                        label=label,
                    )
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(_plain_log_formatter)
            ax.yaxis.set_minor_formatter(_plain_log_formatter)
            where = f" ({pat or 'main'})" if multi_pattern else ""
            ax.set_title(f"bs {bs_label(int(bs))}, iodepth {qd}{where}", fontsize="medium")
            if j == 0:
                ax.set_ylabel("completion latency (ms)")
            if i == len(bss) - 1:
                ax.set_xlabel("percentile")
    ticks = [t for t in _NINES if -math.log10(1 - t) <= max_x + 0.5] or _NINES[:3]
    for ax in axes.flat:
        ax.set_xticks(
            [-math.log10(1 - t) for t in ticks], [f"p{100 * t:g}" for t in ticks], rotation=30
        )
    named = sorted(p for p in df["pattern"].unique() if p)
    fig.suptitle(
        f"{(host + ': ') if host else ''}{rw}{' [' + ', '.join(named) + ']' if named else ''}: "
        "completion-latency percentiles (json+ histograms)\n"
        "thick: all repetitions pooled; thin: one repetition",
        fontsize="medium",
    )
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), title="stack", loc="outside lower center", ncols=4)
    return fig


# -------------------------------------------------------------------------------------------- cpu


def cpu_figure(
    fio: pd.DataFrame,
    metric: str = "busy_cpu_s_per_gib",
    stacks: Iterable[str] | None = None,
    confidence: float = 0.95,
    host: str | None = None,
) -> matplotlib.figure.Figure:
    """CPU seconds per GiB moved, by block size (x), one bar per stack with its t-interval;
    rows = iodepth, columns = rw pattern; log y."""
    house_style()
    df = fio if host is None else fio[fio["host"] == host]
    summ = rep_summary(df, metric, confidence)
    summ = summ[np.isfinite(summ["mean"].astype(float))]
    if summ.empty:
        raise ValueError(f"no {metric} values (no CPU sidecars?)")
    stacks = list(stacks) if stacks is not None else sorted(summ["stack"].unique())
    stacks = [s for s in stacks if s in set(summ["stack"])]
    colors = dict(zip(stacks, sns.color_palette(n_colors=len(stacks)), strict=True))
    rws = sorted(summ["rw"].unique())
    depths = sorted(summ["iodepth"].unique())
    fig, axes = plt.subplots(
        len(depths),
        len(rws),
        figsize=(1.2 + 2.6 * len(rws), 1.4 + 2.6 * len(depths)),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    width = 0.8 / max(1, len(stacks))
    for i, qd in enumerate(depths):
        for j, rw in enumerate(rws):
            ax = axes[i][j]
            sub = summ[(summ["iodepth"] == qd) & (summ["rw"] == rw)]
            sub = sub.assign(group=sub["bs_bytes"].map(bs_label))
            if sub["direction"].nunique() > 1:
                sub["group"] = sub["group"] + " " + sub["direction"]
            if summ["pattern"].nunique() > 1 and len(sub):  # never average two patterns' cells
                tag = sub["pattern"].astype(str).map(lambda p: f" [{p}]" if p else "")
                sub["group"] = sub["group"].astype(str) + tag
            order = (
                sub.sort_values(["pattern", "bs_bytes", "group"])["group"]
                .drop_duplicates()
                .tolist()
            )
            x = np.arange(len(order))
            for k, stack in enumerate(stacks):
                s = (
                    sub[sub["stack"] == stack]
                    .groupby("group")[["mean", "ci_half"]]
                    .mean()
                    .reindex(order)
                )
                mean = s["mean"].to_numpy(float)
                half = s["ci_half"].to_numpy(float)
                lower = np.where(np.isfinite(half), np.minimum(half, mean * 0.999), 0)
                upper = np.where(np.isfinite(half), half, 0)
                ax.bar(
                    x + (k - (len(stacks) - 1) / 2) * width,
                    mean,
                    width,
                    yerr=[lower, upper],
                    capsize=3,
                    color=colors[stack],
                    label=stack,
                    error_kw={"elinewidth": 1, "ecolor": "black"},
                )
            ax.set_xticks(x, order)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(_plain_log_formatter)
            ax.yaxis.set_minor_formatter(_plain_log_formatter)
            ax.set_title(f"{rw}, iodepth {qd}", fontsize="medium")
            if i == len(depths) - 1:
                ax.set_xlabel("block size")
        axes[i][0].set_ylabel(metric_label(metric))
    what = {
        "busy_cpu_s_per_gib": "all non-idle CPU time (user + system + irq …)",
        "sys_cpu_s_per_gib": "system (kernel) CPU time",
    }.get(metric, metric)
    fig.suptitle(
        f"{(host + ': ') if host else ''}CPU cost per GiB moved: {what}\n"
        f"whole machine, /proc/stat; mean over repetitions, {confidence:.0%} CI",
        fontsize="medium",
    )
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, title="stack", loc="outside lower center", ncols=len(stacks))
    return fig


# ---------------------------------------------------------------------------------------- ciphers


def cipher_figure(cryptsetup: pd.DataFrame) -> matplotlib.figure.Figure:
    """``cryptsetup benchmark`` cipher rows: encryption and decryption MiB/s per cipher and key
    size (one panel per host); raises ValueError when no cipher row is available."""
    house_style()
    cs = cryptsetup[
        (cryptsetup["kind"] == "cipher") & cryptsetup["available"].fillna(False).astype(bool)
    ]
    if cs.empty:
        raise ValueError("no cipher benchmark rows")
    hosts = sorted(cs["host"].unique())
    n = cs.groupby("host").size().max()
    fig, axes = plt.subplots(
        1,
        len(hosts),
        figsize=(1.5 + 4.5 * len(hosts), 1.4 + 0.32 * n * 2),
        squeeze=False,
        sharex=True,
        layout="constrained",
    )
    palette = sns.color_palette(n_colors=2)
    for ax, host in zip(axes[0], hosts, strict=True):
        sub = cs[cs["host"] == host].reset_index(drop=True)
        labels = [f"{a} {int(k)}b" for a, k in zip(sub["algorithm"], sub["key_bits"], strict=True)]
        y = np.arange(len(sub))
        ax.barh(y - 0.2, sub["encryption_mib_s"], 0.4, label="encryption", color=palette[0])
        ax.barh(y + 0.2, sub["decryption_mib_s"], 0.4, label="decryption", color=palette[1])
        ax.set_yticks(y, labels)
        ax.set_ylim(len(sub) - 0.5, -0.5)
        ax.set_xlabel("MiB/s (one core, memory only)")
        ax.set_title(host, fontsize="medium")
    fig.suptitle("cryptsetup benchmark: cipher throughput", fontsize="medium")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2)
    return fig


def ceiling_figure(
    fio: pd.DataFrame,
    ceilings: list[dict],
    confidence: float = 0.95,
    host: str | None = None,
) -> matplotlib.figure.Figure:
    """Measured bandwidth of each LUKS stack per cell (bars, t-interval) under the crypto ceiling
    (decryption x CPUs for reads, encryption x CPUs for writes). Where the cipher benchmark is
    missing, the figure says why instead of drawing a line: no number is invented."""
    house_style()
    ceilings = [c for c in ceilings if host is None or c["host"] == host]
    luks = [c["stack"] for c in ceilings]
    df = fio if host is None else fio[fio["host"] == host]
    df = df[df["stack"].isin(luks)]
    summ = rep_summary(df, "bw_bytes", confidence)
    if summ.empty:
        raise ValueError("no LUKS stack bandwidth to draw")
    summ = summ.sort_values(["pattern", "rw", "bs_bytes", "iodepth", "direction"])
    summ["cell"] = summ.apply(
        lambda r: (
            f"{r['rw']} {bs_label(int(r['bs_bytes']))} qd{int(r['iodepth'])}"
            + (f" {r['direction']}" if r["rw"] in ("rw", "readwrite", "randrw") else "")
            + (f" ({r['pattern']})" if r["pattern"] else "")
        ),
        axis=1,
    )
    cells = list(dict.fromkeys(summ["cell"]))
    stacks = list(dict.fromkeys(summ["stack"]))
    colors = dict(zip(stacks, sns.color_palette(n_colors=len(stacks) + 1)[1:], strict=True))
    fig, ax = plt.subplots(figsize=(max(8.0, 2.0 + 0.55 * len(cells)), 4.6), layout="constrained")
    width = 0.8 / max(1, len(stacks))
    x = {c: i for i, c in enumerate(cells)}
    for k, stack in enumerate(stacks):
        s = summ[summ["stack"] == stack]
        xs = s["cell"].map(x).to_numpy(float) + (k - (len(stacks) - 1) / 2) * width
        mean = s["mean"].to_numpy(float) / 2**20
        half = s["ci_half"].to_numpy(float) / 2**20
        lower = np.where(np.isfinite(half), np.minimum(half, mean * 0.999), 0)
        upper = np.where(np.isfinite(half), half, 0)
        ax.bar(
            xs,
            mean,
            width,
            yerr=[lower, upper],
            capsize=2,
            color=colors[stack],
            label=f"{stack} measured",
            error_kw={"elinewidth": 1, "ecolor": "black"},
        )
        c = next(c for c in ceilings if c["stack"] == stack)
        if c["reason"] is None:
            for _, r in s.iterrows():
                ceiling = (
                    c["write_ceiling_mib_s"]
                    if r["direction"] == "write"
                    else c["read_ceiling_mib_s"]
                )
                xc = x[r["cell"]] + (k - (len(stacks) - 1) / 2) * width
                ax.hlines(
                    ceiling,
                    xc - width / 2,
                    xc + width / 2,
                    colors="black",
                    linewidth=2,
                    label="crypto ceiling (cipher \u00d7 CPUs)",
                )
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(_plain_log_formatter)
    ax.yaxis.set_minor_formatter(_plain_log_formatter)
    ax.set_xticks(range(len(cells)), cells, rotation=45, ha="right")
    ax.set_ylabel("bandwidth (MiB/s)")
    notes = [f"{c['stack']}: no ceiling, {c['reason']}" for c in ceilings if c["reason"]]
    known = [
        f"{c['stack']}: {c['algorithm']} {c['key_bits']}-bit, {_fmt_num(c['dec_mib_s'])} MiB/s "
        f"decryption / {_fmt_num(c['enc_mib_s'])} MiB/s encryption per core \u00d7 {c['cpus']} CPUs"
        for c in ceilings
        if c["reason"] is None
    ]
    if notes:
        ax.text(
            0.5,
            0.97,
            "\n".join(_wrap(n, 90) for n in notes),
            transform=ax.transAxes,
            ha="center",
            va="top",
            fontsize="small",
            bbox={"boxstyle": "round", "facecolor": "#fdf2e9", "edgecolor": "#c0392b"},
        )
        ax.set_ylim(top=ax.get_ylim()[1] * 30)  # room for the note above the bars
    fig.suptitle(
        f"{(host + ': ') if host else ''}Encrypted bandwidth and the crypto ceiling\n"
        + (
            _wrap("; ".join(known), 110)
            if known
            else "cipher benchmark unavailable: no ceiling drawn"
        ),
        fontsize="medium",
    )
    handles = dict(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncols=3)
    return fig


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


# ---------------------------------------------------------------------------------------- compare

OUTCOME_COLORS = {
    "better": "#27ae60",
    "worse": "#c0392b",
    "same": "#2980b9",
    "unclear": "#7f8c8d",
    "insufficient": "#bdc3c7",
    "only in A": "#bdc3c7",
    "only in B": "#bdc3c7",
}


_RATIO_TICKS = (0.01, 0.1, 0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0, 10.0, 100.0)


def _pct_label(ratio: float) -> str:
    return "0" if ratio == 1 else f"{100 * (ratio - 1):+.0f} %"


def compare_figure(table: pd.DataFrame, metrics: Iterable[str] | None = None):
    """``luksbench compare``: change from run A to run B in % per cell and stack (seaborn points,
    interval as a line), one panel per metric; colour = outcome (better / worse by the metric's
    direction, same = equivalent, unclear); zero line = no change."""
    house_style()
    metrics = list(metrics) if metrics is not None else list(dict.fromkeys(table["metric"]))
    df = table[table["metric"].isin(metrics) & table["change_pct"].notna()].copy()
    if df.empty:
        raise ValueError("nothing to draw: no cell has a value on both sides")
    multi_host = df[["host_a", "host_b"]].drop_duplicates().shape[0] > 1
    multi_stack = df["stack"].nunique() > 1
    df["_multi_job"] = bool(df.groupby(["host_a", "workload"])["job_slot"].nunique().max() > 1)

    def label(r) -> str:
        text = cell_label(r)
        if multi_stack:
            text = f"{r['stack']}: {text}"
        if multi_host:
            host = r["host_a"] if r["host_a"] == r["host_b"] else f"{r['host_a']}/{r['host_b']}"
            text = f"{host}: {text}"
        return text

    df["cell"] = df.apply(label, axis=1)
    cells = list(
        dict.fromkeys(
            df.sort_values(["host_a", "stack", "rw", "bs_bytes", "iodepth", "job_slot"])["cell"]
        )
    )
    y = {c: i for i, c in enumerate(cells)}
    df["y"] = df["cell"].map(y)
    fig, axes = plt.subplots(
        1,
        len(metrics),
        figsize=(3.4 * len(metrics) + 2.0, 0.38 * len(cells) + 1.8),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    present = [o for o in OUTCOME_COLORS if (df["outcome"] == o).any()]
    # ratio B/A on a log axis: +100 % and -50 % are the same distance from "no change", and one
    # very noisy cell does not squash the others; ticks read as percent change
    df["ratio_b_a"] = 1 + df["change_pct"] / 100
    df["lo"], df["hi"] = 1 + df["ci_low"] / 100, 1 + df["ci_high"] / 100
    for ax, metric in zip(axes[0], metrics, strict=True):
        sub = df[df["metric"] == metric]
        ax.hlines(
            sub["y"],
            sub["lo"].fillna(sub["ratio_b_a"]),
            sub["hi"].fillna(sub["ratio_b_a"]),
            colors=[OUTCOME_COLORS.get(o, "black") for o in sub["outcome"]],
            linewidth=1.6,
        )
        sns.scatterplot(
            data=sub,
            x="ratio_b_a",
            y="y",
            hue="outcome",
            hue_order=present,
            palette=OUTCOME_COLORS,
            style="design",
            style_order=["paired", "welch"],
            s=45,
            ax=ax,
            legend=ax is axes[0][-1],
            zorder=3,
        )
        ax.axvline(1, color="black", linewidth=0.8)
        ax.set_xscale("log")
        values = pd.concat([sub["lo"], sub["hi"], sub["ratio_b_a"]]).dropna()
        lo, hi = min(float(values.min()), 0.9), max(float(values.max()), 1.1)
        ticks = [t for t in _RATIO_TICKS if lo / 1.05 <= t <= hi * 1.05]
        if len(ticks) > 5:  # wide intervals: every other tick, always keeping "no change"
            ticks = sorted({1.0, *ticks[::2]})
        ax.set_xticks(ticks, [_pct_label(t) for t in ticks], rotation=45, ha="right")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlim(lo / 1.1, hi * 1.1)
        ax.set_xlabel("change B vs A (%, log scale)")
        ax.set_ylabel("")
        ax.set_title(metric_label(metric).split(" (")[0])
        ax.set_yticks(range(len(cells)), cells)
        ax.set_ylim(len(cells) - 0.5, -0.5)
    legend = axes[0][-1].get_legend()
    if legend is not None:
        handles, labels = axes[0][-1].get_legend_handles_labels()
        legend.remove()
        fig.legend(handles, labels, loc="outside right upper")
    conf = float(df["confidence"].iloc[0])
    run_a, run_b = df["run_a"].iloc[0], df["run_b"].iloc[0]
    fig.suptitle(
        f"{run_b} (B) vs {run_a} (A): change per cell, {conf:.0%} CI\n"
        "green better, red worse (by the metric's direction), blue equivalent, grey unclear",
        fontsize="medium",
    )
    return fig


# ----------------------------------------------------------------------------------------- driver


def figure_name(kind: str, rw: str | None = None, metric: str | None = None) -> str:
    return "-".join(p for p in (kind, rw, metric) if p)


def make_figures(
    processed_dir: Path,
    figures_dir: Path,
    run: str,
    baseline: str = "plain",
    variant: str = "luks",
    confidence: float = 0.95,
    raw_dir: Path | None = None,
    notebook: str | None = None,
    workers: int | None = None,
) -> dict[str, list[Path]]:
    """All figures of one run. Returns {name: [png, svg]}.

    Names (``<host>-`` after the kind when the run has several hosts):
    ``throughput-<rw>-<metric>`` (bw_bytes, iops; ``throughput-<rw>-<pattern>-<metric>`` for the
    cells of a config pattern), ``loss`` (the headline comparison) and
    ``loss-<variant>-vs-<baseline>`` (every other comparison), ``heatmap-<metric>`` (bandwidth
    and p99 latency; one panel row per comparison), ``hosts-<metric>`` (several hosts only: the
    hosts side by side), ``latency-<rw>[-<pattern>]`` (json+ histograms from ``raw_dir``; none
    without raw_dir or histograms), ``cpu-<metric>`` (busy / system CPU s per GiB; none without
    CPU sidecars),
    ``ciphers`` (only when cipher rows exist) and ``ceiling`` (always, per host: the ceiling or why
    there is none). ``notebook`` names the notebook that made them, for the provenance.
    ``workers``: processes drawing in parallel (default: the CPUs available; 1 = here).
    """
    from luksbench.analysis.ingest import read_processed
    from luksbench.analysis.stats import with_pattern
    from luksbench.publish import report

    processed_dir, figures_dir = Path(processed_dir), Path(figures_dir)
    tables = read_processed(processed_dir)
    fio = with_pattern(tables["fio"])
    loss = tables.get("loss")
    if loss is None:  # every stack against the baseline, as write_loss would
        loss = report.variant_losses(fio, None, baseline, variant, confidence=confidence)
    env = tables.get("env", pd.DataFrame(columns=["host", "env_json"]))
    cryptsetup = tables.get("cryptsetup", pd.DataFrame())
    stacks_tab = tables.get("stacks", pd.DataFrame(columns=["host", "stack", "kind"]))
    sources = {
        f"{name}.parquet": file_digest(processed_dir / f"{name}.parquet")
        for name in ("fio", "loss", "env", "cryptsetup", "stacks")
        if (processed_dir / f"{name}.parquet").exists()
    }
    facts = report.provenance_facts(env, notebook)
    losses = report.variant_losses(fio, loss, baseline, variant, confidence=confidence)
    pairs = report.comparison_pairs(losses)
    if pairs:  # the headline comparison's stacks first in every legend
        baseline, variant = pairs[0]
    stacks = report.stack_order(fio["stack"].dropna().unique(), baseline, variant)
    hosts = sorted(fio["host"].unique())
    multi = len(hosts) > 1

    tasks: list[tuple[str, str, object, dict]] = []  # (name, drawing function, build, params)

    def emit(name, build, func, **params):
        """Queue a figure: ``build()`` draws it (later, maybe in a worker process)."""
        tasks.append((name, func, build, params))

    def named(kind, host, *rest):
        return "-".join([kind, *([host] if multi else []), *[r for r in rest if r]])

    def retitled(fig, title: str):
        fig.suptitle(title, fontsize="medium")
        return fig

    lat = (
        report.latency_table(fio, raw_dir)
        if raw_dir is not None
        else pd.DataFrame(columns=["host", "rw", "pattern"])
    )
    ceilings = report.crypto_ceilings(cryptsetup, stacks_tab, env)
    # A host the stacks table does not describe (no stacks table; the fio servers of a fleet
    # run, whose stacks the coordinator built): still say on a figure that there is no ceiling.
    described = {c["host"] for c in ceilings}
    ceilings += [
        {"host": h, "stack": s, "reason": "the stacks table does not describe this stack"}
        for h in hosts
        if h not in described
        for s in stacks
        if s != baseline
    ]
    for host in hosts:
        one = fio[fio["host"] == host]
        prefix = f"{host}: " if multi else ""
        # one figure per access pattern and config pattern: cells of two patterns never share bars
        cells = one[["rw", "pattern"]].drop_duplicates().dropna()
        for rw, pat in sorted(cells.itertuples(index=False, name=None), key=lambda c: (c[1], c[0])):
            for metric in ("bw_bytes", "iops"):

                def build(one=one, rw=rw, metric=metric, prefix=prefix, pat=pat):
                    fig = throughput_figure(
                        one, rw, metric, stacks=stacks, confidence=confidence, pattern=pat
                    )
                    return retitled(fig, prefix + fig.get_suptitle()) if multi else fig

                emit(
                    named("throughput", host, rw, pat, metric),
                    build,
                    "luksbench.publish.figures.throughput_figure",
                    host=host,
                    rw=rw,
                    metric=metric,
                    **({"pattern": pat} if pat else {}),
                )
            lat_one = lat[(lat["host"] == host) & (lat["rw"] == rw) & (lat["pattern"] == pat)]
            if len(lat_one):
                emit(
                    named("latency", host, rw, pat),
                    lambda lat_one=lat_one, rw=rw, host=host: latency_figure(
                        lat_one, rw, stacks=stacks, host=host if multi else None
                    ),
                    "luksbench.publish.figures.latency_figure",
                    rw=rw,
                    **({"pattern": pat} if pat else {}),
                )
        for metric in [m for m in HEATMAP_METRICS if m in set(losses["metric"])]:

            def build(metric=metric, host=host):
                fig = loss_heatmap(losses, metric, host=host)
                if multi:
                    return fig
                return retitled(fig, fig.get_suptitle().removeprefix(f"{host}: "))

            emit(
                named("heatmap", host, metric),
                build,
                "luksbench.publish.figures.loss_heatmap",
                metric=metric,
            )
        for metric in ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib"):
            if metric in one and pd.to_numeric(one[metric], errors="coerce").notna().any():
                emit(
                    named("cpu", host, metric),
                    lambda one=one, metric=metric, host=host: cpu_figure(
                        one, metric, stacks, confidence, host=host if multi else None
                    ),
                    "luksbench.publish.figures.cpu_figure",
                    metric=metric,
                )
        host_ceilings = [c for c in ceilings if c["host"] == host]
        if host_ceilings and one["stack"].isin([c["stack"] for c in host_ceilings]).any():
            emit(
                named("ceiling", host),
                lambda one=one, host_ceilings=host_ceilings, host=host: ceiling_figure(
                    one, host_ceilings, confidence, host=host if multi else None
                ),
                "luksbench.publish.figures.ceiling_figure",
                ceilings=[
                    {k: c.get(k) for k in ("stack", "read_ceiling_mib_s", "write_ceiling_mib_s")}
                    | {"unavailable": c.get("reason")}
                    for c in host_ceilings
                ],
            )
    if multi:  # the test boxes side by side (each with its own pairs)
        for metric in [m for m in HOSTS_METRICS if m in set(losses["metric"])]:
            emit(
                f"hosts-{metric}",
                lambda metric=metric: hosts_figure(losses, metric),
                "luksbench.publish.figures.hosts_figure",
                metric=metric,
                hosts=hosts,
            )
    if (
        len(cryptsetup)
        and (
            (cryptsetup["kind"] == "cipher") & cryptsetup["available"].fillna(False).astype(bool)
        ).any()
    ):
        emit(
            "ciphers", lambda: cipher_figure(cryptsetup), "luksbench.publish.figures.cipher_figure"
        )
    for k, pair in enumerate(pairs):  # one cost chart per comparison, the headline's is "loss"
        emit(
            "loss" if k == 0 else f"loss-{pair[1]}-vs-{pair[0]}",
            lambda pair=pair: loss_figure(losses, comparison=pair),
            "luksbench.publish.figures.loss_figure",
            baseline=pair[0],
            variant=pair[1],
        )

    def draw(task) -> list[Path]:
        name, func, build, params = task
        fig = build()
        try:
            return save_figure(
                fig, figures_dir / name, _provenance(run, name, func, sources, facts, **params)
            )
        finally:
            plt.close(fig)

    return dict(_draw_all(tasks, draw, workers, figures_dir))


def _draw_all(
    tasks: list, draw, workers: int | None, figures_dir: Path
) -> list[tuple[str, list[Path]]]:
    """Draw and save every figure, split over ``workers`` forked processes (default: the CPUs
    available; 1 = here). Saving (layout, PNG and SVG rendering) is most of the time and each
    figure is independent, so two cores halve it. A worker that fails is named with its figures
    and the error."""
    import multiprocessing
    import os

    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    workers = max(1, min(int(workers), len(tasks)))
    if workers == 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [(task[0], draw(task)) for task in tasks]
    # fork: the workers share the tables and the drawing closures without pickling, and never
    # re-run the caller's main module; each draws every workers-th figure
    context = multiprocessing.get_context("fork")
    errors = context.SimpleQueue()
    procs = [
        context.Process(target=_draw_share, args=(tasks[k::workers], draw, errors))
        for k in range(workers)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failures or failed:
        raise RuntimeError(
            "drawing figures failed: "
            + ("; ".join(failures) or f"worker exit codes {failed} (killed?)")
        )
    return [(task[0], figure_paths(figures_dir / task[0])) for task in tasks]


def _draw_share(tasks, draw, errors) -> None:
    """Worker: draw these figures; report the first failure (figure name and error)."""
    import traceback

    for task in tasks:
        try:
            draw(task)
        except Exception as exc:  # report, do not hang the parent
            errors.put(f"{task[0]}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            raise SystemExit(1) from exc
    raise SystemExit(0)


def _provenance(run: str, name: str, func: str, sources: dict, facts: dict, **params) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg_version = version("luksbench")
    except PackageNotFoundError:  # pragma: no cover - source checkout without install
        pkg_version = "unknown"
    return {
        "title": f"luksbench {run}: {name}",
        "run": run,
        "figure": name,
        "made_by": func,
        "luksbench_version": pkg_version,
        **facts,
        "sources_sha256": sources,
        **({"params": params} if params else {}),
    }
