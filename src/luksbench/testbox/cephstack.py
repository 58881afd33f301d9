"""A run's Ceph cluster over its stacks: OSDs on the devices stack-up built (a ``luks`` stack's
device puts the OSD on LUKS, a ``plain`` one on a plain device), recorded in the run's STATE
before it is built so stack-down (and the recovery after a killed workflow) removes it first,
under the same test-box lock. Also the checks of the ``osd`` and ``rbd`` layer kinds.
Standard library only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from luksbench.testbox import ceph, cephdown, safety
from luksbench.testbox.sysutil import TestboxError, write_json_atomic

# The keys each Ceph layer kind reads (for plan.KIND_KEYS).
CEPH_KIND_KEYS = {
    "osd": {"over"},
    "rbd": {"over", "members", "mode", "image_mib", "pool", "image", "client", "secure_mode"},
}


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
        if layer.get("mode", "crc") not in ceph.MODES:
            problems.append(f"{where}.mode: {layer.get('mode')!r} is not one of {ceph.MODES}")
    return problems


def osd_specs(state: dict, groups: dict[str, list[str]]) -> list[dict]:
    """OSD specs over the named stacks' devices, in device class ``group``."""
    specs = []
    for group, names in groups.items():
        for name in names:
            entry = state["stacks"].get(name)
            if entry is None or not entry.get("device"):
                raise TestboxError(f"OSD group {group}: stack {name!r} has no device in STATE")
            # userspace backend: the FUSE file's backing file holds the LUKS header, if any;
            # BlueStore reads the FUSE file coherently only through a loop device
            fuse = bool(entry.get("daemon"))
            backing = entry.get("backing_file") if fuse else None
            spec = {"block": entry["device"], "group": group, "backing_file": backing}
            specs.append({**spec, "loop": fuse})
    return specs


def ceph_up(
    state_path: str | Path,
    groups: dict[str, list[str]],
    *,
    image_mib: int,
    daemon_modes: str = ceph.DAEMON_MODES,
) -> dict:
    """Build the run's cluster over its stacks (``groups``: device class -> stack names, one
    pool and image each); STATE names the cluster's folder before anything is started."""
    state_path = Path(state_path)
    state = json.loads(state_path.read_text())
    if not state.get("complete"):
        raise TestboxError(f"{state_path}: stack-up did not complete; no cluster built on it")
    if state.get("ceph"):
        raise TestboxError(f"{state_path}: a Ceph cluster is already recorded: {state['ceph']}")
    specs = osd_specs(state, groups)
    top = ceph.cluster_dir(state["scratch_dir"])
    loop_over = [spec["block"] for spec in specs if spec["loop"]]
    state["ceph"] = {"dir": str(top), "groups": groups, "loop_over": loop_over}
    write_json_atomic(state_path, state, mode=0o600)
    cluster = ceph.cluster_up(
        state["scratch_dir"], specs, image_mib=image_mib, daemon_modes=daemon_modes
    )
    state["ceph"].update(
        fsid=cluster["fsid"], conf=cluster["conf"], up_seconds=cluster["up_seconds"]
    )
    write_json_atomic(state_path, state, mode=0o600)
    return cluster


def ceph_folders(state: dict) -> list[str]:
    """Cluster folders of this run: the one STATE records and one found in its scratch folder
    (a build killed before STATE was written)."""
    found = [(state.get("ceph") or {}).get("dir")]
    if state.get("scratch_dir"):
        found.append(str(ceph.cluster_dir(state["scratch_dir"])))
    return [d for d in dict.fromkeys(found) if d and (os.path.exists(d) or d == found[0])]


def tear_down_ceph(state: dict, actions: list[str], errors: list[str]) -> None:
    """Stop the run's cluster before the layers under its OSDs go."""
    for top in ceph_folders(state):
        result = cephdown.cluster_down(top)
        actions += result["actions"]
        errors += result["errors"]
    # loop devices the cluster's record had no time to name (a builder killed right after losetup)
    cephdown.detach_loops((state.get("ceph") or {}).get("loop_over") or [], actions, errors)


def ceph_leftovers(state: dict) -> dict:
    left: dict[str, list] = {"pids": [], "sockets": [], "loop_devices": [], "folder": []}
    for top in ceph_folders(state):
        for key, values in cephdown.cluster_leftovers(top).items():
            left[key] += values
    loops = safety.loop_devices_backed_by((state.get("ceph") or {}).get("loop_over") or [])
    left["loop_devices"] = sorted(set(left["loop_devices"]) | set(loops))
    return left
