"""How to spend device time between sessions and pairs: the Kalibera-Jones allocation, from a
measured multi-session run.

    python benchmarks/session_design.py [RAW_RUN_DIR] [--target-half-width PCT] [--metric M]

RAW_RUN_DIR: a run measured with ``sessions: k >= 2`` (``data/raw/<run>``). Without it, one is
measured here first on the userspace backend (real fio and cryptsetup on loop-backed files: the
default config's stacks, four cells, 3 sessions x 3 pairs of 2 s runs, about 4 minutes).

Per cell (headline comparison, one metric), from the loss table's variance components of
d = ln(variant / baseline) -- within a session ``s_w`` and between sessions ``s_b`` -- and the
measured costs -- a session's fixed cost ``c_s`` (stack-up, preconditioning, teardown: the time
between one session's last run and the next one's first) and a pair's ``c_p`` (its two fio
runs) -- Kalibera and Jones ("Rigorous benchmarking in reasonable time", ISMM 2013) give the pairs
per session that minimise the cost of a given precision,
``n* = sqrt(c_s s_w^2 / (c_p s_b^2))`` (at least 1), and the sessions m then needed for the
target half-width h of the interval over session means:
``t_{m-1} sqrt((s_b^2 + s_w^2 / n*) / m) <= ln(1 + h / 100)``. Printed with the device time
m (c_s + n* c_p) it costs, beside the run's own design.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from luksbench.analysis import ingest, stats  # noqa: E402
from luksbench.formats.manifest import session_records  # noqa: E402

MAX_SESSIONS = 200
MAX_PAIRS = 50  # per session: with no measurable session effect, "as many as the budget allows"


def measure(work: Path) -> Path:
    """A 3-session run of four cells, measured by the workflow in a copy of it."""
    names = ("Snakefile", "workflow", "config", "envs", "notebooks", "src", "data/reference")
    for name in (*names, "profiles/default"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, work / name)
    config = {
        "run": "sessions-bench",
        "device_size_mib": 256,
        "matrix": {"rw": ["randread", "write"], "bs": ["4k", "1m"], "iodepth": [8]},
        "fio": {"runtime_s": 2, "ramp_time_s": 0},
        "repetitions": 3,
        "sessions": 3,
    }
    (work / "sessions.yaml").write_text(json.dumps(config))
    target = "data/processed/sessions-bench/fio.parquet"
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", target]
    subprocess.run([*cmd, "--configfile", "sessions.yaml"], cwd=work, check=True)
    return work / "data" / "raw" / "sessions-bench"


def costs(host_dir: Path) -> tuple[float, float]:
    """(session cost, pair cost) in seconds, medians over what the records timed: a session's
    cost is its wall time outside its fio runs (idle baseline, clock probe, checks) plus the gap
    to the next session (teardown, stack-up, preconditioning)."""
    sessions = sorted(
        (json.loads(p.read_text()) for p, _ in session_records(host_dir)),
        key=lambda m: m["started"],
    )

    def seconds(a, b) -> float:
        return (pd.Timestamp(b) - pd.Timestamp(a)).total_seconds()

    fixed, runs = [], []
    for this, after in itertools.pairwise(sessions):
        measured = [seconds(r["started"], r["ended"]) for r in this["runs"] if r.get("ended")]
        runs += measured
        outside = seconds(this["started"], this["ended"]) - sum(measured)
        fixed.append(outside + seconds(this["ended"], after["started"]))
    return float(np.median(fixed)), 2 * float(np.median(runs))


def allocation(s_w: float, s_b: float, c_s: float, c_p: float, half_width_pct: float):
    """(pairs per session, sessions, device seconds) for the target half-width."""
    h = math.log1p(half_width_pct / 100)
    n = max(1, round(math.sqrt(c_s * s_w**2 / (c_p * s_b**2)))) if s_b > 0 else MAX_PAIRS
    n = min(n, MAX_PAIRS)
    var = s_b**2 + s_w**2 / n
    for m in range(2, MAX_SESSIONS + 1):
        if sps.t.ppf(0.975, m - 1) * math.sqrt(var / m) <= h:
            return n, m, m * (c_s + n * c_p)
    return n, math.inf, math.inf


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw_dir", nargs="?", type=Path)
    ap.add_argument("--target-half-width", type=float, default=2.0, metavar="PCT")
    ap.add_argument("--metric", default="bw_bytes")
    ap.add_argument("--workdir", type=Path, help="measure here (kept) instead of a temp folder")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="luksbench-sessions-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        raw = args.raw_dir or measure(work)
        fio = ingest.fio_table(raw)
        host_dir = next(p for p in raw.iterdir() if p.is_dir() and (p / "fio").is_dir())
        c_s, c_p = costs(host_dir)
    loss = stats.loss_table(fio, metrics=[args.metric])
    k, n_run = int(loss["sessions"].max()), int(loss["n"].max() // max(1, loss["sessions"].max()))
    print(f"run {raw}: {k} sessions x {n_run} pairs per cell; measured costs: session (stack-up,")
    print(f"preconditioning, teardown) {c_s:.1f} s, pair {c_p:.1f} s; target half-width")
    print(f"+-{args.target_half_width:g} % on {args.metric}, 95 %\n")
    head = f"{'cell':<22}{'s_within':>9}{'s_between':>10}{'half now':>9}"
    print(head + f"{'n*/session':>11}{'sessions':>9}{'device s':>10}{'run used s':>11}")
    for _, r in loss.iterrows():
        n, m, cost = allocation(
            r["sd_within_session"], r["sd_between_sessions"], c_s, c_p, args.target_half_width
        )
        half = (r["ci_high"] - r["ci_low"]) / 2
        used = k * (c_s + n_run * c_p)
        print(
            f"{r['workload']:<22}{r['sd_within_session']:>9.4f}{r['sd_between_sessions']:>10.4f}"
            f"{half:>8.1f}%{n:>11}{m if m < math.inf else '>200':>9}{cost:>10.0f}{used:>11.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
