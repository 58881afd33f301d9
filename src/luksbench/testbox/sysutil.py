"""Helpers every test-box module shares: errors, progress, timestamps, atomic writes, running
tools, looking at processes, reading sysfs. Imports only :mod:`stopping` of luksbench (helper
threads that never take a stop signal). Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from luksbench.testbox.stopping import background_thread


class TestboxError(RuntimeError):
    """A test-box step failed; the message says which and why."""

    __test__ = False  # not a pytest test class


# Every tool runs with its output captured as text, no terminal, its status checked by the caller.
QUIET = {"capture_output": True, "text": True, "check": False, "stdin": subprocess.DEVNULL}


def tool_env() -> dict[str, str]:
    """This process' environment in the C locale, for every tool whose output is parsed: English
    messages and decimal points whatever the operator's locale (a German `cryptsetup benchmark`
    prints "Iterationen pro Sekunde" and decimal commas). LANGUAGE goes too: gettext reads it
    before LC_ALL in any locale but C."""
    env = {key: value for key, value in os.environ.items() if key != "LANGUAGE"}
    env["LC_ALL"] = "C"
    return env


def use_c_locale() -> None:
    """Every child of this process (fio, cryptsetup, lsblk, ...) runs in the C locale."""
    os.environ.pop("LANGUAGE", None)
    os.environ["LC_ALL"] = "C"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def duration(seconds: float) -> str:
    """A span as people read it: 42s, 3m05s, 2h07m."""
    s = round(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_seconds(remaining: int, step_s: float | None, timed: int, timed_s: float) -> float | None:
    """Time left for ``remaining`` steps of nominally ``step_s`` seconds, or as long as the
    ``timed`` steps took on average (``timed_s`` in all) when longer; None without either."""
    if timed == 0 and step_s is None:
        return None
    per_step = max(step_s or 0.0, timed_s / timed if timed else 0.0)
    return remaining * per_step


class Progress:
    """Elapsed time and ETA of ``total`` steps of about ``step_s`` seconds each."""

    def __init__(self, total: int, step_s: float | None = None):
        self.total, self.step_s, self.t0 = total, step_s, time.monotonic()
        self.done, self.timed, self.timed_s = 0, 0, 0.0

    def step(self, seconds: float | None) -> str:
        """Count a step that took ``seconds`` (None: skipped, took no time); where things stand."""
        self.done += 1
        if seconds is not None:
            self.timed, self.timed_s = self.timed + 1, self.timed_s + seconds
        eta = eta_seconds(self.total - self.done, self.step_s, self.timed, self.timed_s)
        left = f", ETA {duration(eta)}" if eta is not None else ""
        return f"elapsed {duration(time.monotonic() - self.t0)}{left}"


@contextlib.contextmanager
def heartbeat(what: str, every: float, say=log):
    """``say`` ``what`` with the time elapsed every ``every`` seconds while the block runs."""
    t0, stop = time.monotonic(), threading.Event()

    def beat():
        while not stop.wait(every):
            say(f"  {what}: elapsed {duration(time.monotonic() - t0)}")

    thread = None
    try:  # a stop signal let in as the thread starts still stops it
        thread = background_thread(beat, "luksbench-heartbeat")
        yield
    finally:
        stop.set()
        if thread is not None:
            thread.join()


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write to a temp file in the same directory, fsync, chmod, rename into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj, mode: int = 0o644) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n", mode)


def private_dir(parent: str | Path, prefix: str) -> Path:
    """A new 0700 directory under ``parent`` (for key files, sockets, pid files)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o700)
    return path


def read_text(path: str | Path) -> str | None:
    """A small kernel or sysfs file, stripped; None when it cannot be read."""
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def whole_disk(sysdir: Path) -> Path:
    """The sysfs directory of a partition's disk; a disk's own otherwise (queue/ sits on it)."""
    return sysdir.parent if (sysdir / "partition").is_file() else sysdir


def run_quiet(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess | None:
    """Run a read-only probe; None when the tool is missing or hangs."""
    tool = which(argv[0])
    if tool is None:
        return None
    try:
        return subprocess.run([tool, *argv[1:]], timeout=timeout, env=tool_env(), **QUIET)
    except (OSError, subprocess.TimeoutExpired):
        return None


def run_tool(
    argv: list[str], what: str, timeout: float = 120, pass_fds: tuple[int, ...] = ()
) -> subprocess.CompletedProcess:
    """Run a tool (``pass_fds``: open files it gets, named /dev/fd/<n> in argv); raise
    TestboxError with its stderr on failure. Never logs key material: keys only ever travel in
    files, so argv is safe to print."""
    try:
        proc = subprocess.run(argv, timeout=timeout, env=tool_env(), pass_fds=pass_fds, **QUIET)
    except FileNotFoundError as exc:
        raise TestboxError(f"{what}: {argv[0]} not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise TestboxError(f"{what}: `{' '.join(argv)}` timed out after {timeout} s") from exc
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip()
        raise TestboxError(f"{what}: `{' '.join(argv)}` exited {proc.returncode}: {said}")
    return proc


def which(tool: str) -> str | None:
    return shutil.which(tool) or next(
        (p for d in ("/usr/sbin", "/sbin") if os.access(p := f"{d}/{tool}", os.X_OK)), None
    )


def pid_alive(pid: int | None) -> bool:
    """The process exists and is not a zombie (its state in /proc/<pid>/stat is not Z or X)."""
    stat = read_text(f"/proc/{pid}/stat") if pid is not None else None
    return stat is not None and stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        stat = read_text(f"/proc/{entry}/stat") if entry.isdigit() else None
        if stat:
            children.setdefault(int(stat.rpartition(")")[2].split()[1]), []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children.get(child, [])
    return found


def ancestors(pid: int) -> list[int]:
    """The processes ``pid`` runs under: its parent, the parent's parent, ... up to init."""
    found = []
    while pid > 1:
        stat = read_text(f"/proc/{pid}/stat")
        if not stat:
            break
        pid = int(stat.rpartition(")")[2].split()[1])
        found.append(pid)
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def find_our_processes(
    markers: list[str], names=("qemu-storage-daemon", "fio"), exact: bool = False
) -> list[int]:
    """PIDs of ``names`` processes whose command line mentions one of ``markers`` (with
    ``exact``: as a whole argument), e.g. daemons whose pid never reached STATE."""
    found = []
    markers = [m for m in markers if m]
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        argv = cmdline(int(entry))
        if not argv or os.path.basename(argv[0]) not in names:
            continue
        joined = "\0".join(argv)
        hit = any(m in argv for m in markers) if exact else any(m in joined for m in markers)
        if hit and pid_alive(int(entry)):
            found.append(int(entry))
    return sorted(found)


def runs_with(pid: int | None, markers: list[str | None]) -> bool:
    """Whether ``pid`` is alive and its command line mentions one of ``markers``."""
    return pid_alive(pid) and any(m and m in "\0".join(cmdline(pid)) for m in markers)


def stop_process(pid: int, signals: tuple[signal.Signals, ...]) -> str | None:
    """Send each signal in turn, 5 s apart, until ``pid`` is gone; the one that ended it."""
    for sig in signals:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        if wait_gone(pid, 5):
            return sig.name
    return None


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


# Room a fio run needs: its json+ result and CPU sidecar (~10-60 KiB), and the manifest.
MIN_FREE_BYTES = 4 * 1024 * 1024


def check_free_space(directory: Path, min_free: int = MIN_FREE_BYTES) -> None:
    """Stop before a run whose result could not be stored (a full disk truncates fio's JSON)."""
    directory.mkdir(parents=True, exist_ok=True)
    fs = os.statvfs(directory)
    free = fs.f_bavail * fs.f_frsize
    if free < min_free:
        raise TestboxError(
            f"no space left for raw results in {directory}: {free // 1024} KiB free, "
            f"{min_free // 1024} KiB needed per fio run; finished repetitions are kept, "
            "free some space and run again to measure the rest"
        )
