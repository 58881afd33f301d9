"""The workflow as the tests run it: a copy to run in, snakemake on a small run, and what a run
leaves behind (raw files, mounts, processes)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from testkit.paths import BIN, REPO

# What a workflow run needs besides raw data (the tests run copies, never the repo's own data).
# (profiles/default: the workflow's own defaults, e.g. resuming an interrupted run)
WORKFLOW_FILES = ("Snakefile", "workflow", "config", "envs", "notebooks", "src", "data/reference")
WORKFLOW_FILES += ("profiles/default", "report")


def copy_workflow(dest: Path, extra: tuple[str, ...] = ()) -> Path:
    """A copy of the workflow (plus ``extra`` repo paths, e.g. data/raw/sample) to run in."""
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    for name in (*WORKFLOW_FILES, *extra):
        source = REPO / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(source, dest / name, ignore=ignore, dirs_exist_ok=True)
        else:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


SMALL_RUN = """\
run: e2e
device_size_mib: 64
matrix:
  rw: [randread, write]
  bs: [4k]
  iodepth: [4]
fio:
  runtime_s: 1
  ramp_time_s: 0
repetitions: 3
"""


def snakemake(
    workdir: Path, *args: str, env: dict | None = None, configfiles=("small.yaml",)
) -> subprocess.CompletedProcess:
    return subprocess.run(
        # --configfile takes several values: it goes last.
        [str(BIN / "snakemake"), "--cores", "1", *args, "--configfile", *configfiles],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


def failure_report(result: subprocess.CompletedProcess, workdir: Path, tail: int = 3000) -> str:
    """What a failed snakemake printed, and the end of each failed rule's log (a notebook's
    traceback is there, and the test's folder is gone by the time anyone looks)."""
    report = [result.stderr[-tail:]]
    for line in result.stderr.splitlines():
        if "(check log file(s) for error details)" in line:
            for name in line.split("log:", 1)[1].split("(check")[0].split(","):
                log = workdir / name.strip()
                text = log.read_text(errors="replace")[-tail:] if log.is_file() else "(no log)"
                report.append(f"--- {name.strip()} ---\n{text}")
    return "\n".join(report)


def rep_files(workdir: Path, run: str = "e2e") -> dict[Path, tuple[float, bytes]]:
    return {
        p: (p.stat().st_mtime, p.read_bytes())
        for p in sorted((workdir / "data" / "raw" / run).glob("*/fio/*/*/rep*.json"))
        if not p.name.endswith(".cpu.json")
    }


def our_mounts(workdir: Path) -> list[str]:
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line for line in mounts if str(workdir) in line]


def our_processes(workdir: Path) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(workdir) in cmdline and "pytest" not in cmdline:
            found.append(cmdline)
    return found


def processes_of(work: Path) -> list[int]:
    """Processes working in ``work`` (snakemake, its steps) or naming it on their command line
    (storage and Ceph daemons, fio); never this test process."""
    from luksbench.testbox.sysutil import cmdline

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if os.path.realpath(f"/proc/{entry}/cwd") == str(work):
                found.append(int(entry))
                continue
        if str(work) in "\0".join(cmdline(int(entry))):
            found.append(int(entry))
    return found


def raw_results(work: Path, run: str) -> dict[Path, bytes]:
    """The run's finished fio results under ``work`` (not their CPU sidecars): path -> bytes."""
    found = {}
    with contextlib.suppress(FileNotFoundError):  # not yet there, or a folder removed meanwhile
        for p in (work / "data" / "raw" / run).glob("*/fio/*/*/rep*.json"):
            if not p.name.endswith(".cpu.json"):
                found[p] = p.read_bytes()
    return found


def snakemake_cli(
    *args: str, cwd: Path = REPO, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``snakemake --cores 1 ARGS`` in ``cwd`` (the repository or a workflow copy)."""
    return subprocess.run(
        [str(BIN / "snakemake"), "--cores", "1", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run as {rule: count}."""
    counts: dict[str, int] = {}
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Job stats"))
    for line in lines[start + 3 :]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def no_step_outlives_its_workflow(work: Path, timeout: float = 90) -> None:
    """Within ``timeout`` seconds of the workflow's end no test-box step of ``work`` is left."""
    import time

    from luksbench.testbox.sysutil import cmdline

    def steps() -> dict[int, list[str]]:
        return {p: cmdline(p) for p in processes_of(work) if "testbox" in cmdline(p)}

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and steps():
        time.sleep(0.2)
    left = steps()
    assert not left, f"test-box steps outlived the workflow: {left}"
