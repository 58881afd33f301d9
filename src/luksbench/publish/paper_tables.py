"""The paper's tables, as formatted rows: the detailed loss table per metric, the SCS post's
shape (block sizes as columns), cells whose baseline was limited, the cipher benchmark. Every
value is read from one row of the processed tables; formatting happens here."""

from __future__ import annotations

import pandas as pd

from luksbench.analysis.cells import with_pattern
from luksbench.analysis.contrasts import label
from luksbench.analysis.tails import TOO_FEW
from luksbench.publish.ceilings import available_ciphers, estimate_mark
from luksbench.publish.paper_sentences import decision_counts
from luksbench.publish.text import (
    LIMITS,
    METRIC_UNITS,
    MIXED_RW,
    bs_human,
    cell_name,
    decision_kind,
    effect_ci,
    fmt_ci,
    fmt_num,
    fmt_pct,
    fmt_text,
    limits,
    metric_heading,
    missing,
    multi_job,
    rw_rank,
    rw_words,
    sorted_metrics,
)


def _too_few(row) -> bool:
    """A latency percentile withheld for too few I/Os (loss.parquet's ``note``) in every pair."""
    note = row.get("note")
    return row["n"] < 2 and not missing(note) and str(note).startswith(TOO_FEW)


def loss_sections(loss: pd.DataFrame) -> list[dict]:
    """One table per metric: rows rw x bs x iodepth (x pattern) with means, effect [CI], verdict,
    n. Called with one comparison's rows (several: the variant is named in every row)."""
    sections = []
    multi_host = loss["host"].nunique() > 1
    several_jobs = multi_job(loss)
    multi_variant = "variant" in loss and loss["variant"].nunique() > 1
    folded = same_test_as_bandwidth(loss)
    loss = loss[~folded]
    for metric in dict.fromkeys(loss["metric"]):
        sub = loss[loss["metric"] == metric]
        heading, unit, div, dec = METRIC_UNITS.get(metric, (metric, "", 1, 2))
        rows = [
            {
                "cell": (f"{r['host']}: " if multi_host else "")
                + cell_name(r, several_jobs)
                + (f" — `{r['variant']}`" if multi_variant else ""),
                "n": int(r["n"]),
                "n_dropped": int(r["n_dropped"]),
                "baseline_mean": fmt_num(r["baseline_mean"] / div, dec),
                "variant_mean": fmt_num(r["variant_mean"] / div, dec),
                "effect": TOO_FEW if _too_few(r) else fmt_pct(r["effect_pct"]),
                "ci": fmt_ci(r["ci_low"], r["ci_high"]),
                "decision": r["decision"] + _limited_mark(r),
                "verdict": r["verdict"],
                "q": fmt_num(r["q_value"], 3),
            }
            for r in sub.to_dict("records")
        ]
        sections.append(
            {"metric": metric, "heading": heading, "unit": unit, "kind": sub["effect"].iloc[0]}
            | {"rows": rows, "any_dropped": any(r["n_dropped"] for r in rows)}
            | {"iops_folded": metric == "bw_bytes" and bool(folded.any())}
        )
    return sections


def same_test_as_bandwidth(loss: pd.DataFrame) -> pd.Series:
    """IOPS rows that repeat the bandwidth test (loss.parquet's ``derived_from``: same cell, one
    block size, so IOPS is bandwidth / block size) and reach the bandwidth row's decision: the
    paper folds them into the bandwidth tables. fio averages IOPS its own way, so the effect can
    differ slightly; an IOPS row with another decision keeps its own row."""
    derived = loss.get("derived_from", pd.Series("", index=loss.index)).fillna("")
    candidates = loss["metric"].eq("iops") & derived.eq("bw_bytes")
    keys = ["host", "baseline", "variant", "workload", "direction", "job_slot"]
    bw = loss[loss["metric"].eq("bw_bytes")].drop_duplicates(keys).set_index(keys)["decision"]
    at = pd.MultiIndex.from_frame(loss[keys])
    same = pd.Series(bw.reindex(at).to_numpy(), index=loss.index).eq(loss["decision"])
    return candidates & same


def _limited_mark(row) -> str:
    """' (fio-bound)' / ' (CPU saturated)' after a decision whose baseline was limited."""
    return f" ({limits(row)})" if limits(row) else ""


_CELL_KEYS = ["host", "baseline", "variant", "workload", "direction"]


def limited_cells(losses: pd.DataFrame) -> list[dict]:
    """Cells whose baseline was fio-bound or ran on a saturated CPU (loss.parquet's flags)."""
    flags = [f for f in LIMITS if f in losses]
    rows = losses[losses[flags].any(axis=1)] if flags else losses.iloc[:0]
    return [
        {
            "host": r["host"],
            "comparison": f"`{r['variant']}` vs `{r['baseline']}`",
            "cell": f"{r['workload']} {r['direction']}".strip(),
            "limit": limits(r),
            "bias": limit_bias(r),
            "job_cpu": fmt_num(r["baseline_job_cpu_pct"], 0),
            "busy": fmt_num(r["baseline_busy_pct"], 0),
        }
        for _, r in rows.drop_duplicates(_CELL_KEYS).iterrows()
    ]


#: what a limited baseline does to the loss, where the direction is known
BIAS_FIO_BOUND = "understated: the loss is a lower bound"


BIAS_UNKNOWN = "unknown: may be over- or understated"


def limit_bias(row) -> str:
    """The direction of the bias of a limited baseline's loss, said only where known: a fio-bound
    baseline (fio's own thread the limit, the device idle) could have gone faster, so the loss is
    understated; on a saturated CPU the arms compete with other work for the CPU and the
    encrypted arm needs more of it, so the loss may be overstated as well: direction unknown."""
    if bool(row.get("cpu_saturated") or False):
        return BIAS_UNKNOWN
    if bool(row.get("fio_bound") or False):
        return BIAS_FIO_BOUND
    return ""


def unchecked_cells(losses: pd.DataFrame) -> int:
    """Cells whose baseline recorded neither fio's CPU per job nor the machine's busy share."""
    values = losses.reindex(columns=["baseline_job_cpu_pct", "baseline_busy_pct"])
    return len(losses[values.isna().all(axis=1)].drop_duplicates(_CELL_KEYS))


def comparison_sections(losses: pd.DataFrame, pairs: list[tuple[str, str]]) -> list[dict]:
    """One section per comparison, in ``pairs`` order (the headline first): its label, stacks,
    SCS-shaped tables, detailed loss tables and how many of its rows are significant."""
    out = []
    for k, (baseline, variant) in enumerate(pairs):
        rows = losses[(losses["baseline"] == baseline) & (losses["variant"] == variant)]
        out.append(
            {"label": label((baseline, variant)), "baseline": baseline, "variant": variant}
            | {"headline": k == 0, "scs_tables": scs_tables(rows), **tally(rows)}
            | {"loss_sections": loss_sections(rows)}
        )
    return out


def tally(rows: pd.DataFrame) -> dict:
    """How many of ``rows`` are significant, their decisions, how many there are."""
    n_significant = int((rows["verdict"] == "significant").sum())
    return {"n_significant": n_significant, "decisions": decision_counts(rows), "n_rows": len(rows)}


#: metrics that get SCS-shaped tables (all metrics are in the detailed Results section)
SCS_TABLE_METRICS = ("bw_bytes", "iops", "clat_p99_ns")


def scs_tables(losses: pd.DataFrame) -> list[dict]:
    """Loss tables in the SCS post's shape: one per rw pattern (and direction), config pattern and
    metric; rows = host / stack / iodepth, columns = block sizes; cells = effect [CI] and a
    verdict mark. Cells of two config patterns never share a table."""
    losses = with_pattern(losses)
    multi_host = losses["host"].nunique() > 1
    several_jobs = multi_job(losses)
    folded = same_test_as_bandwidth(losses)
    shape_keys = ["pattern", "rw", "direction"]
    folded_shapes = set(losses.loc[folded, shape_keys].itertuples(index=False, name=None))
    losses = losses[~folded]
    tables = []
    shapes = losses.groupby(["pattern", "rw", "direction"], sort=False)
    for (pattern, rw, direction), sub_rw in sorted(
        shapes, key=lambda s: (s[0][0], rw_rank(s[0][1]), s[0][1], s[0][2])
    ):
        mixed = rw in MIXED_RW
        for metric in sorted_metrics(set(sub_rw["metric"]) & set(SCS_TABLE_METRICS)):
            sub = sub_rw[sub_rw["metric"] == metric]
            heading = metric_heading(metric)
            kind = str(sub["effect"].iloc[0])
            cols = sorted(sub["bs_bytes"].unique())
            rows = []
            keys = ["host", "baseline", "variant", "iodepth", "job_slot"]
            for (host, base, variant, qd, _), g in sub.groupby(keys, sort=True):
                versus = f" vs {base}" if sub["baseline"].nunique() > 1 else ""
                label = f"{host}: " if multi_host else ""
                label += f"{variant}{versus}, QD{int(qd)}"
                if several_jobs:
                    label += f", job `{g['job'].iloc[0]}`"
                at = {r["bs_bytes"]: r for r in g.drop_duplicates("bs_bytes").to_dict("records")}
                cells = [
                    f"{effect_ci(at[b])} {decision_kind(at[b]['decision'])}"
                    if b in at
                    else "not measured"
                    for b in cols
                ]
                rows.append(((host, variant != sub["variant"].iloc[0]), [label, *cells]))
            rows.sort(key=lambda r: r[0])
            tables.append(
                {
                    "title": f"{rw_words(rw).capitalize()}"
                    + (f" ({direction})" if mixed else "")
                    + (f", pattern `{pattern}`" if pattern else "")
                    + f": {heading.lower() if heading != 'IOPS' else 'IOPS'} {kind}"
                    + (
                        " (and IOPS: the same test at one block size)"
                        if metric == "bw_bytes" and (pattern, rw, direction) in folded_shapes
                        else ""
                    ),
                    "header": ["stack", *(f"{bs_human(b)} % {kind}" for b in cols)],
                    "rows": [row for _, row in rows],
                }
            )
    return tables


def _pbkdf_result(row) -> str:
    if row["kind"] == "pbkdf2":
        return f"{fmt_num(row['iterations_per_s'], 0)} iterations/s"
    return (
        f"{fmt_num(row['time_cost'], 0)} iterations, {fmt_num(row['memory_kib'], 0)} KiB, "
        f"{fmt_num(row['threads'], 0)} threads"
    )


def cryptsetup_section(cs: pd.DataFrame) -> dict:
    if cs.empty:
        return {"present": False, "ciphers": [], "pbkdf": [], "failures": []}
    failures = cs[~cs["available"].fillna(True).astype(bool)]
    pbkdf = cs[cs["kind"].isin(["pbkdf2", "argon2"])]
    return {
        "present": True,
        "ciphers": [
            {
                "host": r["host"],
                "algorithm": fmt_text(r["algorithm"]) + estimate_mark(r),
                "key_bits": fmt_num(r["key_bits"], 0),
                "enc": fmt_num(r["encryption_mib_s"], 1),
                "dec": fmt_num(r["decryption_mib_s"], 1),
            }
            for _, r in available_ciphers(cs).iterrows()
        ],
        "pbkdf": [
            {"host": r["host"], "algorithm": fmt_text(r["algorithm"]), "value": _pbkdf_result(r)}
            for _, r in pbkdf.iterrows()
        ],
        "failures": sorted(
            {(r.host, fmt_text(r.algorithm), fmt_text(r.note)) for r in failures.itertuples()}
        ),
    }
