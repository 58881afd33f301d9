"""Harness overhead: how much of a benchmark session's wall time is not fio measuring?

    python benchmarks/harness_overhead.py [RAW_HOST_DIR ...]     # default: data/raw/sample/vm

From what a run already recorded, nothing is run: every session record of the host
(``fio/sessions/*.json``, else ``fio/manifest.json``) gives the session's wall time (started ..
ended) and each fio run's start and end; each fio JSON gives the job's measured runtime (fio's
``runtime``, which excludes ``ramp_time``). Printed per host:

* OVERHEAD  = (wall - sum of fio runtime) / wall   -- the issue's definition; goal < 5 %;
* of it, RAMP = sum of the planned ramp_time / wall: fio running, but not measuring (configured);
* HARNESS   = (wall - sum(runtime + ramp)) / wall: what luksbench itself adds (fio start-up and
  file layout, the /proc/stat samples, writing results, the idle CPU baseline, between runs);
* PROJECTED overhead for longer runs with the same per-run cost (ramp and harness seconds per run
  held fixed, runtime varied): a projection from the measured per-run cost, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
GOAL_PCT = 5.0


def fio_runtime_s(path: Path) -> float:
    """fio's measured runtime of a result: the longest job's, in seconds (ramp excluded)."""
    from luksbench.fio import parse_fio_file

    rows = parse_fio_file(path, warn=lambda _m: None)
    runtimes = [r.get("runtime_ms") for r in rows if r.get("runtime_ms")]
    if not runtimes:  # a direction-less job: fio's job_runtime
        doc = json.loads(path.read_text()[path.read_text().index("{") :])
        runtimes = [j.get("job_runtime", 0) for j in doc.get("jobs", [])]
    return max(runtimes) / 1000


def host_overhead(host_dir: Path) -> dict:
    from luksbench import ingest

    host_dir = Path(host_dir)
    sessions = ingest.session_records(host_dir)
    if not sessions:
        sys.exit(f"{host_dir}: no fio/manifest.json or fio/sessions/*.json")
    wall = fio = ramp = process = 0.0
    runs = 0
    for path, _name in sessions:
        manifest = json.loads(path.read_text())
        start, end = pd.Timestamp(manifest["started"]), pd.Timestamp(manifest["ended"])
        wall += (end - start).total_seconds()
        ramp_s = float((manifest.get("fio") or {}).get("ramp_time_s") or 0)
        for run in manifest.get("runs") or []:
            if run.get("skipped_existing") or run.get("status") != "ok":
                continue
            fio += fio_runtime_s(host_dir / run["path"])
            ramp += ramp_s
            process += (pd.Timestamp(run["ended"]) - pd.Timestamp(run["started"])).total_seconds()
            runs += 1
    plan = (json.loads(sessions[-1][0].read_text()).get("fio")) or {}
    return {
        "host": host_dir.name,
        "run": host_dir.parent.name,
        "sessions": len(sessions),
        "runs": runs,
        "wall_s": wall,
        "fio_s": fio,
        "ramp_s": ramp,
        "process_s": process,
        "runtime_planned_s": plan.get("runtime_s"),
        "ramp_planned_s": plan.get("ramp_time_s"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "host_dirs", nargs="*", type=Path, default=[REPO / "data" / "raw" / "sample" / "vm"]
    )
    args = parser.parse_args(argv)
    for host_dir in args.host_dirs:
        r = host_overhead(host_dir)
        wall, fio, ramp, runs = r["wall_s"], r["fio_s"], r["ramp_s"], r["runs"]
        overhead = 100 * (wall - fio) / wall
        harness = wall - fio - ramp
        print(
            f"{r['run']}/{r['host']}: {r['sessions']} session(s), {runs} fio runs of "
            f"{r['runtime_planned_s']} s + {r['ramp_planned_s']} s ramp (planned)"
        )
        print(f"  wall time                {wall:9.1f} s")
        print(f"  sum of fio runtime       {fio:9.1f} s  (measured, ramp excluded)")
        print(
            f"  OVERHEAD                 {overhead:9.1f} %  (wall - fio runtime) / wall; goal < "
            f"{GOAL_PCT:.0f} %: " + ("met" if overhead < GOAL_PCT else "NOT met")
        )
        print(f"    of it RAMP             {100 * ramp / wall:9.1f} %  ({ramp:.0f} s of ramp_time)")
        print(
            f"    of it HARNESS          {100 * harness / wall:9.1f} %  ({harness:.1f} s, "
            f"{harness / runs:.2f} s per fio run)"
        )
        outside = wall - r["process_s"]
        print(
            f"      fio processes beyond runtime + ramp: {r['process_s'] - fio - ramp:.1f} s; "
            f"between fio runs: {outside:.1f} s"
        )
        per_run = (wall - fio) / runs  # ramp + harness seconds per run, held fixed below
        harness_per_run = harness / runs
        for runtime in (10, 60, 300):
            proj = 100 * per_run / (per_run + runtime)
            no_ramp = 100 * harness_per_run / (harness_per_run + runtime)
            print(
                f"  PROJECTED at {runtime:3d} s runtime: {proj:5.1f} % overhead "
                f"({no_ramp:4.1f} % without the ramp)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
