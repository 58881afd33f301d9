"""Ingest throughput: how many fio result files per second does the analysis parse?

    python benchmarks/ingest_speed.py [-n 10000] [-n 100000] [--workers 2] [--templates single|all|jsonplus]
                                      [--chunk-files K] [--keep DIR]

Builds a raw run folder of N fio JSON files in a temporary directory, every file a byte-for-byte
copy of a REAL fio output from /work/shared/datasets/external (``../shared/datasets/external``
beside the repository) placed in the raw layout under the workload folder its job ran (so ingest
accepts it), with a real CPU sidecar from the shipped sample beside each. Two hosts, two stacks,
repetitions numbered up to N. Then times, on a cold cache:

* FULL         ``write_processed`` of the whole folder (parse N files + sidecars, write every
               table as parquet and CSV, and the column dictionary);
* NO CHANGE    the same again: the incremental cache finds every file unchanged;
* +1 % FILES   N/100 new result files added, ingested incrementally.

``--templates jsonplus`` uses real fio json+ outputs (completion-latency histograms): the fixture
``tests/fixtures/fio-3.33_jsonplus_*.json`` and the sample's own results (read, never edited), for
the memory figure at fleet scale (ingest streams the histograms in chunks of ``--chunk-files``).
``--templates single`` (default) uses the external outputs shaped like luksbench's own results (one
job per file: fio 2.18 to 3.40); ``all`` adds the multi-job files (10 to 22 jobs per file). Goal:
>= 8,000 files/s on 2 cores for FULL. The CPU seconds (this process and its workers) are printed
beside the wall time: on a shared machine they say what the wall time would be on an idle one.
Peak resident memory of the main process and of the largest worker (getrusage) is printed after
FULL: goal under 4 GiB at 200,000 json+ results. Nothing is written outside the temporary folder
(or --keep).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXTERNAL = REPO.parent / "shared" / "datasets" / "external"
SAMPLE_HOST = REPO / "data" / "raw" / "sample" / "vm"
FIXTURES = REPO / "tests" / "fixtures"
GOAL_FILES_PER_S = 8000
GOAL_PEAK_GIB = 4


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import pandas as pd
    import pyarrow

    return (
        f"{cpu}, {len(os.sched_getaffinity(0))} CPUs available, Python {platform.python_version()},"
        f" pandas {pd.__version__}, pyarrow {pyarrow.__version__}"
    )


def templates(kind: str) -> list[tuple[Path, str]]:
    """(external fio output, workload id of its layout folder) for every file ingest accepts."""
    from luksbench.formats.fio import FioParseError, parse_fio_file
    from luksbench.formats.layout import Workload

    out = []
    sources = sorted(p for p in EXTERNAL.rglob("*") if p.is_file())
    if kind == "jsonplus":  # real json+ outputs: the fixture and the sample's own results
        sources = sorted(FIXTURES.glob("*jsonplus*.json"))
        sources += sorted((SAMPLE_HOST / "fio").glob("*/*/rep*[0-9].json"))
    for path in sources:
        if path.suffix in (".md", ".csv") or "cryptsetup" in path.name:
            continue
        try:
            rows = parse_fio_file(path, warn=lambda _m: None)
        except (FioParseError, ValueError):
            continue
        if any(r.get("error") not in (0, None) or not r.get("io_bytes") for r in rows):
            continue
        first = next((r for r in rows if r.get("rw") and r.get("bs_bytes")), None)
        if first is None or first.get("iodepth") is None:
            continue
        if kind != "all" and len({r.get("job") for r in rows}) > 1:
            continue
        wl = Workload(str(first["rw"]), int(first["bs_bytes"]), int(first["iodepth"]))
        out.append((path, wl.id))
    if not out:
        sys.exit(f"no usable fio outputs under {EXTERNAL}")
    return out


def build_raw(raw: Path, n: int, tmpl: list[tuple[Path, str]], start: int = 0) -> int:
    """Files start .. start+n-1 of the synthetic run (deterministic placement); returns bytes."""
    sidecar = (SAMPLE_HOST / "fio" / "plain" / "read-4k-qd1" / "rep1.cpu.json").read_bytes()
    hosts, stacks = ("box1", "box2"), ("plain", "luks")
    if start == 0:
        for host in hosts:
            (raw / host / "fio").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(SAMPLE_HOST / "env.json", raw / host / "env.json")
            shutil.copyfile(
                SAMPLE_HOST / "fio" / "manifest.json", raw / host / "fio" / "manifest.json"
            )
            manifest = json.loads((raw / host / "fio" / "manifest.json").read_text())
            (raw / host / "fio" / "manifest.json").write_text(json.dumps({**manifest, "runs": []}))
    runs: dict[str, list[dict]] = {host: [] for host in hosts}
    size = 0
    per = len(tmpl) * len(hosts) * len(stacks)
    for i in range(start, start + n):
        src, workload = tmpl[i % len(tmpl)]
        host = hosts[(i // len(tmpl)) % len(hosts)]
        stack = stacks[(i // (len(tmpl) * len(hosts))) % len(stacks)]
        # every template index gets its own rep numbers, so templates sharing a workload never
        # collide: rep = (i // per) * len(tmpl) + template index + 1
        rep = (i // per) * len(tmpl) + (i % len(tmpl)) + 1
        folder = raw / host / "fio" / stack / workload
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, folder / f"rep{rep}.json")
        (folder / f"rep{rep}.cpu.json").write_bytes(sidecar)
        size += src.stat().st_size
        path = f"fio/{stack}/{workload}/rep{rep}.json"
        runs[host].append({"rep": rep, "stack": stack, "workload": workload, "path": path})
        runs[host][-1] |= {"cpu_path": path.replace(".json", ".cpu.json"), "status": "ok"}
    # ingest counts the results a manifest records, as the runner records them
    for host in hosts:
        path = raw / host / "fio" / "manifest.json"
        manifest = json.loads(path.read_text())
        path.write_text(json.dumps({**manifest, "runs": manifest["runs"] + runs[host]}))
    return size


def cpu_s() -> tuple[float, float]:
    """CPU seconds of this process and of its finished children (the ingest workers)."""
    import resource

    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def peak_rss_gib() -> tuple[float, float]:
    """Peak resident memory (GiB) of this process and of its largest finished child (a worker):
    getrusage's maxrss, in KiB on Linux. Peaks are since the process started: run one N per
    invocation for a clean figure."""
    import resource

    own, children = (
        resource.getrusage(who).ru_maxrss
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own / 2**20, children / 2**20


def timed(func):
    """(seconds, result); what ingest prints per file (notes on the real multi-document
    templates) is counted, not shown."""
    import contextlib
    import io

    buffer = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(buffer):
        result = func()
    return time.perf_counter() - t0, result


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def bench(
    n: int, workers: int, kind: str, keep: Path | None, chunk_files: int | None = None
) -> None:
    from luksbench.analysis import ingest

    tmpl = templates(kind)
    base = Path(tempfile.mkdtemp(prefix="luksbench-ingest-", dir=keep))
    try:
        raw, processed = base / "raw" / "synthetic", base / "processed" / "synthetic"
        build_s, size = timed(lambda: build_raw(raw, n, tmpl))
        print(
            f"N = {n:,} fio JSON files ({size / 2**20:,.0f} MiB, + {n:,} CPU sidecars) from "
            f"{len(tmpl)} real templates ({kind}); built in {build_s:.1f} s"
        )
        os.sync()
        print(f"  load average before: {load()}")
        cpu0 = cpu_s()
        full_s, out = timed(
            lambda: ingest.write_processed(raw, processed, workers=workers, chunk_files=chunk_files)
        )
        main_cpu, workers_cpu = (
            after - before for after, before in zip(cpu_s(), cpu0, strict=True)
        )
        import pyarrow.parquet as pq

        main_gib, worker_gib = peak_rss_gib()
        rows, bins = (pq.ParquetFile(out[t]).metadata.num_rows for t in ("fio", "latency"))
        print(
            f"  FULL        {full_s:8.2f} s  {n / full_s:9,.0f} files/s  ({rows:,} rows, {bins:,} "
            f"latency rows, "
            f"{workers} workers, {main_cpu + workers_cpu:.2f} CPU s: main process "
            f"{main_cpu:.2f}, workers {workers_cpu:.2f})  goal >= {GOAL_FILES_PER_S:,} files/s: "
            + ("met" if n / full_s >= GOAL_FILES_PER_S else "NOT met")
        )
        print(
            f"  PEAK MEMORY main process {main_gib:.2f} GiB, largest worker {worker_gib:.2f} GiB "
            f"(getrusage ru_maxrss: resident; goal under {GOAL_PEAK_GIB} GiB at 200,000 json+ "
            "results)"
        )
        same_s, _ = timed(
            lambda: ingest.write_processed(raw, processed, workers=workers, chunk_files=chunk_files)
        )
        print(f"  NO CHANGE   {same_s:8.2f} s  (all {n:,} files found unchanged in the cache)")
        extra = max(1, n // 100)
        build_raw(raw, extra, tmpl, start=n)
        more_s, _ = timed(
            lambda: ingest.write_processed(raw, processed, workers=workers, chunk_files=chunk_files)
        )
        print(f"  +1 % FILES  {more_s:8.2f} s  ({extra:,} new files parsed, {n:,} reused)")
        main_gib, worker_gib = peak_rss_gib()
        print(
            f"  PEAK MEMORY over all three: main process {main_gib:.2f} GiB, largest worker "
            f"{worker_gib:.2f} GiB"
        )
        print(f"  load average after: {load()}")
    finally:
        if keep is None:
            shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, action="append", help="files (repeatable; default 10000)")
    parser.add_argument("--workers", type=int, default=None, help="default: CPUs available")
    parser.add_argument("--templates", choices=("single", "all", "jsonplus"), default="single")
    parser.add_argument(
        "--chunk-files", type=int, help="files per ingest chunk (default: ingest's)"
    )
    parser.add_argument("--keep", type=Path, help="build under this folder and keep it")
    args = parser.parse_args(argv)
    from luksbench.analysis.ingest import default_workers

    workers = args.workers or default_workers()
    print(f"machine: {machine()}")
    for n in args.n or [10_000]:
        bench(n, workers, args.templates, args.keep, args.chunk_files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
