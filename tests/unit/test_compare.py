"""``luksbench compare RUN_A RUN_B``: change per cell and stack with paired-where-justified
intervals, BH verdicts, table and figure.

Runs are copies of the shipped sample (real fio json+ output). A known change is injected by
scaling the bandwidth and IOPS of one cell's encrypted results on one side by 0.8, so the right
answer is exactly -20 % there and 0 elsewhere.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy import stats as sps

from luksbench.analysis import ingest, stats
from luksbench.analysis import runcompare as compare

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "raw" / "sample"
CELL = "read-1m-qd1"
BIN = Path(sys.executable).parent


def writable(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def scale_throughput(path: Path, factor: float) -> None:
    """Bandwidth, IOPS and the bytes moved in the same runtime of every direction of a fio result
    times ``factor`` (latency kept; ingest refuses bandwidth that io_bytes / runtime contradicts)."""
    doc = json.loads(path.read_text())
    for job in doc["jobs"]:
        for direction in ("read", "write", "trim"):
            d = job.get(direction) or {}
            for key in ("bw_bytes", "bw", "iops"):
                if d.get(key):
                    d[key] = d[key] * factor
            for key in ("io_bytes", "io_kbytes"):
                if d.get(key):
                    d[key] = round(d[key] * factor)
    path.write_text(json.dumps(doc))


def shift_sessions(host_dir: Path, days: int) -> None:
    """Move a host's session records in time (a run measured on another day)."""
    for path in [host_dir / "fio" / "manifest.json", *(host_dir / "fio" / "sessions").glob("*")]:
        doc = json.loads(path.read_text())

        def later(value):
            ts = pd.Timestamp(value) + timedelta(days=days)
            return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"

        doc["started"], doc["ended"] = later(doc["started"]), later(doc["ended"])
        for run in doc["runs"]:
            run["started"], run["ended"] = later(run["started"]), later(run["ended"])
        path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """fleet: hosts vm and vm2 measured side by side (vm2 = vm with luks read-1m-qd1 at 0.8x);
    later: the sample measured again a day later, the same cell at 0.8x."""
    base = tmp_path_factory.mktemp("compare")
    fleet = base / "raw" / "fleet"
    shutil.copytree(SAMPLE, fleet)
    writable(fleet)
    shutil.copytree(fleet / "vm", fleet / "vm2")
    later = base / "raw" / "later"
    shutil.copytree(fleet / "vm", later / "vm")
    shift_sessions(later / "vm", days=1)
    for host in (fleet / "vm2", later / "vm"):
        for rep in (host / "fio" / "luks" / CELL).glob("rep?.json"):
            scale_throughput(rep, 0.8)
    out = {"fleet_raw": fleet, "later_raw": later, "base": base}
    for name in ("fleet", "later"):
        processed = base / "processed" / name
        ingest.write_processed(base / "raw" / name, processed, workers=1)
        out[name] = processed
    return out


def row(table: pd.DataFrame, metric: str, stack: str = "luks", workload: str = CELL) -> pd.Series:
    sel = table[
        (table["metric"] == metric) & (table["stack"] == stack) & (table["workload"] == workload)
    ]
    assert len(sel) == 1, sel
    return sel.iloc[0]


def test_hosts_measured_side_by_side_are_paired(runs):
    fleet = compare.load_run_data(runs["fleet"])
    table = compare.compare_runs(fleet, fleet, hosts=["vm=vm2"])
    assert list(table.columns) == compare.COMPARE_COLUMNS
    assert set(table["design"]) == {"paired"}
    assert "same round k" in table.attrs["designs"]["vm=vm2"]["reason"]
    bw = row(table, "bw_bytes")
    assert bw["change_pct"] == pytest.approx(-20.0)
    assert bw["ci_low"] == pytest.approx(-20.0) and bw["ci_high"] == pytest.approx(-20.0)
    assert (bw["verdict"], bw["outcome"], bw["n"]) == ("significant", "worse", 3)
    # latency untouched, every other cell identical: equivalent, "same"; p99 of a 2 s run of
    # 1 MiB reads rests on too few I/Os in both runs: no number, "insufficient"
    assert row(table, "clat_p99_ns")["outcome"] == "insufficient"
    assert row(table, "clat_p99_ns", workload="read-4k-qd1")["outcome"] == "same"
    others = table[(table["workload"] != CELL) & (table["n"] >= 2)]
    assert set(others["outcome"]) == {"same"} and (others["change_pct"] == 0).all()
    # metrics: bandwidth, IOPS, p99 latency, CPU per GiB, 16 cells x 2 stacks each
    assert table.groupby("metric").size().to_dict() == {m: 32 for m in compare.COMPARE_METRICS}


def mark_sessions(raw: Path, host: str, session_of_rep, *more_hosts: str) -> Path:
    """A copy of a raw run whose records say each result's session (``session_of_rep(k)``): the
    same measurements read as a two-session run."""
    out = raw.parent / f"{raw.name}-sessions-{'-'.join((host, *more_hosts))}"
    shutil.copytree(raw, out)
    writable(out)
    records = [
        path
        for h in (host, *more_hosts)
        for path in [out / h / "fio" / "manifest.json", *(out / h / "fio" / "sessions").glob("*")]
    ]
    for path in records:
        doc = json.loads(path.read_text())
        doc["sessions"] = 2
        for run in doc["runs"]:
            run["session"] = session_of_rep(run["rep"])
        path.write_text(json.dumps(doc))
    return out


def test_runs_from_different_sessions_are_not_paired(runs):
    a, b = compare.load_run_data(runs["fleet_raw"]), compare.load_run_data(runs["later_raw"])
    table = compare.compare_runs(a, b)  # host vm is in both runs: compared by name
    assert set(table["design"]) == {"one session"}
    reason = table.attrs["designs"]["vm=vm"]["reason"]
    assert "did not overlap in time" in reason and "cannot be estimated" in reason
    bw = row(table, "bw_bytes")
    # every repetition scaled by 0.8: the change is exactly -20 %, but one session per run
    # cannot tell it from a session effect: no interval
    assert bw["change_pct"] == pytest.approx(-20.0)
    assert np.isnan(bw["ci_low"]) and bw["verdict"] == "insufficient"
    assert bw["n_a"] == bw["n_b"] == 1

    # the same results recorded as two sessions (rep 1; reps 2-3): Welch over session means
    def session(rep):
        return "s1" if rep == 1 else "s2"

    a = compare.load_run_data(mark_sessions(runs["fleet_raw"], "vm", session))
    b = compare.load_run_data(mark_sessions(runs["later_raw"], "vm", session))
    moderated = compare.compare_runs(a, b)
    assert row(moderated, "bw_bytes")["moderated"] and row(moderated, "bw_bytes")["prior_df"] > 0
    table = compare.compare_runs(a, b, moderate=False)
    assert set(table["design"]) == {"sessions"} and not table["moderated"].any()
    bw = row(table, "bw_bytes")
    assert bw["change_pct"] == pytest.approx(-20.0)
    assert bw["n_a"] == bw["n_b"] == 2 and bw["df"] > 0

    def session_means(fio):
        sel = fio[(fio["host"] == "vm") & (fio["stack"] == "luks") & (fio["workload"] == CELL)]
        sel = stats.active_rows(sel).assign(log=lambda x: np.log(x["bw_bytes"].astype(float)))
        return sel.groupby("session")["log"].mean().to_numpy()

    la, lb = session_means(a.fio), session_means(b.fio)
    ref = sps.ttest_ind(lb, la, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert bw["ci_low"] == pytest.approx(100 * (np.exp(ci.low) - 1))
    assert bw["ci_high"] == pytest.approx(100 * (np.exp(ci.high) - 1))
    assert bw["p_value"] == pytest.approx(ref.pvalue)
    # BH across the whole comparison, verdicts as in the loss table
    tested = table["p_value"].notna()
    assert (table["q_value"] >= table["p_value"] - 1e-12)[tested].all()
    assert table["verdict"].isin(stats.VERDICTS).all()
    # hosts measured side by side, but in two sessions each: repetitions of one session share
    # its effect, so the sessions are the replicates, not the pairs
    raw = mark_sessions(runs["fleet_raw"], "vm", session, "vm2")
    both = compare.load_run_data(raw)
    table = compare.compare_runs(both, both, hosts=["vm=vm2"])
    assert set(table["design"]) == {"sessions"} and row(table, "bw_bytes")["n_a"] == 2
    # forcing the unpaired design on the side-by-side hosts: the same point estimate
    fleet = compare.load_run_data(runs["fleet"])
    forced = compare.compare_runs(fleet, fleet, hosts=["vm=vm2"], unpaired=True)
    assert set(forced["design"]) == {"one session"}
    assert row(forced, "bw_bytes")["change_pct"] == pytest.approx(-20.0)


def test_welch_interval_matches_scipy():
    rng = np.random.default_rng(7)
    for na, nb in ((3, 3), (4, 9), (12, 5)):
        a, b = rng.normal(0, 0.1, na), rng.normal(0.05, 0.3, nb)
        ci = stats.welch_log_ratio_ci(a, b, 0.9)
        ref = sps.ttest_ind(b, a, equal_var=False)
        assert (ci.low, ci.high) == pytest.approx(tuple(ref.confidence_interval(0.9)))
        assert ci.df == pytest.approx(ref.df)
        assert stats.welch_t_pvalue(a, b) == pytest.approx(ref.pvalue)
    assert np.isnan(stats.welch_log_ratio_ci([0.1], [0.2, 0.3]).low)


def test_bad_requests_are_named(runs):
    fleet, later = compare.load_run_data(runs["fleet"]), compare.load_run_data(runs["later"])
    with pytest.raises(compare.CompareError, match="host 'nope' is not in run fleet"):
        compare.compare_runs(fleet, later, hosts=["nope"])
    with pytest.raises(compare.CompareError, match="compared with itself"):
        compare.compare_runs(fleet, fleet, hosts=["vm"])
    with pytest.raises(compare.CompareError, match="serpent"):
        compare.compare_runs(fleet, later, stacks=["serpent"])
    with pytest.raises(compare.CompareError, match="not found"):
        compare.load_run_data(runs["base"] / "no-such-run")


@pytest.mark.slow
def test_cli_writes_table_markdown_and_figure(runs, tmp_path):
    out = tmp_path / "cmp"
    result = subprocess.run(
        [
            str(BIN / "luksbench"),
            "compare",
            str(runs["fleet_raw"]),  # a raw run folder: ingested on the fly
            str(runs["later"]),  # a processed folder
            "--host",
            "vm",
            "--stack",
            "luks",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "**unpaired**, one session on a side: no interval" in result.stdout
    assert "| read 1m QD1 | `luks` |" in result.stdout
    table = pd.read_parquet(out / "compare.parquet")
    assert set(table["stack"]) == {"luks"} and len(table) == 16 * 4
    assert len(pd.read_csv(out / "compare.csv")) == len(table)
    assert (out / "compare.md").read_text() == result.stdout
    meta = Image.open(out / "compare.png").text
    assert meta["made_by"] == "luksbench.publish.comparepage.compare_figure"
    assert "one session" in meta["designs"]
    assert (out / "compare.svg").stat().st_size > 0
    counts = table["outcome"].value_counts()
    assert f"{len(table)} rows: " + ", ".join(f"{counts[k]} {k}" for k in counts.index) in (
        result.stderr
    )

    bad = subprocess.run(
        [str(BIN / "luksbench"), "compare", "nope-a", "nope-b", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "run 'nope-a' not found" in bad.stderr


def test_cli_refuses_an_out_that_is_a_file(runs, tmp_path):
    out = tmp_path / "results.md"
    out.write_text("someone's notes")
    argv = ["compare", str(runs["fleet_raw"]), str(runs["later"]), "--out", str(out)]
    result = subprocess.run(
        [str(BIN / "luksbench"), *argv], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"--out {out} is a file, not a folder" in result.stderr
    assert out.read_text() == "someone's notes"
