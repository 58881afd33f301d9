"""Figures: one house style, functions that take DataFrames and return matplotlib figures.

``throughput_figure``  SCS-style grouped bars for one rw pattern: block size on x, one bar per stack,
                       log-scale y, mean over repetitions with a t-interval, one panel per iodepth.
``loss_figure``        loss / increase in % per cell with its confidence interval, one panel per metric.
``save_figure``        PNG (provenance as text chunks) + SVG (provenance in the metadata), both
                       free of timestamps so re-renders are byte-stable.
``make_figures``       all of the above for one processed run folder.
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

from luksbench.layout import bs_label

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
VERDICT_COLORS = {"significant": "#c0392b", "inconclusive": "#7f8c8d", "insufficient": "#bdc3c7"}
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


def save_figure(fig: matplotlib.figure.Figure, path: Path, provenance: dict) -> list[Path]:
    """Write ``<path>.png`` and ``<path>.svg`` (``path`` without suffix); returns both paths.

    PNG: every provenance key becomes a tEXt chunk (plus ``Software``/``Title``). SVG: the provenance
    as JSON in ``Description``, no date, fixed hash salt.
    """
    path = Path(path)
    if path.suffix in (".png", ".svg"):
        path = path.with_suffix("")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = _provenance_text(provenance)
    title = text.get("title", path.name)
    png, svg = path.with_suffix(".png"), path.with_suffix(".svg")
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
    """Mean over repetitions per (host, stack, rw, bs_bytes, iodepth, direction) with a t-interval.

    Multi-entry jobs are combined first as in :func:`luksbench.stats.rep_values`.
    """
    from luksbench.stats import CELL_KEYS, rep_values

    vals = rep_values(fio, [metric])
    keys = ["host", "stack", "rw", "bs_bytes", "iodepth", "direction", "job_slot"]
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
) -> matplotlib.figure.Figure:
    """Grouped bars for one rw pattern: block size on x, stacks side by side, log y, one panel per
    iodepth; bar = mean over repetitions, error bar = t-interval (lower end clipped for the log axis)."""
    house_style()
    df = fio[fio["rw"] == rw]
    if host is not None:
        df = df[df["host"] == host]
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
    n_reps = int(summ["n"].max())
    fig.suptitle(
        f"{rw}: {metric_label(metric).split(' (')[0]} (mean of {n_reps} reps, {confidence:.0%} CI)"
    )
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, title="stack", loc="outside right center")
    return fig


# ------------------------------------------------------------------------------------------- loss


def cell_label(row) -> str:
    label = f"{row['rw']} {bs_label(int(row['bs_bytes']))} qd{int(row['iodepth'])}"
    if row["rw"] in ("rw", "readwrite", "randrw"):
        label += f" {row['direction']}"
    if row.get("_multi_job"):
        label += f" [{row['job']}]"
    return label


def loss_figure(
    loss: pd.DataFrame, metrics: Iterable[str] | None = None
) -> matplotlib.figure.Figure:
    """Effect in % (loss for throughput, increase for latency/CPU) per cell with its CI; one panel per
    metric; colour = verdict; zero line marks "no cost"."""
    house_style()
    metrics = list(metrics) if metrics is not None else list(dict.fromkeys(loss["metric"]))
    if loss.empty or not metrics:
        raise ValueError("empty loss table")
    df = loss[loss["metric"].isin(metrics)].copy()
    multi = df.groupby(["host", "workload"])["job_slot"].nunique().max() > 1
    df["_multi_job"] = bool(multi)
    df["cell"] = df.apply(cell_label, axis=1)
    if df["host"].nunique() > 1:
        df["cell"] = df["host"] + ": " + df["cell"]
    cells = df.sort_values(["host", "rw", "bs_bytes", "iodepth", "job_slot", "direction"])["cell"]
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
) -> dict[str, list[Path]]:
    """All figures of one run: ``throughput-<rw>-<metric>`` (bw_bytes, iops) per rw pattern
    (``throughput-<host>-<rw>-<metric>`` when the run has several hosts) and ``loss`` (from loss.parquet, or computed when it is absent). Returns {name: [png, svg]}."""
    from luksbench.stats import loss_table

    processed_dir, figures_dir = Path(processed_dir), Path(figures_dir)
    fio_path = processed_dir / "fio.parquet"
    fio = pd.read_parquet(fio_path)
    loss_path = processed_dir / "loss.parquet"
    loss = (
        pd.read_parquet(loss_path)
        if loss_path.exists()
        else loss_table(fio, baseline, variant, confidence=confidence)
    )
    sources = {p.name: file_digest(p) for p in (fio_path, loss_path) if p.exists()}
    stacks = [s for s in (baseline, variant) if s in set(fio["stack"])]
    stacks += sorted(set(fio["stack"]) - set(stacks))
    out: dict[str, list[Path]] = {}
    hosts = sorted(fio["host"].unique())
    for host in hosts:
        one = fio[fio["host"] == host]
        for rw in sorted(one["rw"].dropna().unique()):
            for metric in ("bw_bytes", "iops"):
                # one host (the usual case): throughput-<rw>-<metric>; several: host in the name
                name = figure_name(
                    "throughput", (host + "-" if len(hosts) > 1 else "") + rw, metric
                )
                fig = throughput_figure(one, rw, metric, stacks=stacks, confidence=confidence)
                if len(hosts) > 1:
                    fig.suptitle(f"{host}: {fig.get_suptitle()}")
                out[name] = save_figure(
                    fig,
                    figures_dir / name,
                    _provenance(
                        run,
                        name,
                        "luksbench.plots.throughput_figure",
                        sources,
                        host=host,
                        rw=rw,
                        metric=metric,
                    ),
                )
                plt.close(fig)
    fig = loss_figure(loss)
    out["loss"] = save_figure(
        fig, figures_dir / "loss", _provenance(run, "loss", "luksbench.plots.loss_figure", sources)
    )
    plt.close(fig)
    return out


def _provenance(run: str, name: str, func: str, sources: dict, **params) -> dict:
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
        "sources_sha256": sources,
        **({"params": params} if params else {}),
    }
