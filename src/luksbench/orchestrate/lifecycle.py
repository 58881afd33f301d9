"""The workflow's lifecycle around the test box: what the Snakefile's hooks and common.smk call.

- parse time (``before_dag``): a killed run's stacks torn down and Snakemake's stale directory
  lock removed, so the same command resumes; never for an invocation that only looks.
- ``onstart``: Ctrl-C or ``kill`` of snakemake alone reaches the jobs' processes.
- ``onsuccess``: the test box is released (unless stacks are still up).
- ``onerror``: a failed rule leaves no dm/loop devices, FUSE mounts or daemons behind, and once
  the stacks are down nothing else this invocation started runs on.

Every test-box step this invocation runs belongs to its session (``start_session``): the test box
stays locked for the run from the environment capture to the end (testbox/lock.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from luksbench.testbox import lock, orphans
from luksbench.testbox.sysutil import descendants

# Invocations that only look (or unlock): they must not tear anything down. Snakemake parses the
# workflow before it knows which of these it will run, and no workflow setting says so.
LOOKING = {"-n", "--dry-run", "--dryrun", "--unlock", "--report", "--lint", "--list", "-l"}
LOOKING |= {"--summary", "-S", "--detailed-summary", "-D", "--dag", "--rulegraph", "--filegraph"}
LOOKING |= {"--cleanup-metadata", "--list-target-rules", "--list-changes", "--lc", "--li", "--lp"}
DRY_RUN_FLAGS = {"-n", "--dry-run", "--dryrun"}


class RecoveryError(RuntimeError):
    """The stacks a killed run left up could not all be torn down."""


def start_session() -> None:
    """This snakemake process is the session of every test-box step it starts (inherited)."""
    os.environ.setdefault(lock.SESSION_ENV, str(os.getpid()))


def is_dry_run(output_settings, argv: list[str]) -> bool:
    """Whether this invocation is a dry run, while the Snakefile is parsed. Snakemake 9 (and the
    later 8.x with logger plugins) carry it in ``workflow.output_settings.dryrun``; older 8.x
    decide it only once the workflow runs (``workflow.dryrun`` is False while parsing), so there
    the command line is read."""
    dryrun = getattr(output_settings, "dryrun", None)
    if isinstance(dryrun, bool):
        return dryrun
    return bool(DRY_RUN_FLAGS.intersection(argv[1:]))


def only_looks(output_settings, argv: list[str], main_process: bool = True) -> bool:
    """Whether this invocation only looks (dry run, lint, report, summary, unlock, ...) or is a
    job's own snakemake, not the one that runs the workflow: then nothing is recovered."""
    if not main_process or is_dry_run(output_settings, argv):
        return True
    return bool(LOOKING.intersection(argv[1:]))


def before_dag(state: Path, workdir: str, lock_dir: Path = lock.LOCK_DIR) -> None:
    """Called while the workflow is parsed, by an invocation that runs it."""
    clear_stale_snakemake_lock(workdir)
    recover_interrupted_run(state, lock_dir)


def recover_interrupted_run(state: Path, lock_dir: Path = lock.LOCK_DIR) -> None:
    """Before the DAG is built: the stacks of this run that a killed snakemake left up (its
    orphaned test-box steps stop themselves) are torn down, and a description of stacks that are
    down is dropped, so stack_up runs again and the same command resumes."""
    record = orphans.recover(state, lock_dir)
    if record is not None and not record["ok"]:
        raise RecoveryError(
            f"the stacks a killed run left up could not all be torn down: {record['leftovers']}; "
            f"see `luksbench testbox stack-down --state {state}`"
        )
    stale = state.with_name("stacks.json")
    if not state.exists() and stale.exists():
        stale.unlink()


def clear_stale_snakemake_lock(workdir: str) -> bool:
    """A killed snakemake leaves its directory lock (.snakemake/locks), which refuses the same
    command ever after. When no snakemake runs here any more, the lock is stale: removed, as
    `snakemake --unlock` would. True when removed."""
    locks = sorted((Path(workdir) / ".snakemake/locks").glob("*.lock"))
    if not locks or orphans.snakemakes_here(workdir):
        return False
    for stale in locks:
        stale.unlink(missing_ok=True)
    print(
        "luksbench: removed the directory lock of a snakemake that is no longer running "
        "(what `snakemake --unlock` does)",
        file=sys.stderr,
    )
    return True


def on_start() -> None:
    """`onstart`: SIGINT or SIGTERM sent to the snakemake process alone (`kill PID`, a service
    manager) reaches the jobs' processes in its process group too, as Ctrl-C reaches a terminal's
    whole group, so run-fio stops its fio at once and `onerror` tears the stacks down. (fio runs
    in a session of its own: only run-fio stops it, and then keeps no partial result.)"""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _forwarding(signal.getsignal(signum)))


def _forwarding(snakemakes_own):
    def forward(signum, frame):
        for pid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(pid) == os.getpgrp():
                    os.kill(pid, signum)
        if callable(snakemakes_own):
            snakemakes_own(signum, frame)

    return forward


def on_success(state: Path, lock_dir: Path = lock.LOCK_DIR) -> bool:
    """`onsuccess`: the run's hold on the test box ends with the workflow, unless its stacks are
    still up. True when released."""
    return False if state.exists() else lock.release(state, lock_dir)


def on_error(state: Path, lock_dir: Path = lock.LOCK_DIR, grace_s: float = 30) -> bool:
    """`onerror`: tear down the stacks of this run if its state file says they are up, then
    release the test box. A step whose job shell died (kill -9, OOM, a stop signal) lives on:
    stopped first; once the stacks are down, so is anything else the workflow started (a stack
    that failed to come down keeps its daemons for the next start's recovery).
    True when the test box was released."""
    session_pid = lock.current_session()["pid"]
    orphans.stop_session_steps(session_pid, grace_s=grace_s)
    if state.exists():
        print(f"luksbench: tearing down the stacks of {state} after the failure", file=sys.stderr)
        command = ["luksbench.cli", "testbox", "stack-down", "--state", str(state)]
        subprocess.run([sys.executable, "-m", *command], check=False)
    if not state.exists():
        orphans.stop_session_leftovers(grace_s=grace_s)
    return on_success(state, lock_dir)
