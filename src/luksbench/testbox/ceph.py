"""A throwaway Ceph cluster for one run: one monitor and one BlueStore OSD per given block device
(a layer of the run: a luks layer's device puts the OSD on LUKS, as ceph-volume builds it), a
size-1 pool per group of OSDs pinned to them by device class, and a prefilled RBD image per pool.

Every file (conf, keyrings, monmap, stores, admin sockets, pid files, logs) lives in one folder
under the run's scratch folder; daemons bind to 127.0.0.1 only and are started with the
messenger modes the plan's ``ceph.daemon_modes`` lists (``ms_cluster_mode``/``ms_service_mode``
act at daemon start only), so a client chooses crc or secure per run through ``CEPH_ARGS`` among
them; daemon-to-daemon traffic in secure mode is a cluster of its own (``daemon_modes: secure``). The cluster's record is written
to ``cluster.json`` in that folder before each daemon starts, so :func:`cluster_down` can stop
everything after a ``kill -9`` of the process that built it. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

from luksbench.testbox.cephdown import RECORD_NAME, cluster_down, start_time
from luksbench.testbox.cephexisting import check_existing_layer, is_existing_arm
from luksbench.testbox.sysutil import (
    TestboxError,
    log,
    pid_alive,
    read_text,
    run_tool,
    utc_now,
    write_json_atomic,
)

CLUSTER_DIR_NAME = "ceph"
DAEMONS = ("ceph-mon", "ceph-osd")
MODES = ("crc", "secure")
# The lists of modes Ceph's daemons accept (ms_cluster_mode, ms_service_mode: preferred first);
# an arm's client asks for one mode (CEPH_ARGS), which must be in its cluster's list.
DAEMON_MODE_LISTS = ("crc secure", "secure crc", "secure", "crc")
# osd_memory_target's floor (896 MiB): an OSD still needs about 1.5 GB resident on this machine.
OSD_MEMORY_TARGET = 896 * 1024 * 1024
BLUESTORE_CACHE_BYTES = 64 * 1024 * 1024
# AF_UNIX socket paths (admin sockets) hold at most 107 bytes.
SOCKET_PATH_MAX = 107
LUKS_MAGIC = b"LUKS\xba\xbe"
BLUESTORE_LABEL = b"bluestore block device"


def check_ceph_layer(layer: dict, where: str) -> list[str]:
    """Problems with an ``osd`` or ``rbd`` layer (empty: fine): an OSD sits on one layer, an
    RBD image on OSD layers, and an arm's client mode is crc or secure."""
    kind, problems = layer.get("kind"), []
    below = [layer["over"]] if "over" in layer else list(layer.get("members") or [])
    if kind == "osd" and ("over" not in layer or "members" in layer):
        problems.append(f"{where}: an osd layer sits on exactly one layer ('over')")
    if kind == "rbd" and below:
        if any(not isinstance(b, dict) or b.get("kind") != "osd" for b in below):
            problems.append(f"{where}: an rbd layer sits on osd layers only")
        if layer.get("mode") not in MODES:
            problems.append(f"{where}.mode: {layer.get('mode')!r} is not one of {MODES}")
    return problems + check_existing_layer(layer, where)


def client_mode(arm: dict) -> str:
    """The messenger mode an rbd arm's client asks for."""
    return arm["mode"]


def daemon_mode_problems(plan) -> list[str]:
    """Problems with the plan's ``ceph.daemon_modes`` (empty: fine): a list Ceph accepts, holding
    the mode of every arm on the cluster the run builds. A client asking for a mode its daemons
    refuse would retry forever, so such an arm is refused here, before anything is built."""
    settings = plan["ceph"]
    modes = settings.get("daemon_modes") if isinstance(settings, dict) else None
    if modes not in DAEMON_MODE_LISTS:
        known = ", ".join(repr(m) for m in DAEMON_MODE_LISTS)
        return [f"ceph.daemon_modes: {modes!r} is not one of {known}"]
    problems = []
    for name, stack in plan["stacks"].items():
        if not (is_cluster_layer(stack) and stack["kind"] == "rbd"):
            continue
        mode = client_mode(stack)
        if mode not in modes.split():
            problems.append(
                f"stacks.{name}.mode: a {mode} client cannot connect to daemons started with "
                f"ceph.daemon_modes {modes!r}; measure {mode} arms in a separate run whose "
                f"ceph.daemon_modes lists {mode} (e.g. 'crc secure'), or give this arm a mode "
                f"of {', '.join(modes.split())}"
            )
    return problems


def cluster_dir(scratch: str | Path) -> Path:
    return Path(scratch) / CLUSTER_DIR_NAME


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def conf_text(top: Path, fsid: str, mon_port: int, daemon_modes: str) -> str:
    """ceph.conf keeping every path under ``top``, every address on loopback, memory small; the
    daemons accept the messenger modes ``daemon_modes`` (one of DAEMON_MODE_LISTS)."""
    glob = {
        "fsid": fsid,
        "mon_host": f"[v2:127.0.0.1:{mon_port}]",
        "public_addr": "127.0.0.1",
        "cluster_addr": "127.0.0.1",
        "ms_bind_ipv4": "true",
        "ms_bind_ipv6": "false",
        "ms_bind_msgr1": "false",  # msgr2 only: the only protocol with a secure mode
        "ms_cluster_mode": daemon_modes,
        "ms_service_mode": daemon_modes,
        "ms_mon_cluster_mode": daemon_modes,
        "ms_mon_service_mode": daemon_modes,
        "auth_cluster_required": "cephx",
        "auth_service_required": "cephx",
        "auth_client_required": "cephx",
        "run_dir": f"{top}/run",
        "admin_socket": "$run_dir/$name.asok",
        "pid_file": "$run_dir/$name.pid",
        "log_file": f"{top}/log/$name.log",
        "crash_dir": f"{top}/crash",
        "mon_data": f"{top}/mon/$id",
        "osd_data": f"{top}/osd/$id",
        "mon_cluster_log_to_file": "false",
        "mon_allow_pool_size_one": "true",
        "mon_warn_on_pool_no_redundancy": "false",
        "mon_data_avail_warn": "2",
        "mon_data_avail_crit": "1",
        "osd_pool_default_size": "1",
        "osd_pool_default_min_size": "1",
        "osd_pool_default_pg_autoscale_mode": "off",
        "osd_crush_chooseleaf_type": "0",
        "osd_class_update_on_start": "false",
        "osd_objectstore": "bluestore",
        "osd_memory_target": str(OSD_MEMORY_TARGET),
        "osd_memory_target_autotune": "false",
        "bluestore_cache_autotune": "false",
        "bluestore_cache_size": str(BLUESTORE_CACHE_BYTES),
        "auth_allow_insecure_global_id_reclaim": "false",
    }
    sections = {
        "global": glob,
        "mon": {"keyring": "$mon_data/keyring"},
        "osd": {"keyring": "$osd_data/keyring"},
        "client": {
            "keyring": f"{top}/admin.keyring",
            "admin_socket": "",  # clients need none; their names would outgrow AF_UNIX paths
            "log_file": f"{top}/log/client.$pid.log",
        },
    }
    out = []
    for name, opts in sections.items():
        out.append(f"[{name}]")
        out += [f"\t{k} = {v}" for k, v in opts.items()]
    return "\n".join(out) + "\n"


def _save(cluster: dict) -> None:
    write_json_atomic(Path(cluster["dir"]) / RECORD_NAME, cluster, mode=0o600)


def ceph_cli(cluster: dict, *args: str, timeout: float = 60) -> str:
    argv = ["ceph", "-c", cluster["conf"], "--connect-timeout", "20", *args]
    return run_tool(argv, f"ceph cluster {cluster['fsid'][:8]}", timeout=timeout).stdout


def _start_daemon(cluster: dict, tool: str, ident: str) -> dict:
    """Start ``tool -c conf -i ident``; it daemonizes itself (no zombie, no parent to outlive)
    once initialised and writes its pid file. Recorded before the start so teardown always
    looks for it (by its command line until its pid is known)."""
    daemon = {"tool": tool, "id": ident, "pid": None, "started": None}
    cluster["daemons"].append(daemon)
    _save(cluster)
    name = f"{tool.removeprefix('ceph-')}.{ident}"
    try:
        run_tool([tool, "-c", cluster["conf"], "-i", ident], f"start {name}", timeout=300)
        pid_file = Path(cluster["dir"]) / "run" / f"{name}.pid"
        daemon["pid"] = int((read_text(pid_file) or "").strip() or 0) or None
    except TestboxError as exc:
        raise TestboxError(f"{exc}\n{name} log:\n{_log_tail(cluster, name)}") from exc
    if daemon["pid"] is None:
        raise TestboxError(f"{name} wrote no pid file; log:\n{_log_tail(cluster, name)}")
    daemon["started"] = start_time(daemon["pid"])
    _save(cluster)
    return daemon


def _log_tail(cluster: dict, name: str, lines: int = 15) -> str:
    text = read_text(Path(cluster["dir"]) / "log" / f"{name}.log") or "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _wait_for(cluster: dict, what: str, check, timeout: float, daemon: dict | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon is not None and not pid_alive(daemon["pid"]):
            name = f"{daemon['tool'].removeprefix('ceph-')}.{daemon['id']}"
            raise TestboxError(f"{what}: {name} exited; its log:\n{_log_tail(cluster, name)}")
        with contextlib.suppress(TestboxError):
            if check():
                return
        time.sleep(0.5)
    raise TestboxError(f"{what}: not ready after {timeout:.0f} s")


def _check_socket_paths(top: Path, osd_count: int) -> None:
    longest = top / "run" / f"osd.{max(osd_count - 1, 0)}.asok"
    if len(str(longest)) > SOCKET_PATH_MAX:
        raise TestboxError(
            f"scratch folder {top.parent} is too deep for Ceph's admin sockets ({longest} must "
            f"fit {SOCKET_PATH_MAX} bytes): use a shorter scratch_dir"
        )


def _new_cluster(scratch: Path, daemon_modes: str) -> dict:
    top = cluster_dir(scratch)
    if top.exists():
        raise TestboxError(f"{top} exists: a cluster may still be up; tear it down first")
    for sub in ("", "run", "log", "mon", "osd", "crash"):
        (top / sub).mkdir(mode=0o700, parents=True, exist_ok=sub != "")
    fsid, port = str(uuid.uuid4()), _free_port()
    conf = top / "ceph.conf"
    conf.write_text(conf_text(top, fsid, port, daemon_modes))
    cluster = {"dir": str(top), "conf": str(conf), "fsid": fsid, "mon_port": port}
    cluster.update(daemon_modes=daemon_modes, created=utc_now(), daemons=[], osds=[], pools=[])
    _save(cluster)
    return cluster


def _make_monitor(cluster: dict) -> None:
    top, conf = Path(cluster["dir"]), cluster["conf"]
    mon_kr, admin_kr, monmap = top / "mon.keyring", top / "admin.keyring", top / "monmap"
    auth = ["ceph-authtool", "--create-keyring"]
    run_tool([*auth, str(mon_kr), "--gen-key", "-n", "mon.", "--cap", "mon", "allow *"], "keyring")
    caps = ["--cap", "mon", "allow *", "--cap", "osd", "allow *", "--cap", "mgr", "allow *"]
    run_tool([*auth, str(admin_kr), "--gen-key", "-n", "client.admin", *caps], "admin keyring")
    run_tool(["ceph-authtool", str(mon_kr), "--import-keyring", str(admin_kr)], "keyring")
    addr = f"[v2:127.0.0.1:{cluster['mon_port']}]"
    mm = ["monmaptool", "--create", "--fsid", cluster["fsid"], "--addv", "a", addr, str(monmap)]
    run_tool(mm, "monmap")
    mkfs = ["ceph-mon", "-c", conf, "--mkfs", "-i", "a", "--monmap", str(monmap)]
    run_tool([*mkfs, "--keyring", str(mon_kr)], "ceph-mon --mkfs")
    mon = _start_daemon(cluster, "ceph-mon", "a")
    _wait_for(
        cluster, "monitor", lambda: ceph_cli(cluster, "mon", "stat", timeout=30) != "", 60, mon
    )


def device_facts(block: str, backing: str | None = None) -> dict:
    """What the OSD's block device is: a dm-crypt mapping (kernel) or a file whose backing file
    carries a LUKS header (the userspace backend's qemu luks export), or neither."""
    facts = {"block": block, "backing_file": backing, "encryption": None}
    real = os.path.realpath(block)
    if real.startswith("/dev/"):
        dm_uuid = read_text(f"/sys/class/block/{os.path.basename(real)}/dm/uuid") or ""
        facts["dm_uuid_prefix"] = dm_uuid.split("-")[0] or None
        if dm_uuid.startswith("CRYPT-"):
            facts["encryption"] = "dm-crypt"
    if backing:
        with open(backing, "rb") as f:
            if f.read(len(LUKS_MAGIC)) == LUKS_MAGIC:
                facts["encryption"] = "luks (qemu luks driver)"
    return facts


def _make_osd(cluster: dict, spec: dict) -> dict:
    """One BlueStore OSD on ``spec['block']`` in device class ``spec['group']``."""
    top, conf = Path(cluster["dir"]), cluster["conf"]
    osd_uuid = str(uuid.uuid4())
    osd_id = ceph_cli(cluster, "osd", "new", osd_uuid).strip()
    if not osd_id.isdigit():
        raise TestboxError(f"ceph osd new answered {osd_id!r}, not an OSD id")
    data = top / "osd" / osd_id
    data.mkdir(mode=0o700)
    osd = {"id": int(osd_id), "uuid": osd_uuid, "group": spec["group"], "data": str(data)}
    osd.update(device_facts(spec["block"], spec.get("backing_file")), loop_over=None)
    cluster["osds"].append(osd)
    _save(cluster)
    if spec.get("loop"):
        osd["block"] = _attach_loop(cluster, osd, spec["block"])
    os.symlink(osd["block"], data / "block")
    if _has_bluestore_label(osd["block"]):
        raise TestboxError(
            f"{osd['block']} already carries a BlueStore label (another OSD's device); an OSD "
            "is built only on a layer this run has just created"
        )
    log(f"  ceph: osd.{osd_id} BlueStore on {spec['block']} ({osd['encryption'] or 'plain'})")
    keyring = str(data / "keyring")
    new_key = ["ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", f"osd.{osd_id}"]
    run_tool(new_key, f"osd.{osd_id} keyring")
    caps = ["osd", "allow *", "mon", "allow profile osd"]
    ceph_cli(cluster, "auth", "add", f"osd.{osd_id}", *caps, "-i", keyring)
    mkfs = ["ceph-osd", "-c", conf, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid]
    run_tool([*mkfs, "--no-mon-config"], f"osd.{osd_id} mkfs", timeout=300)
    osd["bluestore_label"] = _has_bluestore_label(osd["block"])
    daemon = _start_daemon(cluster, "ceph-osd", osd_id)
    _wait_for(cluster, f"osd.{osd_id} up", lambda: _osd_up(cluster, int(osd_id)), 120, daemon)
    ceph_cli(cluster, "osd", "crush", "set-device-class", spec["group"], f"osd.{osd_id}")
    return osd


def _has_bluestore_label(block: str) -> bool:
    with open(block, "rb") as f:
        return f.read(len(BLUESTORE_LABEL)) == BLUESTORE_LABEL


def _attach_loop(cluster: dict, osd: dict, path: str) -> str:
    """A loop device over ``path`` (recorded first, so teardown detaches it): BlueStore's
    O_DIRECT reads through qemu-storage-daemon's FUSE export return stale data (bad crc32c,
    then the object is 'missing' forever in a size-1 pool); a loop device reads it coherently."""
    osd["loop_over"] = path
    _save(cluster)
    loop = run_tool(["losetup", "--find", "--show", path], f"loop device over {path}").stdout
    return loop.strip()


def _osd_up(cluster: dict, osd_id: int) -> bool:
    dump = json.loads(ceph_cli(cluster, "osd", "dump", "-f", "json", timeout=30))
    return any(o["osd"] == osd_id and o["up"] for o in dump["osds"])


def _make_pool(cluster: dict, group: str, image: str, image_mib: int, pg_num: int) -> dict:
    """A size-1 pool on the OSDs of ``group`` and a prefilled image (an unwritten image's reads
    never reach the OSD)."""
    pool = {"name": f"lb-{group}", "group": group, "image": image, "image_mib": image_mib}
    cluster["pools"].append(pool)
    _save(cluster)
    rule = f"lb-{group}"
    ceph_cli(cluster, "osd", "crush", "rule", "create-replicated", rule, "default", "osd", group)
    ceph_cli(
        cluster, "osd", "pool", "create", pool["name"], str(pg_num), str(pg_num), "replicated", rule
    )
    ceph_cli(cluster, "osd", "pool", "set", pool["name"], "size", "1", "--yes-i-really-mean-it")
    ceph_cli(cluster, "osd", "pool", "application", "enable", pool["name"], "rbd")
    rbd = ["rbd", "-c", cluster["conf"], "-p", pool["name"]]
    run_tool([*rbd, "create", "--size", f"{image_mib}M", image], f"rbd create {image}")
    t0 = time.monotonic()
    bench = ["bench", "--io-type", "write", "--io-size", "4M", "--io-pattern", "seq"]
    bench += ["--io-threads", "4", "--io-total", f"{image_mib}M", image]
    run_tool([*rbd, *bench], f"prefill {pool['name']}/{image}", timeout=1800)
    pool["prefill_seconds"] = round(time.monotonic() - t0, 2)
    _save(cluster)
    return pool


def cluster_up(
    scratch: str | Path,
    osds: list[dict],
    *,
    image_mib: int,
    image: str = "bench",
    pg_num: int = 16,
    daemon_modes: str,
) -> dict:
    """Build the cluster: ``osds`` are ``{"block", "group", "backing_file"?}``; one pool and one
    prefilled image per group; daemons accepting the messenger modes ``daemon_modes`` (the plan's
    ``ceph.daemon_modes``). Returns the cluster record; a failure tears down what was built."""
    if not osds:
        raise TestboxError("a Ceph cluster needs at least one OSD device")
    if daemon_modes not in DAEMON_MODE_LISTS:
        raise TestboxError(
            f"ceph.daemon_modes {daemon_modes!r} is not one of {', '.join(DAEMON_MODE_LISTS)}"
        )
    missing = [
        t
        for t in ("ceph", "ceph-mon", "ceph-osd", "ceph-authtool", "monmaptool", "rbd")
        if shutil.which(t) is None
    ]
    if missing:
        raise TestboxError(f"Ceph tools missing: {missing} (scripts/setup.sh installs them)")
    t0 = time.monotonic()
    _check_socket_paths(cluster_dir(scratch), len(osds))
    cluster = _new_cluster(Path(scratch), daemon_modes)
    try:
        _make_monitor(cluster)
        cluster["mon_seconds"] = round(time.monotonic() - t0, 2)
        for spec in osds:
            _make_osd(cluster, spec)
        cluster["osd_seconds"] = round(time.monotonic() - t0 - cluster["mon_seconds"], 2)
        for group in dict.fromkeys(s["group"] for s in osds):
            _make_pool(cluster, group, image, image_mib, pg_num)
    except BaseException as exc:
        log(f"  ceph: cluster build failed ({exc!r}); tearing it down")
        cluster_down(cluster["dir"])
        raise
    cluster["up_seconds"] = round(time.monotonic() - t0, 2)
    cluster["complete"] = True
    _save(cluster)
    log(f"  ceph: cluster {cluster['fsid'][:8]} up in {cluster['up_seconds']:.1f} s")
    return cluster


# Resident memory one OSD needed here with osd_memory_target at its floor (and the monitor's).
OSD_MEMORY_NEED_BYTES = 1536 * 1024 * 1024
MON_MEMORY_NEED_BYTES = 128 * 1024 * 1024


def is_cluster_layer(layer) -> bool:
    """An ``osd`` layer or an ``rbd`` arm over osd layers: part of the cluster the run builds
    (an ``rbd`` layer with neither 'over' nor 'members' uses an existing cluster)."""
    if not isinstance(layer, dict):
        return False
    kind = layer.get("kind")
    return kind == "osd" or (kind == "rbd" and ("over" in layer or "members" in layer))


def layer_head(layer: dict) -> str:
    """The plan printout's words for a cluster layer (what sits below follows them)."""
    if layer["kind"] == "osd":
        return "Ceph BlueStore OSD"
    size = f"{layer['image_mib']} MiB" if layer.get("image_mib") else "auto-sized"
    return f"rbd arm, client mode {layer['mode']}, {size} image of the run's cluster,"


def layer_actions(layer: dict, target) -> list[str]:
    """The destructive actions of a cluster layer for the plan printout (``target``: the words
    for the layer below)."""
    if layer["kind"] == "osd":
        return [
            f"ceph-osd --mkfs BlueStore on {target(layer['over'])} (destroys its data; built "
            "once for all arms over the same osd layers)"
        ]
    if is_cluster_layer(layer):
        return ["create a size-1 pool and an RBD image, prefill it (dd through rbd)"]
    return []


def shared_osd_arm(plan: dict, name: str) -> str | None:
    """The arm printed before ``name`` (baseline first) over the same osd layers, whose OSDs,
    pool and image ``name`` shares; None for the first arm of its OSD group or no Ceph arm."""
    stack = plan["stacks"][name]
    if not (is_cluster_layer(stack) and stack["kind"] == "rbd"):
        return None
    key = json.dumps(stack.get("over") or stack.get("members"), sort_keys=True)
    base = plan["baseline"]
    for other in [base, *[s for s in plan["stacks"] if s != base]]:
        if other == name:
            return None
        below = plan["stacks"][other].get("over") or plan["stacks"][other].get("members")
        if is_cluster_layer(plan["stacks"][other]) and json.dumps(below, sort_keys=True) == key:
            return other
    return None


def osd_groups(plan: dict) -> list[list]:
    """The distinct sets of osd layers of the plan's arms (one OSD group each)."""
    found: dict[str, list] = {}
    for stack in plan["stacks"].values():
        if is_cluster_layer(stack) and stack["kind"] == "rbd":
            below = [stack["over"]] if "over" in stack else list(stack["members"])
            found.setdefault(json.dumps(below, sort_keys=True), below)
    return list(found.values())


def plan_lines(plan: dict) -> list[str]:
    """The plan printout's lines on the cluster the run builds or uses (none without one)."""
    existing = {n: s for n, s in plan["stacks"].items() if is_existing_arm(s)}
    if existing:
        images = sorted({f"{s['pool']}/{s['image']}" for s in existing.values()})
        confs = sorted({s["conf"] for s in existing.values()})
        return [
            f"  ceph: arms {', '.join(existing)} use the existing cluster of {', '.join(confs)}: "
            f"stack-up creates and prefills image(s) {', '.join(images)} (refused if one exists), "
            "stack-down removes them; no daemon is started or stopped, nothing else is created",
            "  ceph: every run's client mode is verified by a probe; the OSDs are that cluster's: "
            "their encryption is not chosen here (an osd layer needs the cluster built here)",
        ]
    groups = osd_groups(plan)
    if not groups:
        return []
    osds = sum(len(g) for g in groups)
    need = osds * OSD_MEMORY_NEED_BYTES + MON_MEMORY_NEED_BYTES
    modes = plan["ceph"]["daemon_modes"]
    return [
        f"  ceph: stack-up builds a throwaway cluster under {plan['scratch_dir']}/ceph: one "
        f"monitor, {osds} BlueStore OSD(s) in {len(groups)} group(s), a pool and a prefilled "
        f"RBD image per group; daemons on 127.0.0.1, accepting messenger modes {modes!r} "
        "(ceph.daemon_modes)",
        f"  ceph: memory needed about {need / 2**30:.1f} GiB; every run's client mode is verified "
        "by a probe and the OSDs' encryption read again; stack-down stops and removes it all",
        _daemon_modes_line(modes),
    ]


def _daemon_modes_line(modes: str) -> str:
    """What the daemons' modes make of the run: the arms switch only the client's mode, and
    cluster-side secure mode (daemon-to-daemon traffic) is a run of its own."""
    if "crc" not in modes.split():
        return (
            "  ceph: cluster-side secure mode: the daemons accept only secure, so their own "
            "connections (monitor, OSD heartbeats; replication with pools of size > 1) are "
            "encrypted too; compare with a separate run whose daemons accept crc"
        )
    return (
        "  ceph: the arms switch the client's mode only; cluster-side secure mode "
        "(daemon-to-daemon traffic) needs daemons started in it: a separate run with "
        "ceph.daemon_modes 'secure' and secure arms, not an arm"
    )
