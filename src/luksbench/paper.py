"""The paper: one Markdown post per run, rendered from the processed tables with a Jinja2 template.

No number is typed by hand: every figure in the text comes from ``data/processed/<run>/*.parquet``;
formatting happens here, wording in ``templates/paper.md.j2``. Missing values print as "n/a", never
as "nan".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import jinja2
import pandas as pd

from luksbench.layout import bs_label

TEMPLATE = "paper.md.j2"

BACKEND_TEXT = {
    "userspace": (
        "userspace: qemu-storage-daemon's LUKS driver via FUSE, not dm-crypt",
        "This run measured qemu's own LUKS implementation (qemu-storage-daemon, block driver `luks`, "
        "exported to the host through FUSE), **not the kernel's dm-crypt**. Both stacks go through the "
        "same qemu + FUSE path, so the difference isolates qemu's encryption, but absolute numbers "
        "and the size of the loss do not carry over to dm-crypt.",
    ),
    "kernel": (
        "kernel dm-crypt",
        "This run measured the kernel's dm-crypt (device-mapper `crypt` target set up with "
        "cryptsetup) on the test box's block devices.",
    ),
}

METRIC_UNITS = {
    # metric: (heading, unit, divisor, decimals)
    "bw_bytes": ("Bandwidth", "MiB/s", 2**20, 1),
    "iops": ("IOPS", "IO/s", 1, 0),
    "clat_p99_ns": ("p99 completion latency", "ms", 1e6, 3),
    "clat_p50_ns": ("median completion latency", "ms", 1e6, 3),
    "clat_p999_ns": ("p99.9 completion latency", "ms", 1e6, 3),
    "clat_mean_ns": ("mean completion latency", "ms", 1e6, 3),
    "lat_mean_ns": ("mean latency", "ms", 1e6, 3),
    "busy_cpu_s_per_gib": ("CPU time per GiB", "CPU s/GiB", 1, 2),
    "sys_cpu_s_per_gib": ("system CPU time per GiB", "CPU s/GiB", 1, 2),
}


# ------------------------------------------------------------------------------------- formatting


def _missing(x) -> bool:
    if x is None or x is pd.NA:
        return True
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def fmt_num(x, decimals: int = 1) -> str:
    """Number with thousands separators; "n/a" for missing values."""
    if _missing(x):
        return "n/a"
    x = float(x)
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if round(x, decimals) == 0:
        x = 0.0  # no "-0.0"
    return f"{x:,.{decimals}f}"


def fmt_pct(x, decimals: int = 1) -> str:
    return "n/a" if _missing(x) else f"{fmt_num(x, decimals)} %"


def fmt_ci(low, high, decimals: int = 1) -> str:
    if _missing(low) or _missing(high):
        return "[n/a]"
    return f"[{fmt_num(low, decimals)}, {fmt_num(high, decimals)}]"


def fmt_bool(x) -> str:
    return "n/a" if _missing(x) else ("yes" if bool(x) else "no")


def fmt_text(x) -> str:
    return "n/a" if _missing(x) or str(x).strip() == "" else str(x)


def cell_name(row, with_job: bool = False) -> str:
    """``randread 4k QD32``; mixed patterns add the direction, multi-job files the job name."""
    name = f"{row['rw']} {bs_label(int(row['bs_bytes']))} QD{int(row['iodepth'])}"
    if row["rw"] in ("rw", "readwrite", "randrw"):
        name += f" ({row['direction']})"
    if with_job:
        name += f", job `{row['job']}`"
    return name


def _multi_job(loss: pd.DataFrame) -> bool:
    """Do some result files hold several jobs (then cells need the job name to be told apart)?"""
    return bool(len(loss)) and bool(
        loss.groupby(["host", "workload"])["job_slot"].nunique().max() > 1
    )


def _env_dict(env_json) -> dict:
    try:
        return json.loads(env_json) if not _missing(env_json) else {}
    except (TypeError, json.JSONDecodeError):
        return {}


# ---------------------------------------------------------------------------------------- context


def _hosts(env: pd.DataFrame, stacks: pd.DataFrame) -> list[dict]:
    hosts = []
    for _, row in env.iterrows():
        backend = fmt_text(row["backend"])
        if backend == "n/a" and not stacks.empty:
            per_stack = stacks[stacks["host"] == row["host"]]["backend"].dropna().unique()
            backend = per_stack[0] if len(per_stack) == 1 else backend
        short, long = BACKEND_TEXT.get(
            backend,
            (
                f"unknown backend ({backend})",
                "env.json does not say which encryption backend ran; treat the numbers with care.",
            ),
        )
        hosts.append(
            {
                "host": row["host"],
                "hostname": fmt_text(row["hostname"]),
                "cpu_model": fmt_text(row["cpu_model"]),
                "cpu_count": fmt_text(row["cpu_count"]),
                "aes": fmt_bool(row["aes"]),
                "vaes": fmt_bool(row["vaes"]),
                "kernel": fmt_text(row["kernel"]),
                "fio_version": fmt_text(row["fio_version"]),
                "cryptsetup_version": fmt_text(row["cryptsetup_version"]),
                "qemu_version": fmt_text(row.get("qemu_version")),
                "backend": backend,
                "backend_short": short,
                "backend_long": long,
                "backend_reason": fmt_text(row["backend_reason"]),
            }
        )
    return hosts


# Stack settings a reader needs to judge the comparison (the rest, e.g. paths and the LUKS header
# dump, stays in the processed table).
_STACK_SETTINGS = (
    "luks_type",
    "sector_size",
    "hash",
    "pbkdf",
    "device_size_bytes",
    "loop_direct_io",
)


def _stacks(stacks: pd.DataFrame, baseline: str, variant: str) -> list[dict]:
    rows = []
    for _, row in stacks.iterrows():
        desc = _env_dict(row["description_json"])
        settings = [f"{k} {desc[k]}" for k in _STACK_SETTINGS if desc.get(k) is not None]
        settings += [f"note: {note}" for note in desc.get("notes") or []]
        details = "; ".join(settings)
        role = (
            "baseline" if row["stack"] == baseline else "variant" if row["stack"] == variant else ""
        )
        rows.append(
            {
                "host": row["host"],
                "stack": row["stack"],
                "role": role,
                "kind": fmt_text(row["kind"]),
                "backend": fmt_text(row["backend"]),
                "cipher": fmt_text(row["cipher"]),
                "key_bits": fmt_text(row["key_bits"]),
                "details": details or "n/a",
            }
        )
    return rows


def _matrix(fio: pd.DataFrame, env: pd.DataFrame) -> dict:
    reps = fio.groupby(["host", "stack", "workload"])["rep"].nunique()
    runtime_s = fio["runtime_ms"].astype(float) / 1000
    ioengines = sorted(fio["ioengine"].dropna().unique()) if "ioengine" in fio else []
    direct = sorted(fio["direct"].dropna().unique()) if "direct" in fio else []
    plan_fio = {}
    for env_json in env["env_json"]:
        plan_fio = _env_dict(env_json).get("plan", {}).get("fio", {}) or plan_fio
    cells = (
        fio[["rw", "bs_bytes", "iodepth"]]
        .drop_duplicates()
        .sort_values(["rw", "bs_bytes", "iodepth"])
    )
    return {
        "rw": ", ".join(f"`{x}`" for x in sorted(fio["rw"].dropna().unique())),
        "bs": ", ".join(bs_label(int(b)) for b in sorted(fio["bs_bytes"].dropna().unique())),
        "iodepth": ", ".join(str(int(q)) for q in sorted(fio["iodepth"].dropna().unique())),
        "n_cells": len(cells),
        "n_stacks": fio["stack"].nunique(),
        "stacks": ", ".join(f"`{s}`" for s in sorted(fio["stack"].unique())),
        "reps_min": int(reps.min()) if len(reps) else 0,
        "reps_max": int(reps.max()) if len(reps) else 0,
        "n_results": int(fio[["host", "stack", "workload", "rep"]].drop_duplicates().shape[0]),
        "runtime_s": fmt_num(runtime_s.median(), 1),
        "runtime_planned_s": fmt_text(plan_fio.get("runtime_s")),
        "ioengine": ", ".join(ioengines) or "n/a",
        "direct": ", ".join(str(int(d)) for d in direct) or "n/a",
        "fio_versions": ", ".join(sorted(fio["fio_version"].dropna().unique())) or "n/a",
    }


def loss_sections(loss: pd.DataFrame) -> list[dict]:
    """One table per metric: rows rw x bs x iodepth with means, effect [CI], verdict, n."""
    sections = []
    multi_host = loss["host"].nunique() > 1
    multi_job = _multi_job(loss)
    for metric in dict.fromkeys(loss["metric"]):
        sub = loss[loss["metric"] == metric]
        heading, unit, div, dec = METRIC_UNITS.get(metric, (metric, "", 1, 2))
        kind = sub["effect"].iloc[0]
        rows = []
        for _, r in sub.iterrows():
            rows.append(
                {
                    "cell": (f"{r['host']}: " if multi_host else "") + cell_name(r, multi_job),
                    "n": int(r["n"]),
                    "n_dropped": int(r["n_dropped"]),
                    "baseline_mean": fmt_num(r["baseline_mean"] / div, dec),
                    "variant_mean": fmt_num(r["variant_mean"] / div, dec),
                    "effect": fmt_pct(r["effect_pct"]),
                    "ci": fmt_ci(r["ci_low"], r["ci_high"]),
                    "verdict": r["verdict"],
                }
            )
        sections.append(
            {
                "metric": metric,
                "heading": heading,
                "unit": unit,
                "kind": kind,
                "rows": rows,
                "any_dropped": any(r["n_dropped"] for r in rows),
            }
        )
    return sections


def tldr(loss: pd.DataFrame, hosts: list[dict], baseline: str, variant: str) -> str:
    """One computed sentence (or three): where the variant costs most, and how sure we are."""
    conf = fmt_num(100 * float(loss["confidence"].iloc[0]), 0) if len(loss) else "n/a"
    backends = sorted({h["backend_short"] for h in hosts}) or ["unknown backend"]
    parts = [f"`{variant}` against `{baseline}`, measured with {' / '.join(backends)}."]
    metrics = list(dict.fromkeys(loss["metric"]))
    if "bw_bytes" in metrics and "iops" in metrics:
        metrics.remove("iops")  # same ratio as bandwidth at a fixed block size: say it once
    for metric in metrics:
        sub = loss[loss["metric"] == metric]
        heading = METRIC_UNITS.get(metric, (metric,))[0]
        kind = sub["effect"].iloc[0]
        sig = sub[sub["verdict"] == "significant"]
        n_cells = len(sub)
        if sig.empty:
            tested = sub[sub["verdict"] != "insufficient"]
            parts.append(
                f"{heading}: no significant {kind} in any of {n_cells} cells at {conf} % confidence"
                + (
                    f" ({n_cells - len(tested)} with fewer than two pairs)."
                    if len(tested) < n_cells
                    else "."
                )
            )
            continue
        worst = sig.loc[sig["effect_pct"].idxmax()]
        parts.append(
            f"{heading}: significant {kind} in {len(sig)} of {n_cells} cells; the largest was "
            f"{fmt_pct(worst['effect_pct'])} {fmt_ci(worst['ci_low'], worst['ci_high'])} "
            f"({cell_name(worst, _multi_job(loss))}, {int(worst['n'])} pairs, {conf} % CI)."
        )
    return " ".join(parts)


def _cryptsetup(cs: pd.DataFrame) -> dict:
    if cs.empty:
        return {"present": False, "ciphers": [], "pbkdf": [], "failures": []}
    ciphers = cs[(cs["kind"] == "cipher") & cs["available"].fillna(False).astype(bool)]
    failures = cs[~cs["available"].fillna(True).astype(bool)]
    pbkdf = cs[cs["kind"].isin(["pbkdf2", "argon2"])]
    return {
        "present": True,
        "ciphers": [
            {
                "host": r["host"],
                "algorithm": fmt_text(r["algorithm"]),
                "key_bits": fmt_num(r["key_bits"], 0),
                "enc": fmt_num(r["encryption_mib_s"], 1),
                "dec": fmt_num(r["decryption_mib_s"], 1),
            }
            for _, r in ciphers.iterrows()
        ],
        "pbkdf": [
            {
                "host": r["host"],
                "algorithm": fmt_text(r["algorithm"]),
                "value": (
                    f"{fmt_num(r['iterations_per_s'], 0)} iterations/s"
                    if r["kind"] == "pbkdf2"
                    else f"{fmt_num(r['time_cost'], 0)} iterations, {fmt_num(r['memory_kib'], 0)} KiB, "
                    f"{fmt_num(r['threads'], 0)} threads"
                ),
            }
            for _, r in pbkdf.iterrows()
        ],
        "failures": sorted(
            {
                (r["host"], fmt_text(r["algorithm"]), fmt_text(r["note"]))
                for _, r in failures.iterrows()
            }
        ),
    }


def _figures(figures_dir: Path, out_md: Path) -> list[dict]:
    figures_dir = Path(figures_dir)
    pngs = sorted(figures_dir.glob("*.png"), key=lambda p: (p.stem != "loss", p.stem))
    out = []
    for png in pngs:
        caption = png.stem.replace("-", " ").replace("_", " ")
        if png.stem == "loss":
            caption = "Cost per cell with confidence interval (colour: verdict)"
        elif png.stem.startswith("throughput-"):
            what, metric = png.stem.removeprefix("throughput-").rsplit("-", 1)
            caption = (
                f"{what}: {METRIC_UNITS.get(metric, (metric,))[0]}, mean over repetitions per stack"
            )
        svg = png.with_suffix(".svg")
        out.append(
            {
                "caption": caption,
                "png": Path(os.path.relpath(png, out_md.parent)).as_posix(),
                "svg": Path(os.path.relpath(svg, out_md.parent)).as_posix()
                if svg.exists()
                else None,
            }
        )
    return out


def _digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def paper_context(
    processed_dir: Path,
    figures_dir: Path,
    out_md: Path,
    run: str,
    baseline: str | None = None,
    variant: str | None = None,
) -> dict:
    """Everything the template needs, as formatted strings (no raw floats reach the template)."""
    from luksbench.ingest import read_processed
    from luksbench.stats import loss_table

    processed_dir = Path(processed_dir)
    tables = read_processed(processed_dir)
    for name in ("fio", "env"):
        if name not in tables:
            raise FileNotFoundError(
                f"{processed_dir / (name + '.parquet')} is missing: run the ingest first"
            )
    fio, env = tables["fio"], tables["env"]
    stacks = tables.get("stacks", pd.DataFrame(columns=["host", "stack", "backend"]))
    loss = tables.get("loss")
    if loss is None:
        loss = loss_table(fio, baseline or "plain", variant or "luks")
    if loss.empty:
        raise ValueError(f"{processed_dir}: the loss table is empty")
    baseline = baseline or str(loss["baseline"].iloc[0])
    variant = variant or str(loss["variant"].iloc[0])
    hosts = _hosts(env, stacks)
    sources = sorted(p for p in processed_dir.glob("*.parquet"))
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg_version = version("luksbench")
    except PackageNotFoundError:  # pragma: no cover
        pkg_version = "unknown"
    return {
        "run": run,
        "baseline": baseline,
        "variant": variant,
        "confidence_pct": fmt_num(100 * float(loss["confidence"].iloc[0]), 0),
        "tldr": tldr(loss, hosts, baseline, variant),
        "hosts": hosts,
        "stacks": _stacks(stacks, baseline, variant),
        "matrix": _matrix(fio, env),
        "loss_sections": loss_sections(loss),
        "n_significant": int((loss["verdict"] == "significant").sum()),
        "n_rows": len(loss),
        "figures": _figures(figures_dir, Path(out_md)),
        "cryptsetup": _cryptsetup(tables.get("cryptsetup", pd.DataFrame())),
        "sources": [{"name": p.name, "sha256": _digest(p)} for p in sources],
        "luksbench_version": pkg_version,
    }


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("luksbench", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_paper(
    processed_dir: Path,
    figures_dir: Path,
    out_md: Path,
    run: str,
    baseline: str | None = None,
    variant: str | None = None,
) -> Path:
    """Render ``templates/paper.md.j2`` with the processed tables of ``run`` into ``out_md``.

    Figure links are relative to ``out_md``'s folder. ``baseline``/``variant`` default to those of
    ``loss.parquet``. Returns ``out_md``.
    """
    out_md = Path(out_md)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    context = paper_context(processed_dir, figures_dir, out_md, run, baseline, variant)
    text = _environment().get_template(TEMPLATE).render(**context)
    out_md.write_text(text)
    return out_md


def render_html(md_path: Path, html_path: Path | None = None) -> Path:
    """Markdown -> standalone HTML beside it (markdown-it-py, CommonMark + tables)."""
    from markdown_it import MarkdownIt

    md_path = Path(md_path)
    html_path = Path(html_path) if html_path else md_path.with_suffix(".html")
    text = md_path.read_text()
    title = next(
        (line[2:].strip() for line in text.splitlines() if line.startswith("# ")), md_path.stem
    )
    body = MarkdownIt("commonmark").enable("table").render(text)
    html_path.write_text(
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<title>{title}</title></head>\n<body>\n{body}</body></html>\n"
    )
    return html_path
