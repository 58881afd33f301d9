"""Shared by figures and paper: which stacks are compared, provenance facts, published references.

``variant_losses``     the loss table of every comparison (loss.parquet's, or every stack against
                       the baseline), headline first; ``comparison_pairs`` lists them in order.
``unavailable_stacks`` optional stacks that could not be built, with the reason (stacks table).
``pattern_facts``      the patterns of a run with their description and fio options, from the
                       plan in env.json and the fio job options of the results.
``provenance_facts``   git commit, config hash (of the plan in env.json), fio / cryptsetup versions.
``crypto_ceilings``    cipher throughput x logical CPUs per host and LUKS stack, or why there is none.
``latency_table``      completion-latency histograms of the json+ raw files, active directions only.
``read_references``    the transcribed published results in ``data/reference/``.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from pathlib import Path

import pandas as pd

from luksbench.formats.envdoc import env_plan, parse_env_json

#: rw pattern -> words, as the SCS post names its tables
RW_WORDS = {
    "read": "sequential read",
    "write": "sequential write",
    "randread": "random read",
    "randwrite": "random write",
    "rw": "sequential read/write",
    "readwrite": "sequential read/write",
    "randrw": "random read/write",
    "trim": "trim",
    "randtrim": "random trim",
}

REFERENCE_FILES = {
    "scs": "scs_2023_loss_tables.csv",
    "ceph": "ceph_reef_2023_luks.csv",
    "raid5": "raid5_2012_conclusions.csv",
}


def rw_words(rw: str) -> str:
    return RW_WORDS.get(str(rw), str(rw))


# ------------------------------------------------------------------------------------------ stacks


def stack_order(stacks, baseline: str, variant: str | None = None) -> list[str]:
    """Baseline first, then the configured variant, then the others alphabetically."""
    stacks = set(stacks)
    first = [s for s in (baseline, variant) if s and s in stacks]
    return first + sorted(stacks - set(first))


def comparison_pairs(losses: pd.DataFrame) -> list[tuple[str, str]]:
    """The (baseline, variant) pairs of a loss table in the order of its rows (headline first)."""
    if losses is None or losses.empty:
        return []
    return list(
        dict.fromkeys(
            zip(losses["baseline"].astype(str), losses["variant"].astype(str), strict=True)
        )
    )


def variant_losses(
    fio: pd.DataFrame,
    loss: pd.DataFrame | None,
    baseline: str,
    variant: str,
    metrics: list[str] | None = None,
    confidence: float | None = None,
    comparisons=None,
) -> pd.DataFrame:
    """The loss rows of every comparison, headline first (columns ``baseline``/``variant`` say
    which).

    ``comparisons`` (pairs or config ``analysis.comparisons``): rows from ``loss`` (loss.parquet)
    where it has them, the rest computed with :func:`luksbench.analysis.stats.loss_table` using the same
    metrics and confidence. None: the comparisons of ``loss`` as they are; without a loss table,
    every stack against ``baseline`` (``variant`` first).
    """
    from luksbench.analysis.contrasts import resolve
    from luksbench.analysis.stats import DEFAULT_METRICS, loss_table

    have = loss is not None and len(loss) > 0
    if have:
        metrics = metrics or list(dict.fromkeys(loss["metric"]))
        confidence = confidence or float(loss["confidence"].iloc[0])
    metrics = metrics or list(DEFAULT_METRICS)
    confidence = confidence or 0.95
    if comparisons is None and have:
        return loss.reset_index(drop=True)
    pairs = resolve(fio["stack"].dropna().unique(), baseline, variant, comparisons)
    known = set(comparison_pairs(loss)) if have else set()
    parts = []
    for b, v in pairs:
        if (b, v) in known:
            parts.append(loss[(loss["baseline"] == b) & (loss["variant"] == v)])
        else:
            parts.append(loss_table(fio, b, v, metrics=metrics, confidence=confidence))
    return pd.concat(parts, ignore_index=True)


def cpu_losses(fio: pd.DataFrame, baseline: str, stacks, confidence: float):
    """CPU seconds per GiB (busy, system): increase of each stack vs baseline; empty without
    sidecars. ``stacks``: stack names (each against ``baseline``) or (baseline, variant) pairs."""
    from luksbench.analysis.stats import loss_table

    metrics = [
        m
        for m in ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib")
        if m in fio and pd.to_numeric(fio[m], errors="coerce").notna().any()
    ]
    if not metrics:
        return pd.DataFrame()
    pairs = [s if isinstance(s, tuple) else (baseline, s) for s in stacks]
    parts = [
        loss_table(fio, b, v, metrics=metrics, confidence=confidence) for b, v in pairs if b != v
    ]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def planned_stacks(env: pd.DataFrame) -> dict[str, list[str]]:
    """Stacks each host's plan (env.json) asked for: {host: [stack, ...]}."""
    out = {}
    for _, row in env.iterrows():
        plan = env_plan(parse_env_json(row.get("env_json")))
        stacks = plan.get("stacks") or {}
        if isinstance(stacks, dict) and stacks:
            out[str(row["host"])] = sorted(stacks)
    return out


def unavailable_stacks(stacks: pd.DataFrame) -> list[dict]:
    """Optional stacks that could not be built, one dict per host and stack: host, stack, kind,
    reason. From the stacks table's ``available``/``reason`` columns, or (tables ingested before
    those existed) the ``unavailable`` entry of the stack's description."""
    out = []
    if stacks is None or stacks.empty:
        return out
    for _, row in stacks.iterrows():
        reason = row.get("reason") if "reason" in stacks.columns else None
        available = row.get("available") if "available" in stacks.columns else None
        if _is_missing(reason):
            reason = _env_dict(row.get("description_json")).get("unavailable")
        if (available is not None and not _is_missing(available) and not bool(available)) or (
            isinstance(reason, str) and reason.strip()
        ):
            out.append(
                {
                    "host": str(row["host"]),
                    "stack": str(row["stack"]),
                    "kind": None if _is_missing(row.get("kind")) else str(row.get("kind")),
                    "reason": str(reason).strip().rstrip(".")
                    if isinstance(reason, str) and reason.strip()
                    else "no reason recorded",
                }
            )
    return out


def _is_missing(value) -> bool:
    if value is None or value is pd.NA:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _size_words(n) -> str:
    from luksbench.formats.layout import bs_label

    return bs_label(int(n))


def pattern_facts(fio: pd.DataFrame, env: pd.DataFrame) -> list[dict]:
    """Each pattern of the run ("" = the main matrix first), as a dict: name, description, cells,
    rw, bs, iodepth (as measured) and ``options``: the fio options its cells ran with, from the
    results' job options (ioengine, direct, I/O size) and the plan recorded in env.json
    (io_bs, fsync_per_block, sync); nothing is typed."""
    from luksbench.analysis.stats import with_pattern
    from luksbench.formats.layout import bs_label

    if fio is None or fio.empty:
        return []
    fio = with_pattern(fio)
    plans = (
        [env_plan(parse_env_json(j)) for j in env.get("env_json", [])] if env is not None else []
    )
    declared: dict = {}
    for plan in plans:
        declared.update(plan.get("patterns") or {})
    out = []
    for name in sorted(fio["pattern"].dropna().unique(), key=lambda n: (n != "", n)):
        rows = fio[fio["pattern"] == name]
        spec = declared.get(name) or {}
        options = []
        engines = (
            sorted(rows["ioengine"].dropna().astype(str).unique()) if "ioengine" in rows else []
        )
        if engines:
            options.append("ioengine " + "/".join(engines))
        directs = sorted(rows["direct"].dropna().unique()) if "direct" in rows else []
        if directs:
            options.append("direct=" + "/".join(str(int(d)) for d in directs))
        io_bs = rows["io_bs_bytes"].dropna() if "io_bs_bytes" in rows else pd.Series(dtype=float)
        blocks = (io_bs != rows.loc[io_bs.index, "bs_bytes"]).any() if len(io_bs) else False
        if blocks:
            sizes = "/".join(bs_label(int(b)) for b in sorted(io_bs.unique()))
            options.append(
                f"each block of bs done as {sizes} I/Os at sequential offsets, one random seek per "
                "block (a block smaller than that is one I/O)"
            )
        elif spec.get("io_bs"):
            options.append(f"blocks of bs in {spec['io_bs']} I/Os (io_bs)")
        if spec.get("fsync_per_block"):
            options.append("an fsync after every block of writes")
        sync = (spec.get("fio") or {}).get("sync")
        if sync:
            options.append("O_SYNC writes (sync=1)")
        out.append(
            {
                "name": name,
                "description": str(spec.get("description") or "").strip(),
                "cells": int(rows["workload"].nunique()),
                "rw": ", ".join(f"`{x}`" for x in sorted(rows["rw"].dropna().unique())),
                "bs": ", ".join(
                    bs_label(int(b)) for b in sorted(rows["bs_bytes"].dropna().unique())
                ),
                "iodepth": ", ".join(
                    str(int(q)) for q in sorted(rows["iodepth"].dropna().unique())
                ),
                "options": "; ".join(options) or "n/a",
            }
        )
    return out


# -------------------------------------------------------------------------------------- provenance


def _env_dict(env_json) -> dict:
    if env_json is None or (isinstance(env_json, float) and math.isnan(env_json)):
        return {}
    try:
        data = json.loads(env_json)
    except (TypeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def git_commit(path: Path | None = None) -> str:
    """``git rev-parse HEAD`` of the checkout holding ``path`` (default: this package), else "unknown"."""
    where = Path(path) if path else Path(__file__).resolve().parent
    try:
        result = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    out = result.stdout.strip()
    return out if result.returncode == 0 and len(out) == 40 else "unknown"


def plan_hash(plan: dict) -> str:
    """First 16 hex digits of SHA-256 over the plan as canonical JSON."""
    text = json.dumps(plan, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_hashes(env: pd.DataFrame) -> dict[str, str]:
    """{host: hash of the plan recorded in its env.json} ("unknown" when env.json has no plan)."""
    out = {}
    for _, row in env.iterrows():
        plan = env_plan(parse_env_json(row.get("env_json")))
        out[str(row["host"])] = plan_hash(plan) if isinstance(plan, dict) and plan else "unknown"
    return out


def _joined(values: dict[str, str]) -> str:
    distinct = sorted(set(values.values()))
    if len(distinct) <= 1:
        return distinct[0] if distinct else "unknown"
    return "; ".join(f"{host}: {value}" for host, value in sorted(values.items()))


def provenance_facts(env: pd.DataFrame, notebook: str | None = None) -> dict[str, str]:
    """What every figure carries: git commit, config hash, tool versions, the notebook that made it."""

    def versions(col):
        return {
            str(r["host"]): (str(r[col]) if col in r and pd.notna(r[col]) else "unknown")
            for _, r in env.iterrows()
        }

    facts = {
        "git_commit": git_commit(),
        "config_hash": _joined(config_hashes(env)),
        "fio_version": _joined(versions("fio_version")),
        "cryptsetup_version": _joined(versions("cryptsetup_version")),
    }
    if notebook:
        facts["notebook"] = notebook
    return facts


# ------------------------------------------------------------------------------------ crypto ceiling


def cipher_key(cipher: str | None) -> str | None:
    """LUKS cipher spec -> ``cryptsetup benchmark`` algorithm: aes-xts-plain64 -> aes-xts."""
    if not cipher or (isinstance(cipher, float) and math.isnan(cipher)):
        return None
    parts = str(cipher).lower().split("-")
    return "-".join(parts[:2]) if len(parts) >= 2 else parts[0]


def crypto_ceilings(
    cryptsetup: pd.DataFrame, stacks: pd.DataFrame, env: pd.DataFrame
) -> list[dict]:
    """Per host and LUKS stack: the cipher's benchmark throughput x logical CPUs, or why not.

    Each dict: host, stack, algorithm, key_bits, cpus, enc_mib_s, dec_mib_s (per core),
    read_ceiling_mib_s (decryption x cpus), write_ceiling_mib_s (encryption x cpus), and
    ``reason`` (None when the ceiling exists, else the sentence saying why it is missing).
    """
    out = []
    luks = stacks[stacks["kind"] == "luks"] if len(stacks) else stacks
    gone = {(u["host"], u["stack"]) for u in unavailable_stacks(stacks)}
    if gone:
        luks = luks[
            [(str(h), str(s)) not in gone for h, s in zip(luks["host"], luks["stack"], strict=True)]
        ]
    for _, st in luks.iterrows():
        host, name = str(st["host"]), str(st["stack"])
        algorithm = cipher_key(st["cipher"])
        key_bits = None if pd.isna(st["key_bits"]) else int(st["key_bits"])
        env_row = env[env["host"] == host]
        cpus = (
            int(env_row["cpu_count"].iloc[0])
            if len(env_row) and pd.notna(env_row["cpu_count"].iloc[0])
            else None
        )
        rec = {
            "host": host,
            "stack": name,
            "algorithm": algorithm,
            "key_bits": key_bits,
            "cpus": cpus,
            "enc_mib_s": None,
            "dec_mib_s": None,
            "read_ceiling_mib_s": None,
            "write_ceiling_mib_s": None,
            "reason": None,
        }
        cs = cryptsetup[cryptsetup["host"] == host] if len(cryptsetup) else cryptsetup
        if cs is None or cs.empty:
            rec["reason"] = f"no `cryptsetup benchmark` output was recorded on {host}"
            out.append(rec)
            continue
        ciphers = cs[cs["kind"] == "cipher"]
        avail = ciphers[ciphers["available"].fillna(False).astype(bool)]
        match = avail[
            (avail["algorithm"].str.lower() == (algorithm or ""))
            & (avail["key_bits"].astype(float) == float(key_bits or -1))
        ]
        if match.empty:
            failed = ciphers[~ciphers["available"].fillna(True).astype(bool)]
            notes = sorted({str(n) for n in failed["note"].dropna() if str(n).strip()})
            if avail.empty and notes:
                rec["reason"] = (
                    f"the cipher benchmark did not run on {host}: " + "; ".join(notes).strip()
                )
            else:
                rec["reason"] = (
                    f"`cryptsetup benchmark` on {host} has no row for {algorithm} "
                    f"{key_bits or '?'}-bit"
                )
            out.append(rec)
            continue
        if cpus is None:
            rec["reason"] = f"env.json of {host} does not give the number of CPUs"
            out.append(rec)
            continue
        row = match.iloc[0]
        rec["enc_mib_s"] = float(row["encryption_mib_s"])
        rec["dec_mib_s"] = float(row["decryption_mib_s"])
        rec["read_ceiling_mib_s"] = rec["dec_mib_s"] * cpus
        rec["write_ceiling_mib_s"] = rec["enc_mib_s"] * cpus
        out.append(rec)
    return out


# ---------------------------------------------------------------------------------------- latency


def latency_table(fio: pd.DataFrame, raw_dir: Path) -> pd.DataFrame:
    """Completion-latency histograms of every result file (json+ ``bins``), active directions only.

    Columns: host, stack, workload, rw, bs_bytes, iodepth, rep, job_slot, direction, pattern, ns,
    count.
    Empty when the run has no json+ files. ``raw_dir`` is the run folder (fio.parquet's ``file``
    column is relative to it).
    """
    from luksbench.analysis.stats import active_rows, with_pattern
    from luksbench.formats.fio import clat_histogram

    cols = [
        "host",
        "stack",
        "workload",
        "rw",
        "bs_bytes",
        "iodepth",
        "rep",
        "job_slot",
        "direction",
        "pattern",
        "ns",
        "count",
    ]
    raw_dir = Path(raw_dir)
    act = active_rows(with_pattern(fio))
    records = []
    for file, rows in act.groupby("file", sort=True):
        path = raw_dir / str(file)
        if not path.exists():
            continue
        hist = clat_histogram(path, warn=lambda _m: None)
        for _, r in rows.iterrows():
            bins = hist.get((int(r["job_index"]), str(r["direction"])))
            for ns, count in bins or []:
                records.append(
                    {
                        **{k: r[k] for k in cols[:10]},
                        "ns": int(ns),
                        "count": int(count),
                    }
                )
    return pd.DataFrame.from_records(records, columns=cols)


# -------------------------------------------------------------------------------------- references


def reference_dir_default() -> Path:
    return Path(__file__).resolve().parents[3] / "data" / "reference"


def read_references(reference_dir: Path | None = None) -> dict[str, pd.DataFrame]:
    """The transcribed published results (``data/reference/*.csv``); missing files are left out."""
    reference_dir = Path(reference_dir) if reference_dir else reference_dir_default()
    out = {}
    for key, name in REFERENCE_FILES.items():
        path = reference_dir / name
        if path.exists():
            out[key] = pd.read_csv(path)
    return out


_SCS_METRIC = {
    "read bandwidth": ("read", "bw_bytes"),
    "write bandwidth": ("write", "bw_bytes"),
    "random read bandwidth": ("randread", "bw_bytes"),
    "random write bandwidth": ("randwrite", "bw_bytes"),
    "read IOPS": ("read", "iops"),
    "write IOPS": ("write", "iops"),
    "random read IOPS": ("randread", "iops"),
    "random write IOPS": ("randwrite", "iops"),
}
_SCS_BS = {"4 KiB": 4096, "64 KiB": 65536, "1 MiB": 2**20, "4 MiB": 4 * 2**20}
_SCS_BS |= {"16 MiB": 16 * 2**20, "64 MiB": 64 * 2**20}


def scs_long(scs: pd.DataFrame) -> pd.DataFrame:
    """The SCS tables with rw, metric, bs_bytes, iodepth and device columns (iodepth 1 = fio default)."""
    df = scs.copy()
    df["rw"] = df["metric"].map(lambda m: _SCS_METRIC[m][0])
    df["our_metric"] = df["metric"].map(lambda m: _SCS_METRIC[m][1])
    df["bs_bytes"] = df["block_size"].map(_SCS_BS).astype("int64")
    df["iodepth"] = df["device_config"].map(lambda d: 32 if "iodepth=32" in d else 1)
    df["device"] = df["device_config"].str.replace(" iodepth=32", "", regex=False)
    return df
