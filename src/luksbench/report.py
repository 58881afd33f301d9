"""Shared by figures and paper: which stacks are compared, provenance facts, published references.

``variant_losses``     the loss table of every non-baseline stack against the baseline (the
                       configured variant from loss.parquet, the others computed the same way).
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


def variant_losses(
    fio: pd.DataFrame,
    loss: pd.DataFrame | None,
    baseline: str,
    variant: str,
    metrics: list[str] | None = None,
    confidence: float | None = None,
) -> pd.DataFrame:
    """Loss of every non-baseline stack against ``baseline`` (column ``variant`` says which).

    The configured variant's rows come from ``loss`` (loss.parquet) when given; other stacks (a
    third stack, a second cipher) are computed with :func:`luksbench.stats.loss_table` using the
    same metrics and confidence.
    """
    from luksbench.stats import DEFAULT_METRICS, loss_table

    if loss is not None and len(loss):
        metrics = metrics or list(dict.fromkeys(loss["metric"]))
        confidence = confidence or float(loss["confidence"].iloc[0])
    metrics = metrics or list(DEFAULT_METRICS)
    confidence = confidence or 0.95
    parts = []
    for stack in stack_order(fio["stack"].dropna().unique(), baseline, variant):
        if stack == baseline:
            continue
        if stack == variant and loss is not None and len(loss):
            parts.append(loss)
        else:
            parts.append(loss_table(fio, baseline, stack, metrics=metrics, confidence=confidence))
    if not parts:
        return loss if loss is not None else pd.DataFrame()
    return pd.concat(parts, ignore_index=True)


def cpu_losses(fio: pd.DataFrame, baseline: str, stacks: list[str], confidence: float):
    """CPU seconds per GiB (busy, system): increase of each stack vs baseline; empty without sidecars."""
    from luksbench.stats import loss_table

    metrics = [
        m
        for m in ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib")
        if m in fio and pd.to_numeric(fio[m], errors="coerce").notna().any()
    ]
    if not metrics:
        return pd.DataFrame()
    parts = [
        loss_table(fio, baseline, s, metrics=metrics, confidence=confidence)
        for s in stacks
        if s != baseline
    ]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def planned_stacks(env: pd.DataFrame) -> dict[str, list[str]]:
    """Stacks each host's plan (env.json) asked for: {host: [stack, ...]}."""
    out = {}
    for _, row in env.iterrows():
        plan = _env_dict(row.get("env_json")).get("plan") or {}
        stacks = plan.get("stacks") or {}
        if isinstance(stacks, dict) and stacks:
            out[str(row["host"])] = sorted(stacks)
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
        plan = _env_dict(row.get("env_json")).get("plan")
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

    Columns: host, stack, workload, rw, bs_bytes, iodepth, rep, job_slot, direction, ns, count.
    Empty when the run has no json+ files. ``raw_dir`` is the run folder (fio.parquet's ``file``
    column is relative to it).
    """
    from luksbench.fio import clat_histogram
    from luksbench.stats import active_rows

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
        "ns",
        "count",
    ]
    raw_dir = Path(raw_dir)
    act = active_rows(fio)
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
                        **{k: r[k] for k in cols[:9]},
                        "ns": int(ns),
                        "count": int(count),
                    }
                )
    return pd.DataFrame.from_records(records, columns=cols)


# -------------------------------------------------------------------------------------- references


def reference_dir_default() -> Path:
    return Path(__file__).resolve().parents[2] / "data" / "reference"


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
