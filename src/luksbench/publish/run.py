"""One processed run as figures, paper and notebooks see it: ``load_run(processed_dir)``.

A :class:`Run` holds every table of ``data/processed/<run>/`` by file name (``fio``, ``loss``,
``arms``, ``env`` ...) and the facts read from them. Nothing here computes a statistic: those are
in the tables.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass, field
from functools import cached_property
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pandas as pd

from luksbench.analysis.cells import with_pattern
from luksbench.analysis.contrasts import Pair, comparison_pairs
from luksbench.formats.layout import bs_label
from luksbench.publish.text import missing

#: tables a run cannot be published without (written by notebooks 01 and 02)
REQUIRED = ("fio", "env", "loss")


@dataclass
class Run:
    """The tables of one processed run and the facts derived from them."""

    processed_dir: Path
    tables: dict[str, pd.DataFrame] = field(repr=False)

    def table(self, name: str, columns=()) -> pd.DataFrame:
        """Table ``name``, or an empty one with ``columns`` when the run has none."""
        return self.tables.get(name, pd.DataFrame(columns=list(columns)))

    @cached_property
    def fio(self) -> pd.DataFrame:
        return with_pattern(self.tables["fio"])

    @cached_property
    def loss(self) -> pd.DataFrame:
        return with_pattern(self.tables["loss"])

    @property
    def env(self) -> pd.DataFrame:
        return self.table("env", ["host", "captured", "coordinator", "config_hash"])

    @property
    def stacks(self) -> pd.DataFrame:
        return self.table("stacks", ["host", "stack", "kind", "backend"])

    @property
    def plan_stacks(self) -> pd.DataFrame:
        return self.table("plan_stacks", ["host", "stack"])

    @property
    def patterns(self) -> pd.DataFrame:
        return self.table("patterns", ["host", "pattern", "description", "io_bs"])

    @property
    def cryptsetup(self) -> pd.DataFrame:
        return self.table("cryptsetup", ["host", "kind"])

    @cached_property
    def pairs(self) -> list[Pair]:
        """Every comparison of loss.parquet, the headline first."""
        return comparison_pairs(self.loss)

    @property
    def confidence(self) -> float:
        return float(self.loss["confidence"].iloc[0])

    @property
    def hosts(self) -> list[str]:
        return sorted(self.fio["host"].unique())

    def headline_first(self, baseline: str | None = None, variant: str | None = None) -> list[Pair]:
        """The comparisons with (``baseline``, ``variant``) first when it is one of them (either
        may be None: any), else loss.parquet's order."""
        pairs = self.pairs
        headline = next((p for p in pairs if p == (baseline or p[0], variant or p[1])), pairs[0])
        return [headline, *[p for p in pairs if p != headline]]

    def stack_order(self) -> list[str]:
        """Stacks with results, the headline comparison's first, then the others alphabetically:
        the order of every legend."""
        stacks = set(self.fio["stack"].dropna().unique())
        first = [s for s in self.pairs[0] if s in stacks]
        return first + sorted(stacks - set(first))

    def digests(self) -> dict[str, str]:
        """{``<table>.parquet``: SHA-256} of every table file of the run."""
        return {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(self.processed_dir.glob("*.parquet"))
        }


def load_run(processed_dir: Path) -> Run:
    """Every ``*.parquet`` table of ``processed_dir``; FileNotFoundError naming the step to run
    when the tidy tables or the loss table are missing, ValueError when the loss table is empty."""
    processed_dir = Path(processed_dir)
    tables = {p.stem: pd.read_parquet(p) for p in sorted(processed_dir.glob("*.parquet"))}
    for name in REQUIRED:
        if name not in tables:
            step = "the loss step (notebook 02)" if name == "loss" else "the ingest first"
            raise FileNotFoundError(f"{processed_dir / (name + '.parquet')} is missing: run {step}")
    if tables["loss"].empty:
        raise ValueError(f"{processed_dir}: the loss table is empty")
    return Run(processed_dir, tables)


def unavailable_stacks(stacks: pd.DataFrame) -> list[dict]:
    """Optional stacks that could not be built, one dict per host and stack: host, stack, kind,
    reason (the stacks table's ``available``/``reason`` columns)."""
    out = []
    if stacks is None or stacks.empty:
        return out
    for _, row in stacks.iterrows():
        reason = row.get("reason")  # None without the column
        has_reason = isinstance(reason, str) and bool(reason.strip())
        if has_reason or (not missing(row.get("available")) and not bool(row.get("available"))):
            kind = None if missing(row.get("kind")) else str(row.get("kind"))
            why = str(reason).strip().rstrip(".") if has_reason else "no reason recorded"
            host, stack = str(row["host"]), str(row["stack"])
            out.append({"host": host, "stack": stack, "kind": kind, "reason": why})
    return out


def planned_stacks(plan_stacks: pd.DataFrame) -> dict[str, list[str]]:
    """Stacks each host's plan (env.json; the plan_stacks table) asked for: {host: [stack, ...]}."""
    return {str(h): sorted(g["stack"]) for h, g in plan_stacks.groupby("host", sort=True)}


def measured_matrix(fio: pd.DataFrame) -> dict[str, str]:
    """The access patterns, block sizes and queue depths of ``fio``'s results, as listed."""
    return {
        "rw": ", ".join(f"`{x}`" for x in sorted(fio["rw"].dropna().unique())),
        "bs": ", ".join(bs_label(int(b)) for b in sorted(fio["bs_bytes"].dropna().unique())),
        "iodepth": ", ".join(str(int(q)) for q in sorted(fio["iodepth"].dropna().unique())),
    }


def _pattern_options(rows: pd.DataFrame, spec) -> list[str]:
    """The fio options a pattern's cells ran with: job options of the results, plan settings."""
    options = []
    engines = sorted(rows["ioengine"].dropna().astype(str).unique()) if "ioengine" in rows else []
    if engines:
        options.append("ioengine " + "/".join(engines))
    directs = sorted(rows["direct"].dropna().unique()) if "direct" in rows else []
    if directs:
        options.append("direct=" + "/".join(str(int(d)) for d in directs))
    io_bs = rows["io_bs_bytes"].dropna() if "io_bs_bytes" in rows else pd.Series(dtype=float)
    if len(io_bs) and (io_bs != rows.loc[io_bs.index, "bs_bytes"]).any():
        sizes = "/".join(bs_label(int(b)) for b in sorted(io_bs.unique()))
        options.append(
            f"each block of bs done as {sizes} I/Os at sequential offsets, one random seek per "
            "block (a block smaller than that is one I/O)"
        )
    elif not missing(spec.get("io_bs")) and spec.get("io_bs"):
        options.append(f"blocks of bs in {spec['io_bs']} I/Os (io_bs)")
    if _true(spec.get("fsync_per_block")):
        options.append("an fsync after every block of writes")
    if _true(spec.get("sync")):
        options.append("O_SYNC writes (sync=1)")
    return options


def _true(value) -> bool:
    return not missing(value) and bool(value)


def pattern_facts(fio: pd.DataFrame, patterns: pd.DataFrame) -> list[dict]:
    """Each pattern of the run ("" = the main matrix first): name, description, cells, rw, bs,
    iodepth (as measured) and ``options``: the fio options its cells ran with (``patterns``:
    the patterns table, the plans' declarations)."""
    if fio is None or fio.empty:
        return []
    fio = with_pattern(fio)
    declared = (
        {r["pattern"]: r for r in patterns.to_dict("records")} if patterns is not None else {}
    )
    out = []
    for name in sorted(fio["pattern"].dropna().unique(), key=lambda n: (n != "", n)):
        rows = fio[fio["pattern"] == name]
        spec = declared.get(name) or {}
        out.append(
            {
                "name": name,
                "description": "" if missing(d := spec.get("description")) else str(d).strip(),
                "cells": int(rows["workload"].nunique()),
                **measured_matrix(rows),
                "options": "; ".join(_pattern_options(rows, spec)) or "n/a",
            }
        )
    return out


def run_date(env: pd.DataFrame, fio: pd.DataFrame) -> str:
    """Date of the measurement: the latest env.json capture, else the latest fio timestamp."""
    captured = pd.to_datetime(env.get("captured", pd.Series(dtype=object)), utc=True).max()
    if not pd.isna(captured):
        return captured.strftime("%Y-%m-%d")
    ts = pd.to_numeric(fio.get("timestamp", pd.Series(dtype=float)), errors="coerce").max()
    return "unknown" if pd.isna(ts) else pd.Timestamp(ts, unit="s").strftime("%Y-%m-%d")


def git_commit() -> str:
    """``git rev-parse HEAD`` of the checkout holding this package, else "unknown"."""
    argv = ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD"]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    out = result.stdout.strip()
    return out if result.returncode == 0 and len(out) == 40 else "unknown"


def config_hashes(env: pd.DataFrame) -> dict[str, str]:
    """{host: its plan's ``config_hash`` (ingest: SHA-256 over env.json's plan), "unknown" when
    env.json has no plan}."""
    hashes = env.get("config_hash", pd.Series(index=env.index, dtype=object))
    return {
        str(h): "unknown" if missing(c) else str(c)
        for h, c in zip(env["host"], hashes, strict=True)
    }


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

    return {
        "git_commit": git_commit(),
        "config_hash": _joined(config_hashes(env)),
        "fio_version": _joined(versions("fio_version")),
        "cryptsetup_version": _joined(versions("cryptsetup_version")),
    } | ({"notebook": notebook} if notebook else {})


def package_version() -> str:
    try:
        return version("luksbench")
    except PackageNotFoundError:  # pragma: no cover - source checkout without install
        return "unknown"
