"""fio against a Ceph cluster (ioengine=rbd): each run's client messenger mode set through
``CEPH_ARGS``, verified from a probe client's log rather than taken from the arm's label, the
OSDs' device encryption checked, and fio run under a hard timeout that kills its process group
(a mode the daemons refuse makes librados retry forever, ignoring SIGTERM). Standard library only.

Why a probe and not the measured run's own log: ``--debug_ms=1`` logs every message (about 25 %
fewer IOPS here), so the mode is read from a short client started with the same ``CEPH_CONF`` and
``CEPH_ARGS`` just before the measured run, against the same daemons.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import time
from pathlib import Path

from luksbench.testbox.ceph import MODES, device_facts
from luksbench.testbox.cephdown import load_cluster, start_time
from luksbench.testbox.cephexisting import client_args
from luksbench.testbox.stopping import kill_group, start_in_own_session
from luksbench.testbox.sysutil import TestboxError, read_text, tool_env

# Seconds fio gets beyond its runtime and ramp before its process group is killed.
FIO_TIMEOUT_MARGIN_S = 60
# How often the cluster's daemons are checked while fio runs.
DAEMON_WATCH_S = 0.5
PROBE_TIMEOUT_S = 30
# A connection's line once it is ready: its mode and whether it has an rx/tx cipher.
READY_LINE = re.compile(
    r"conn\(0x[0-9a-f]+ 0x[0-9a-f]+ (?P<mode>crc|secure|unknown) :-?\d+ s=READY [^)]*?"
    r"rx=(?P<rx>0x[0-9a-f]+|0) tx=(?P<tx>0x[0-9a-f]+|0)\)\.ready entity=(?P<entity>\S+)"
)


def client_env(conf: str, mode: str, extra: str = "") -> dict[str, str]:
    """The environment of a client whose connections (to monitor and OSDs) ask for ``mode``."""
    if mode not in MODES:
        raise TestboxError(f"messenger mode {mode!r} is not one of {MODES}")
    args = f"--ms_client_mode={mode} --ms_mon_client_mode={mode} {extra}".strip()
    return {**tool_env(), "CEPH_CONF": conf, "CEPH_ARGS": args}


def connection_modes(log_text: str) -> dict[str, str]:
    """entity (mon.0, osd.3) -> the mode its ready connection used, from a ``--debug_ms=1`` log;
    'secure' only when the connection has a cipher both ways, 'crc' only when it has none."""
    found: dict[str, str] = {}
    for m in READY_LINE.finditer(log_text):
        ciphers = (m["rx"] != "0", m["tx"] != "0")
        if m["mode"] == "secure" and all(ciphers):
            mode = "secure"
        elif m["mode"] == "crc" and not any(ciphers):
            mode = "crc"
        else:
            mode = f"{m['mode']} (rx={m['rx']} tx={m['tx']})"
        previous = found.setdefault(m["entity"], mode)
        if previous != mode:
            found[m["entity"]] = f"{previous} and {mode}"
    return found


def run_killable(argv: list[str], env: dict, timeout: float, **kw) -> subprocess.CompletedProcess:
    """Run ``argv`` in its own process group; past ``timeout`` the whole group gets SIGKILL and
    TestboxError says so (librados ignores SIGTERM while it retries a refused connection)."""
    proc = start_in_own_session(argv, stop=kill_group, env=env, text=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise TestboxError(
            f"`{' '.join(argv[:3])} ...` did not finish within {timeout:.0f} s (CEPH_ARGS "
            f"{env.get('CEPH_ARGS')!r}): killed its process group; a messenger mode the "
            "daemons refuse makes the client retry forever"
        ) from None
    except BaseException:
        kill_group(proc)
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def probe_mode(cluster: dict, pool: dict, mode: str, log_path: Path) -> dict:
    """Read a few blocks of ``pool``'s image with a client asking for ``mode`` and log level
    ``debug_ms=1``: which mode each connection (monitor, OSDs) used."""
    log_path.unlink(missing_ok=True)
    extra = f"{_client_args(cluster)} --debug_ms=1 --log_file={log_path}"
    env = client_env(cluster["conf"], mode, extra.strip())
    bench = ["rbd", "-p", pool["name"], "bench", "--io-type", "read", "--io-size", "4K"]
    bench += ["--io-total", "256K", "--io-pattern", "rand", "--io-threads", "1", pool["image"]]
    t0 = time.monotonic()
    proc = run_killable(
        bench, env, PROBE_TIMEOUT_S, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise TestboxError(
            f"mode probe ({mode}) exited {proc.returncode}: {said} (daemons accept "
            f"{cluster['daemon_modes']!r}; client log {log_path})"
        )
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return {
        "asked": mode,
        "connections": connection_modes(text),
        "probe_seconds": round(time.monotonic() - t0, 2),
        "log": str(log_path),
    }


def _client_args(cluster: dict) -> str:
    """CEPH_ARGS words for the clients of an existing cluster (keyring, client name)."""
    return client_args(cluster) if cluster.get("existing") else ""


def check_mode(probe: dict, osd_ids: list[int] | None) -> None:
    """The monitor and every OSD of the pool (None: every OSD the probe reached, at least one:
    an existing cluster's pool) answered in the asked mode (TestboxError names the arm's mode
    and the one used)."""
    asked, seen = probe["asked"], probe["connections"]
    if osd_ids is None:
        osd_ids = [int(e.split(".")[1]) for e in seen if e.startswith("osd.")] or ["(any)"]
    wanted = ["mon", *(f"osd.{i}" for i in osd_ids)]
    for who in wanted:
        used = [m for e, m in seen.items() if e == who or (who == "mon" and e.startswith("mon."))]
        if not used:
            raise TestboxError(
                f"arm asks messenger mode {asked}; the probe client made no ready connection to "
                f"{who} (log {probe['log']}), so the mode is unverified"
            )
        if any(m != asked for m in used):
            raise TestboxError(
                f"arm asks messenger mode {asked} but the connection to {who} used {used[0]} "
                f"(log {probe['log']}); refusing the run"
            )


def check_encryption(cluster: dict, group: str, encrypted: bool) -> list[dict]:
    """Every OSD of ``group`` sits on an encrypted device when the arm says so, and on a plain
    one when not (TestboxError names both); the facts, read again now."""
    facts = []
    for osd in (o for o in cluster["osds"] if o["group"] == group):
        now = device_facts(osd["block"], osd.get("backing_file"))
        is_encrypted = now["encryption"] is not None
        if is_encrypted != encrypted:
            said = "encrypted" if encrypted else "plain"
            found = now["encryption"] or "no encryption"
            raise TestboxError(
                f"arm says the OSD device is {said} but osd.{osd['id']} on {osd['block']} has "
                f"{found}; refusing the run"
            )
        facts.append({"osd": osd["id"], **now})
    return facts


def fio_rbd_target(pool: dict, client: str = "admin") -> list[str]:
    """fio's target options for the pool's image (the rest of the job is the runner's)."""
    return [
        "--ioengine=rbd",
        f"--clientname={client}",
        f"--pool={pool['name']}",
        f"--rbdname={pool['image']}",
    ]


def fio_timeout(runtime_s: float, ramp_s: float = 0) -> float:
    return float(runtime_s) + float(ramp_s) + FIO_TIMEOUT_MARGIN_S


def prepare_rbd_run(
    cluster: dict, group: str, mode: str, encrypted: bool, log_path: Path
) -> tuple[dict, dict]:
    """Before one measured run: verify mode and encryption; (environment for fio, record)."""
    pool = next((p for p in cluster["pools"] if p["group"] == group), None)
    if pool is None:
        raise TestboxError(f"the cluster has no pool for OSD group {group!r}")
    check_daemons(cluster, "before the run")
    if cluster.get("existing"):  # its OSDs are not ours: as the cluster reports them
        osd_ids, encryption = None, cluster["osd_reports"]
    else:
        osd_ids = [o["id"] for o in cluster["osds"] if o["group"] == group]
        encryption = check_encryption(cluster, group, encrypted)
    probe = probe_mode(cluster, pool, mode, log_path)
    check_mode(probe, osd_ids)
    record = {"pool": pool["name"], "image": pool["image"], "messenger_mode": mode}
    record.update(mode_probe=probe, osd_devices=encryption, daemon_modes=cluster["daemon_modes"])
    record["existing_cluster"] = bool(cluster.get("existing"))
    return client_env(cluster["conf"], mode, _client_args(cluster)), record


def _peak_rss_bytes(pid: int) -> int | None:
    for line in (read_text(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def daemon_usage(cluster: dict) -> dict[str, dict | None]:
    """Per recorded daemon (``ceph-osd.0``): CPU seconds used so far (user + system, from
    /proc/<pid>/stat) and peak resident memory (VmHWM); None for a daemon that is gone or is no
    longer the same process."""
    tick = os.sysconf("SC_CLK_TCK")
    usage: dict[str, dict | None] = {}
    for d in cluster.get("daemons", []):
        stat = read_text(f"/proc/{d['pid']}/stat")
        fields = stat.rpartition(")")[2].split() if stat else []
        if len(fields) > 19 and fields[19] == d.get("started"):
            cpu = (int(fields[11]) + int(fields[12])) / tick
            usage[f"{d['tool']}.{d['id']}"] = {
                "cpu_s": cpu,
                "peak_rss_bytes": _peak_rss_bytes(d["pid"]),
            }
        else:
            usage[f"{d['tool']}.{d['id']}"] = None
    return usage


def _cpu_delta(before: dict, after: dict) -> dict[str, float | None]:
    """CPU seconds each daemon used between two :func:`daemon_usage` readings (None: it is gone
    or was restarted in between)."""
    delta: dict[str, float | None] = {}
    for name, b in before.items():
        a = after.get(name)
        delta[name] = round(a["cpu_s"] - b["cpu_s"], 3) if a and b else None
    return delta


def run_rbd_fio(
    cluster: dict, arm: dict, argv: list[str], timeout: float, probe_log: Path, **popen
) -> tuple[subprocess.CompletedProcess, dict]:
    """One measured fio run of an RBD arm (``arm``: group, mode, encrypted): verify the arm,
    run fio with the arm's client mode under ``timeout``, and record the verification and the
    CPU seconds each Ceph daemon used during the run."""
    env, record = prepare_rbd_run(
        cluster, arm["group"], arm["mode"], bool(arm["encrypted"]), probe_log
    )
    before, t0 = daemon_usage(cluster), time.monotonic()
    proc = run_killable(argv, env, timeout, **popen)
    record["seconds"] = round(time.monotonic() - t0, 3)
    after = daemon_usage(cluster)
    record["daemon_cpu_s"] = _cpu_delta(before, after)
    record["daemon_peak_rss_bytes"] = {n: (u or {}).get("peak_rss_bytes") for n, u in after.items()}
    return proc, record


def fio_target_for(entry: dict, client: str = "admin") -> list[str]:
    """fio's target options for an RBD arm's STATE entry (stack-up built its cluster)."""
    arm = entry["ceph"]
    return fio_rbd_target({"name": arm["pool"], "image": arm["image"]}, arm.get("client", client))


def run_entry_fio(
    entry: dict, argv: list[str], timeout: float, probe_log: Path, **popen
) -> tuple[subprocess.CompletedProcess, dict]:
    """:func:`run_rbd_fio` for an RBD arm's STATE entry: its cluster from the record in the
    cluster's folder."""
    top = entry["ceph"]["cluster_dir"]
    cluster = load_cluster(top)
    if cluster is None or not cluster.get("complete"):
        raise TestboxError(f"stack {entry['stack']}: the run's Ceph cluster ({top}) is not up")
    return run_rbd_fio(cluster, entry["ceph"], argv, timeout, probe_log, **popen)


def probe_log_path(rep_path: Path) -> Path:
    """The mode probe's client log beside a run's raw result (``rep3.json`` ->
    ``rep3.ceph-probe.log``): the evidence for the verified mode, kept with the run."""
    return rep_path.with_name(rep_path.name.replace(".json", ".ceph-probe.log"))


def prepare_entry_run(entry: dict, rep_path: Path, fio: dict) -> dict | None:
    """None for a STATE entry that is no RBD arm of the run's own cluster. Before the runner
    starts fio on an RBD arm (and before its CPU window opens): verify the arm's client mode (probe) and OSD encryption; the fio environment, the hard timeout and the
    daemons' CPU reading to take the run's difference from."""
    if not entry.get("ceph"):
        return None
    top = entry["ceph"]["cluster_dir"]
    cluster = load_cluster(top)
    if cluster is None or not cluster.get("complete"):
        raise TestboxError(f"stack {entry['stack']}: the run's Ceph cluster ({top}) is not up")
    arm = entry["ceph"]
    env, record = prepare_rbd_run(
        cluster, arm["group"], arm["mode"], bool(arm["encrypted"]), probe_log_path(rep_path)
    )
    timeout = fio_timeout(fio["runtime_s"], fio["ramp_time_s"])
    run = {"cluster": cluster, "env": env, "timeout": timeout, "record": record}
    run["before"], run["t0"] = daemon_usage(cluster), time.monotonic()
    run["children_before"] = children_cpu_s()
    return run


def gone_daemons(cluster: dict) -> list[str]:
    """Recorded daemons of the run's own cluster that are no longer running as the process that
    was started ("osd.1 (pid 4242)"); an existing cluster's daemons are not ours to watch."""
    gone = []
    for d in cluster.get("daemons", []):
        stat = read_text(f"/proc/{d['pid']}/stat") if d.get("pid") else None
        zombie = bool(stat) and stat.rpartition(")")[2].split()[:1] == ["Z"]
        if not d.get("pid") or zombie or start_time(d["pid"]) != d.get("started"):
            gone.append(f"{d['tool'].removeprefix('ceph-')}.{d['id']} (pid {d['pid']})")
    return gone


def check_daemons(cluster: dict, when: str) -> None:
    """TestboxError naming every daemon of the cluster that went away (with its log's tail):
    a dead OSD of a size-1 pool makes librados wait for it forever."""
    gone = gone_daemons(cluster)
    if gone:
        tails = "\n".join(
            f"{name.split()[0]} log: {_log_tail(cluster, name.split()[0])}" for name in gone
        )
        raise TestboxError(
            f"Ceph daemon(s) {', '.join(gone)} of the run's cluster exited {when}; the run is "
            f"stopped (its raw results so far are kept)\n{tails}"
        )


def _log_tail(cluster: dict, name: str, lines: int = 5) -> str:
    text = read_text(Path(cluster["dir"]) / "log" / f"{name}.log") or "(no log)"
    return " | ".join(text.splitlines()[-lines:])


def children_cpu_s() -> float:
    """User + system seconds of this process's waited-for children (fio's whole process tree,
    every thread: fio's own usr_cpu/sys_cpu count only its job thread, not librbd's)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def communicate(proc: subprocess.Popen, run: dict | None) -> tuple[str, str]:
    """``proc.communicate()``; for an RBD arm (``run`` from :func:`prepare_entry_run`) under its
    hard timeout, past which fio's process group gets SIGKILL and TestboxError says why, and
    watching the cluster's daemons: one that exits stops fio at once, naming it."""
    if run is None:
        return proc.communicate()
    deadline = time.monotonic() + run["timeout"]
    while True:
        try:
            return proc.communicate(timeout=min(DAEMON_WATCH_S, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        if gone_daemons(run.get("cluster") or {}):
            kill_group(proc)
            check_daemons(run["cluster"], "during fio's run")
        if time.monotonic() >= deadline:
            kill_group(proc)
            raise TestboxError(
                f"fio on the RBD arm did not finish within {run['timeout']:.0f} s (CEPH_ARGS "
                f"{run['env'].get('CEPH_ARGS')!r}): killed its process group"
            )


def finish_entry_run(run: dict) -> dict:
    """The run's Ceph record, the ``ceph`` key of its CPU sidecar ``rep<k>.cpu.json``:

    ``pool``, ``image``; ``messenger_mode`` (the arm's client mode, verified); ``mode_probe``
    (``asked``, ``connections``: entity -> mode its connection used, ``probe_seconds``, ``log``:
    the probe client's log beside the rep, read-only); ``osd_devices`` (per OSD of the arm: its
    block device, backing file and ``encryption``, None for plain); ``daemon_modes`` (what the
    daemons accept; None on an existing cluster); ``existing_cluster`` (true: a cluster
    luksbench did not build; ``osd_devices`` then as its OSD metadata reports them, encryption
    unknown, and ``daemon_cpu_s`` empty); ``seconds`` (fio's wall time); ``daemon_cpu_s`` (``ceph-osd.0``, ``ceph-mon.a``
    ...: user + system CPU seconds over the fio run, from /proc/<pid>/stat; None: the daemon
    went away or restarted; every daemon of the cluster, an idle other group's OSD near 0);
    ``daemon_peak_rss_bytes`` (VmHWM of each daemon so far); ``client_cpu_s`` (user + system
    seconds of fio's process tree, every thread: librbd and librados included; the runner's
    waited-for children between the probe and fio's exit)."""
    record = dict(run["record"])
    if "children_before" in run:
        record["client_cpu_s"] = round(children_cpu_s() - run["children_before"], 3)
    probe = record["mode_probe"] = dict(record["mode_probe"])
    log_path = Path(probe["log"])
    if log_path.exists():
        log_path.chmod(0o444)
    probe["log"] = log_path.name
    record["seconds"] = round(time.monotonic() - run["t0"], 3)
    after = daemon_usage(run["cluster"])
    record["daemon_cpu_s"] = _cpu_delta(run["before"], after)
    record["daemon_peak_rss_bytes"] = {n: (u or {}).get("peak_rss_bytes") for n, u in after.items()}
    return record
