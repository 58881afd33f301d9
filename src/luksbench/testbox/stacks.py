"""Stack-up (check devices, build every stack with the chosen backend, precondition) and
stack-down (tear down, verify clean, record).

STATE is written before anything is created and after every step, so ``stack_down`` can always
undo a partial ``stack_up``. It holds no key material: keys are 0600 files in a 0700 directory
under scratch_dir, passed to tools by file only. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from pathlib import Path

from luksbench.testbox import lock, safety
from luksbench.testbox.backends import kernel, userspace
from luksbench.testbox.backends.choose import resolve_plan_backend
from luksbench.testbox.capture import tool_versions
from luksbench.testbox.cephstack import (
    attach_cluster,
    ceph_leftovers,
    layer_entries,
    split_plan,
    tear_down_ceph,
)
from luksbench.testbox.planbuild import MIB, baseline_first, device_uses, precondition_options
from luksbench.testbox.precondition import precondition
from luksbench.testbox.sysutil import (
    Progress,
    TestboxError,
    find_our_processes,
    log,
    runs_with,
    stop_process,
    utc_now,
    write_json_atomic,
)

STATE_VERSION = 1
# stack-up's description of the stacks when it sits beside STATE (the workflow's stacks.json)
DESCRIPTION_NAME = "stacks.json"


def load_state(state_path: Path) -> dict:
    try:
        return json.loads(Path(state_path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TestboxError(f"{state_path}: cannot read stack state: {exc}") from exc


def stack_up(plan: dict, state_path: Path, describe_path: Path) -> dict:
    """Check every device, bring every stack up, precondition, write STATE and DESCRIBE; returns
    the description. A failure (or Ctrl-C) tears down everything built so far. RBD arms over
    ``osd`` layers: the backend builds the layers under the OSDs, then the run's Ceph cluster."""
    state_path, describe_path = Path(state_path), Path(describe_path)
    plan, ceph_part = split_plan(plan)
    backend = _check_before_building(plan, state_path)
    scratch = safety.make_scratch_dir(plan["scratch_dir"])
    size = int(plan["device_size_mib"]) * MIB
    # Everything the stacks will use, checked before anything is created.
    device_checks: dict[str, dict] = {}
    if backend["selected"] == "kernel":
        used = device_uses(plan)
        disks = {n: d for n, d in plan.get("devices", {}).items() if "path" in d and n in used}
        device_checks = safety.check_devices(disks)
        _check_dm_names_free(plan)
    state = _new_state(plan, backend, scratch, size)
    # Before anything is created: one benchmark per test box (the state file is the lock's proof).
    lock.acquire(plan, state_path)
    write_json_atomic(state_path, state, mode=0o600)
    try:
        if state["backend"] == "kernel":
            described = kernel.build_kernel(plan, state, state_path, device_checks)
        else:
            described = userspace.build_userspace(plan, state, state_path, size)
        if ceph_part:
            described = attach_cluster(ceph_part, state, state_path, described)
            plan = ceph_part["plan"]
        description = _finish(plan, state, state_path, described)
    except BaseException as exc:
        _undo_failed_stack_up(state_path, exc)
        raise
    write_json_atomic(describe_path, description)
    up = f"{len(state['order'])} stack(s) up"
    log(f"luksbench testbox stack-up: {up}; state {state_path}, description {describe_path}")
    return description


def _check_before_building(plan: dict, state_path: Path) -> dict:
    """Names are safe, no stacks are up for this STATE, a backend can build the plan here."""
    safety.check_name(plan["run"], "run")
    safety.check_name(plan["host"], "host")
    for name in plan["stacks"]:
        safety.check_name(name, "stack")
    if state_path.exists():
        raise TestboxError(
            f"{state_path} exists: stacks may still be up; run `luksbench testbox stack-down --state {state_path}` first"
        )
    backend = resolve_plan_backend(plan)
    if backend["selected"] is None:
        raise TestboxError(f"no usable backend: {backend['reason']}")
    log(f"luksbench testbox stack-up: backend {backend['selected']} ({backend['reason']})")
    return backend


def _check_dm_names_free(plan: dict) -> None:
    for name in kernel.planned_dm_names(plan, kernel.build_order(plan)):
        if os.path.exists(f"/dev/mapper/{name}"):
            raise safety.SafetyError(
                f"device-mapper name {name} is already in use (/dev/mapper/{name}): another "
                "run's or tool's device; luksbench leaves it alone (remove it, or choose "
                "another run name)"
            )


def _new_entry(plan: dict, name: str, backend: str, scratch: Path, size: int) -> dict:
    """A stack's STATE entry before it is built (userspace: its backing file and mountpoint)."""
    built = dict.fromkeys(("device", "device_type", "size_bytes", "mountpoint"))  # not yet
    entry = {"stack": name, "kind": plan["stacks"][name]["kind"], **built}
    if backend != "userspace":  # chosen only when it can build every stack
        return entry
    run = plan["run"]
    backing = safety.check_inside(scratch / f"luksbench-{run}-{name}.img", scratch)
    mountpoint = safety.check_inside(scratch / f"luksbench-{run}-{name}.fuse", scratch)
    entry.update(backing_file=str(backing), backing_size_bytes=size, daemon=None, key_file=None)
    entry["mountpoint"] = str(mountpoint)
    safety.check_free(mountpoint=mountpoint, backing=backing)
    return entry


def _new_state(plan: dict, backend: dict, scratch: Path, size: int) -> dict:
    order = baseline_first(plan)
    return {
        "version": STATE_VERSION,
        "run": plan["run"],
        "host": plan["host"],
        "backend": backend["selected"],
        "backend_reason": backend["reason"],
        "scratch_dir": str(scratch),
        "key_dir": None,
        "runtime_dir": None,
        "created": utc_now(),
        "session": f"{utc_now()}-{os.urandom(3).hex()}",  # one stack-up: the pairs it holds
        "complete": False,
        "order": order,
        "io_size_bytes": None,
        "stacks": {n: _new_entry(plan, n, backend["selected"], scratch, size) for n in order},
        "objects": [],  # kernel backend: the undo log (kernel.KernelBuilder)
    }


def _undo_failed_stack_up(state_path: Path, exc: BaseException) -> None:
    """Tear down what a failed stack-up built; an unexpected error becomes a TestboxError."""
    log(f"luksbench testbox stack-up: failed ({exc!r}); tearing down what was built")
    try:
        stack_down(state_path)
    except Exception as down_exc:
        log(f"luksbench testbox stack-up: teardown after failure also failed: {down_exc}")
    if isinstance(exc, Exception) and not isinstance(exc, TestboxError | safety.SafetyError):
        raise TestboxError(f"stack-up failed: {exc}") from exc


def check_files_unchanged(state: dict, before: str) -> None:
    """Every file the stacks were built on is still the one stack-up created (SafetyError
    otherwise): the undo log's files and the loop devices over them (kernel), and each daemon
    still exports its own backing file (userspace). Called before preconditioning and fio."""
    kernel.check_recorded_files(state.get("objects") or [], before)
    for name, entry in state["stacks"].items():
        identity, pid = entry.get("backing_identity"), (entry.get("daemon") or {}).get("pid")
        if identity is not None and pid is not None and not safety.process_has_open(pid, identity):
            raise safety.SafetyError(
                f"stack {name}: qemu-storage-daemon pid {pid} no longer has the backing file "
                f"luksbench created open (device, inode {tuple(identity)}); refusing to {before}"
            )


def _finish(plan: dict, state: dict, state_path: Path, described: dict) -> dict:
    """Common span, preconditioning, and the description every run records."""
    live = {n: e for n, e in state["stacks"].items() if not e.get("unavailable")}
    sizes = [e["size_bytes"] for e in live.values() if e["device_type"] != "rbd"]
    # Every fio run touches the same span on every stack (LUKS headers make luks devices smaller).
    io_size = min(sizes) // MIB * MIB if sizes else 0
    if sizes and io_size <= 0:
        raise TestboxError(
            f"devices are smaller than 1 MiB; raise device_size_mib (now {plan['device_size_mib']})"
        )
    state["io_size_bytes"] = io_size
    write_json_atomic(state_path, state, mode=0o600)

    ioengine = plan["fio"]["ioengine"]  # every plan carries it (formats.plan.FIO_KEYS)
    options = precondition_options(plan["precondition"])
    if options["enabled"]:
        check_files_unchanged(state, "precondition the stacks")
    filled = [n for n in state["order"] if n in live and live[n]["device_type"] != "rbd"]
    progress = Progress(len(filled))
    for name in state["order"]:
        entry = state["stacks"][name]
        if entry.get("unavailable"):
            continue
        record = None
        if options["enabled"] and name in filled:
            mib = entry["size_bytes"] / MIB
            log(f"  [{progress.done + 1}/{progress.total}] {name}: preconditioning {mib:.0f} MiB")
            record = precondition(entry["device"], entry["size_bytes"], options, ioengine, log=log)
            done = progress.step(record["seconds"])
            log(f"  {name}: preconditioned in {record['seconds']:.1f} s; {done}")
        described[name]["precondition"] = record
    state["complete"] = True
    write_json_atomic(state_path, state, mode=0o600)
    return {
        "run": state["run"],
        "host": state["host"],
        "created": utc_now(),
        "backend": state["backend"],
        "backend_reason": state["backend_reason"],
        "baseline": plan["baseline"],
        "order": state["order"],
        "io_size_bytes": io_size,
        "io_size_note": "every fio run uses --size=io_size_bytes (smallest device, whole MiB) on every stack",
        "tools": tool_versions(),
        "mdstat": kernel.mdstat(),
        "stacks": described,
    }


def _kill_fio(devices: list[str], actions: list[str]) -> None:
    markers = [f"--filename={d}" for d in devices if d]
    for pid in find_our_processes(markers, names=("fio",), exact=True):
        if stopped_by := stop_process(pid, (signal.SIGINT, signal.SIGKILL)):
            actions.append(f"stopped leftover fio pid {pid} ({stopped_by})")


def _remove_file(path: str | None, what: str, actions: list[str]) -> None:
    if path and os.path.lexists(path):
        os.unlink(path)
        actions.append(f"removed {what} {path}")


def _shred_keys(key_dir: str | None, actions: list[str]) -> None:
    if not key_dir or not os.path.isdir(key_dir):
        return
    for p in Path(key_dir).iterdir():
        with contextlib.suppress(OSError):
            if p.is_file() and not p.is_symlink():
                with open(p, "r+b") as f:
                    f.write(b"\0" * p.stat().st_size)
                    f.flush()
                    os.fsync(f.fileno())
    shutil.rmtree(key_dir)
    actions.append(f"removed key directory {key_dir}")


def stack_down(
    state_path: str | Path, record_path: str | Path | None = None, keep_lock: bool = False
) -> dict:
    """Tear down everything STATE describes, verify nothing of ours is left, delete STATE
    (idempotent). Returns the record; when ``ok`` is False STATE is kept. ``keep_lock``: between
    two sessions of one run."""
    state_path = Path(state_path)
    started, state_found = utc_now(), state_path.exists()
    state = load_state(state_path) if state_found else state_from_scratch(state_path)
    if state is None:
        gone = f"{state_path} does not exist; nothing to tear down (already down)"
        log(f"luksbench testbox stack-down: {gone}")
        record = {"state": str(state_path), "started": started, "ended": utc_now()}
        record.update(already_down=True, state_found=False, actions=[], checks={}, ok=True)
        if record_path:
            write_json_atomic(Path(record_path), record)
        return record
    stacks = [state["stacks"][n] for n in reversed(state.get("order") or list(state["stacks"]))]
    stacks += layer_entries(state)  # the layers under a Ceph cluster's OSDs
    actions, errors = [], []
    _tear_down(state, stacks, actions, errors)
    checks, details = _verify_clean(state, stacks)
    ok = all(checks.values()) and not errors
    if ok and not keep_lock and lock.release(state_path):
        actions.append("released the test box lock")
    record = {
        "state": str(state_path),
        "state_found": state_found,
        "run": state["run"],
        "host": state.get("host"),
        "backend": state.get("backend"),
        "started": started,
        "ended": utc_now(),
        "already_down": not actions,
        "actions": actions,
        "errors": errors,
        "checks": checks,
        "leftovers": details,
        "ok": ok,
    }
    _record_teardown(state_path, record, record_path)
    return record


def state_from_scratch(state_path: Path) -> dict | None:
    """A STATE for what the scratch folder beside a lost ``state_path`` shows was built, named as
    stack-up names it: FUSE exports (their daemons are found by the paths they serve), backing
    files and key directories. None when it shows nothing."""
    scratch = Path(state_path).parent.resolve()
    built = [*scratch.glob("luksbench-*.fuse"), *scratch.glob("luksbench-*.img")]
    names = sorted({p.name.removeprefix("luksbench-").rpartition(".")[0] for p in built})
    key_dirs = sorted(str(p) for p in scratch.glob(".luksbench-keys-*") if p.is_dir())
    ceph_dir = scratch / "ceph"
    if not names and not key_dirs and not ceph_dir.exists():
        return None
    log(f"luksbench testbox stack-down: {state_path} is missing; tearing down what {scratch} shows")
    stacks = {
        name: {
            "stack": name,
            "device": None,
            "device_type": None,
            "mountpoint": str(scratch / f"luksbench-{name}.fuse"),
            "backing_file": str(scratch / f"luksbench-{name}.img"),
            "daemon": None,
            "key_file": None,
        }
        for name in names
    }
    state = {"run": scratch.parent.name, "host": scratch.name, "backend": "userspace"}
    state.update(order=names, stacks=stacks, objects=[], key_dirs=key_dirs, runtime_dir=None)
    state["scratch_dir"] = str(scratch)
    return state


def _tear_down(state: dict, stacks: list[dict], actions: list[str], errors: list[str]) -> None:
    """Stop fio, then undo every stack newest first: daemons and mounts (userspace), the undo log
    (kernel), keys, backing files, the runtime directory. Keeps going after an error."""
    _kill_fio([e.get("device") for e in stacks], actions)
    # A Ceph cluster (its daemons and clients) before the layers its OSDs sit on.
    tear_down_ceph(state, actions, errors)
    # Userspace backend (and states written before the undo log): per-stack daemons and mounts.
    for entry in stacks:
        try:
            _tear_down_entry(entry, actions, errors)
        except Exception as exc:  # keep going: tear down as much as possible
            errors.append(f"{entry['stack']}: {exc}")
    # Kernel backend: every recorded object, newest first.
    kernel.undo(state.get("objects") or [], actions, errors)
    for key_dir in [state.get("key_dir"), *state.get("key_dirs", [])]:
        try:
            _shred_keys(key_dir, actions)
        except OSError as exc:
            errors.append(f"key directory: {exc}")
    for entry in stacks:
        try:
            _remove_file(entry.get("backing_file"), f"{entry['stack']} backing file", actions)
        except OSError as exc:
            errors.append(f"{entry['stack']}: backing file: {exc}")
    rt = state.get("runtime_dir")
    if rt and os.path.isdir(rt):
        shutil.rmtree(rt, ignore_errors=True)
        actions.append(f"removed runtime directory {rt}")


def _fuse_mountpoint(entry: dict) -> str | None:
    """The stack's FUSE export file (userspace backend), if it has one."""
    return entry.get("mountpoint") if entry.get("device_type") in (None, "file") else None


def _tear_down_entry(entry: dict, actions: list[str], errors: list[str]) -> None:
    name = entry["stack"]
    if entry.get("daemon") is not None or _fuse_mountpoint(entry):
        userspace.stop_daemon(entry, actions)
        userspace.unmount(entry["mountpoint"], name, actions)
        if not safety.is_mounted(entry["mountpoint"]):
            _remove_file(entry["mountpoint"], f"{name} FUSE mountpoint file", actions)
    if entry.get("mapper_name"):  # undo leaves a name without our prefix alone
        kernel.undo([{"type": "crypt", "name": entry["mapper_name"]}], actions, errors)
    if entry.get("backing_file"):
        kernel.undo([{"type": "loop", "backing": entry["backing_file"]}], actions, errors)


def _our_processes(stacks: list[dict], objects: list[dict]) -> list[int]:
    """Daemons and fio processes still running on anything of ours."""
    markers = [e.get("mountpoint") for e in stacks] + [e.get("backing_file") for e in stacks]
    markers += [o.get("backing") for o in objects if o["type"] == "loop"]
    daemons = [(e.get("daemon") or {}).get("pid") for e in stacks]
    return find_our_processes(markers) + [pid for pid in daemons if runs_with(pid, markers)]


def _verify_clean(state: dict, stacks: list[dict]) -> tuple[dict, dict]:
    """(checks, leftovers): nothing of this run is left."""
    objects = state.get("objects") or []
    mounts = set(safety.mountpoints())
    ours_mounts = [m for e in stacks if (m := _fuse_mountpoint(e)) and m in mounts]
    procs = _our_processes(stacks, objects)
    left = kernel.leftovers(objects)
    backing = [e["backing_file"] for e in stacks if e.get("backing_file")]
    loops = sorted(set(safety.loop_devices_backed_by(backing)) | set(left["loop_devices"]))
    # Only mappings this run made count: a foreign device with a similar name is not ours.
    ours = {o["name"] for o in objects if o["type"] in ("crypt", "dm")}
    ours |= {e["mapper_name"] for e in stacks if e.get("mapper_name")}
    prefix = f"{safety.MAPPER_PREFIX}{state['run']}-"
    mappers = [n for n in safety.mapper_names_with_prefix(prefix) if n in ours]
    mine = [(e.get("backing_file"), e.get("key_file"), _fuse_mountpoint(e)) for e in stacks]
    files_left = [p for paths in mine for p in paths if p and os.path.lexists(p)] + left["files"]
    ceph_left = ceph_leftovers(state)
    checks = {
        "no_mounts": not ours_mounts and not left["mounts"],
        "no_processes": not procs,
        "no_loop_devices": not loops,
        "no_mapper_devices": not mappers,
        "no_md_devices": not left["md_devices"],
        "no_key_dir": not any(
            d and os.path.exists(d) for d in [state.get("key_dir"), *state.get("key_dirs", [])]
        ),
        "no_files_left": not files_left,
        "no_ceph": not any(ceph_left.values()),
    }
    details = {
        "mounts": ours_mounts + left["mounts"],
        "pids": sorted(set(procs)),
        "loop_devices": loops,
        "mapper_devices": mappers,
        "md_devices": left["md_devices"],
        "files": files_left,
        "ceph": ceph_left,
    }
    return checks, details


def _record_teardown(state_path: Path, record: dict, record_path) -> None:
    """Write and log the record; STATE goes only when everything is down."""
    if record_path:
        write_json_atomic(Path(record_path), record)
    actions = record["actions"]
    for a in actions:
        log(f"  {a}")
    if record["ok"]:
        # The description beside STATE (the workflow's sign that the stacks are up) goes first.
        state_path.with_name(DESCRIPTION_NAME).unlink(missing_ok=True)
        state_path.unlink(missing_ok=True)
        done = "all stacks down" if actions else "already down; nothing to do"
        log(f"luksbench testbox stack-down: {done}; checks passed")
    else:
        failed = [k for k, v in record["checks"].items() if not v]
        log(
            f"luksbench testbox stack-down: NOT clean: errors {record['errors']}, failed checks "
            f"{failed}, leftovers {record['leftovers']}; keeping {state_path}"
        )
