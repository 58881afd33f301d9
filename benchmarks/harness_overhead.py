"""Harness overhead: how much of a benchmark session's wall time is not fio measuring?

    python benchmarks/harness_overhead.py [RAW_HOST_DIR ...] [--project RUNTIME:RAMP ...]

RAW_HOST_DIR defaults to every host of the default run (data/raw/default/*: run
``snakemake --cores 1 all`` first), else the shipped sample (data/raw/sample/vm, measured with the
default config of its time: 2 s runs + 1 s ramp).

From what a run already recorded, nothing is run: every session record of the host
(``fio/sessions/*.json``, else ``fio/manifest.json``) gives the session's wall time (started ..
ended) and each fio run's start and end; each fio JSON gives the job's measured runtime (fio's
``runtime``, which excludes ``ramp_time``). Printed per host:

* OVERHEAD  = (wall - sum of fio runtime) / wall   -- the issue's definition; goal < 5 %;
* of it, RAMP = sum of the planned ramp_time / wall: fio running, but not measuring (configured);
* HARNESS   = (wall - sum(runtime + ramp)) / wall: what is neither measuring nor ramp, split by
  where it goes: FIO START/EXIT (each fio process's lifetime, the CPU sidecar's ``interval_s``,
  beyond runtime + ramp: fio's own start-up, clock calibration, job start and exit), LUKSBENCH PER
  RUN (each run's record, started .. ended, beyond its fio process: temp file, /proc/stat and RAPL
  samples, parsing, fsync and rename of the result and its sidecar) and PER SESSION (the wall time
  outside the runs: the idle CPU baseline, checks, the manifest);
* PROJECTED overhead for other runtime/ramp choices (``--project RUNTIME:RAMP``, seconds; default
  a few): the same runs with the measured per-run and per-session costs held fixed. A projection
  from the measured costs, not a measurement.
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
    from luksbench.formats.fio import parse_fio_file

    rows = parse_fio_file(path, warn=lambda _m: None)
    runtimes = [r.get("runtime_ms") for r in rows if r.get("runtime_ms")]
    if not runtimes:  # a direction-less job: fio's job_runtime
        doc = json.loads(path.read_text()[path.read_text().index("{") :])
        runtimes = [j.get("job_runtime", 0) for j in doc.get("jobs", [])]
    return max(runtimes) / 1000


def _sidecar(rep_path: str) -> str:
    return rep_path[: -len(".json")] + ".cpu.json"


def fio_process_s(path: Path) -> float:
    """The fio process's lifetime (start to exit) from the run's CPU sidecar, in seconds."""
    return float(json.loads(path.read_text())["interval_s"])


def overhead_pct(costs: dict, runtime_s: float, ramp_s: float) -> float:
    """(wall - fio runtime) / wall in %, for the same runs with another runtime and ramp: the
    measured per-run and per-session costs held fixed."""
    runs = costs["runs"]
    fixed = runs * (costs["per_run_s"] + ramp_s) + costs["session_s"]
    return 100 * fixed / (fixed + runs * runtime_s)


def host_overhead(host_dir: Path) -> dict:
    from luksbench.analysis import ingest

    host_dir = Path(host_dir)
    sessions = ingest.session_records(host_dir)
    if not sessions:
        sys.exit(f"{host_dir}: no fio/manifest.json or fio/sessions/*.json")
    wall = fio = ramp = process = fio_process = 0.0
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
            fio_process += fio_process_s(host_dir / run.get("cpu_path", _sidecar(run["path"])))
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
        "fio_process_s": fio_process,
        "runtime_planned_s": plan.get("runtime_s"),
        "ramp_planned_s": plan.get("ramp_time_s"),
    }


def _projection(text: str) -> tuple[float, float]:
    try:
        runtime, ramp = (float(v) for v in text.split(":"))
    except ValueError:
        msg = f"{text!r}: expected RUNTIME:RAMP in seconds, e.g. 5:0"
        raise argparse.ArgumentTypeError(msg) from None
    return runtime, ramp


def default_host_dirs() -> list[Path]:
    """The default run's hosts when it has been measured here, else the shipped sample's."""
    default_run = sorted(d for d in (REPO / "data" / "raw" / "default").glob("*") if d.is_dir())
    return default_run or [REPO / "data" / "raw" / "sample" / "vm"]


DEFAULT_PROJECTIONS = [(2, 1), (2, 0), (5, 0), (5, 1), (10, 0), (10, 1), (30, 1), (60, 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host_dirs", nargs="*", type=Path, default=default_host_dirs())
    parser.add_argument(
        "--project",
        action="append",
        type=_projection,
        metavar="RUNTIME:RAMP",
        help="project the overhead for this runtime and ramp in seconds (repeatable)",
    )
    args = parser.parse_args(argv)
    for host_dir in args.host_dirs:
        r = host_overhead(host_dir)
        wall, fio, ramp, runs = r["wall_s"], r["fio_s"], r["ramp_s"], r["runs"]
        overhead = 100 * (wall - fio) / wall
        harness = wall - fio - ramp
        fio_extra = r["fio_process_s"] - fio - ramp  # fio's own start-up and exit
        per_run = r["process_s"] - r["fio_process_s"]  # luksbench around each fio process
        session = wall - r["process_s"]  # idle baseline, checks, manifest
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
            f"{harness / runs:.3f} s per fio run)"
        )
        for what, seconds, unit in (
            ("FIO START/EXIT", fio_extra, f"{1000 * fio_extra / runs:.0f} ms per fio process"),
            ("LUKSBENCH PER RUN", per_run, f"{1000 * per_run / runs:.1f} ms per fio run"),
            ("PER SESSION", session, f"{session / r['sessions']:.2f} s per session"),
        ):
            print(f"      {what:18} {100 * seconds / wall:9.2f} %  ({seconds:.1f} s, {unit})")
        costs = {"runs": runs, "per_run_s": (fio_extra + per_run) / runs, "session_s": session}
        for runtime, ramp_s in args.project or DEFAULT_PROJECTIONS:
            print(
                f"  PROJECTED at {runtime:g} s runtime + {ramp_s:g} s ramp: "
                f"{overhead_pct(costs, runtime, ramp_s):5.1f} % overhead"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
