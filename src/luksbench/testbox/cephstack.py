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

from luksbench.testbox import ceph, cephdown, cephexisting, safety
from luksbench.testbox.cephrun import check_encryption
from luksbench.testbox.planbuild import MIB, first_layer
from luksbench.testbox.sysutil import TestboxError, log, write_json_atomic


def osd_specs(entries: dict, groups: dict[str, list[str]]) -> list[dict]:
    """OSD specs over the devices of the named STATE entries, in device class ``group``."""
    specs = []
    for group, names in groups.items():
        for name in names:
            entry = entries.get(name)
            if entry is None or not entry.get("device"):
                raise TestboxError(f"OSD group {group}: stack {name!r} has no device in STATE")
            # userspace backend: the FUSE file's backing file holds the LUKS header, if any;
            # BlueStore reads the FUSE file coherently only through a loop device
            fuse = bool(entry.get("daemon"))
            backing = entry.get("backing_file") if fuse else None
            spec = {"block": entry["device"], "group": group, "backing_file": backing}
            specs.append({**spec, "loop": fuse})
    return specs


def build_cluster(
    state: dict,
    state_path: Path,
    specs: list[dict],
    *,
    image_mib: int,
    daemon_modes: str,
) -> dict:
    """Build the cluster over ``specs``, its daemons accepting the messenger modes
    ``daemon_modes``; STATE names its folder (and the files its OSDs will sit on through loop
    devices) before anything is started."""
    if state.get("ceph"):
        raise TestboxError(f"{state_path}: a Ceph cluster is already recorded: {state['ceph']}")
    top = ceph.cluster_dir(state["scratch_dir"])
    groups = sorted({s["group"] for s in specs})
    loop_over = [spec["block"] for spec in specs if spec["loop"]]
    state["ceph"] = {"dir": str(top), "groups": groups, "loop_over": loop_over}
    write_json_atomic(state_path, state, mode=0o600)
    cluster = ceph.cluster_up(
        state["scratch_dir"], specs, image_mib=image_mib, daemon_modes=daemon_modes
    )
    state["ceph"].update(fsid=cluster["fsid"], conf=cluster["conf"])
    state["ceph"]["up_seconds"] = cluster["up_seconds"]
    write_json_atomic(state_path, state, mode=0o600)
    return cluster


def ceph_up(
    state_path: str | Path,
    groups: dict[str, list[str]],
    *,
    image_mib: int,
    daemon_modes: str,
) -> dict:
    """A cluster over stacks that are up (``groups``: device class -> stack names, one pool and
    image each), for a run whose plan names no Ceph arms."""
    state_path = Path(state_path)
    state = json.loads(state_path.read_text())
    if not state.get("complete"):
        raise TestboxError(f"{state_path}: stack-up did not complete; no cluster built on it")
    specs = osd_specs(state["stacks"], groups)
    return build_cluster(state, state_path, specs, image_mib=image_mib, daemon_modes=daemon_modes)


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
        cluster = cephdown.load_cluster(top)
        if cluster and cluster.get("existing"):  # only its images go; no daemon is touched
            result = cephexisting.existing_down(cluster)
        else:
            result = cephdown.cluster_down(top)
        actions += result["actions"]
        errors += result["errors"]
    # loop devices the cluster's record had no time to name (a builder killed right after losetup)
    cephdown.detach_loops((state.get("ceph") or {}).get("loop_over") or [], actions, errors)


def ceph_leftovers(state: dict) -> dict:
    left: dict[str, list] = {"pids": [], "sockets": [], "loop_devices": [], "folder": []}
    for top in ceph_folders(state):
        cluster = cephdown.load_cluster(top)
        if cluster and cluster.get("existing"):
            left["images"] = cephexisting.existing_leftovers(cluster)["images"]
            left["folder"].append(top)
            continue
        for key, values in cephdown.cluster_leftovers(top).items():
            left[key] += values
    loops = safety.loop_devices_backed_by((state.get("ceph") or {}).get("loop_over") or [])
    left["loop_devices"] = sorted(set(left["loop_devices"]) | set(loops))
    return left


def is_ceph_arm(stack) -> bool:
    """An ``rbd`` stack over ``osd`` layers: its cluster is built by the run."""
    below = stack.get("over") or stack.get("members") if isinstance(stack, dict) else None
    return bool(below) and stack.get("kind") == "rbd"


def _osd_layers(arm: dict) -> list[dict]:
    return [arm["over"]] if "over" in arm else list(arm["members"])


def _below_osd(osd: dict) -> dict:
    """The layer an OSD sits on, as the backends build a stack (a device name: a raw layer);
    never optional: the arms over it need it."""
    under = osd["over"]
    layer = {"kind": "raw", "device": under} if isinstance(under, str) else under
    return {**layer, "optional": False}


def split_plan(plan: dict) -> tuple[dict, dict | None]:
    """(the plan the backend builds, the Ceph part). Each distinct set of ``osd`` layers becomes
    one OSD group (arms over the same OSD layers share them: crc and secure arms measure the
    same OSDs); the layers under the OSDs become stacks of their own for the backend, named
    ``<group>o<i>``; the arms themselves are added back once the cluster is up."""
    arms = {n: s for n, s in plan["stacks"].items() if is_ceph_arm(s)}
    existing = {n: s for n, s in plan["stacks"].items() if cephexisting.is_existing_arm(s)}
    if existing:
        return _split_existing(plan, existing, arms)
    if not arms:
        return plan, None
    problems = []
    for name, arm in arms.items():
        problems += ceph.check_ceph_layer(arm, f"stacks.{name}")
        for i, osd in enumerate(_osd_layers(arm)):
            problems += ceph.check_ceph_layer(osd, f"stacks.{name}.osd[{i}]")
    if problems:
        raise TestboxError("; ".join(problems))
    for name in arms:
        safety.check_name(name, "stack")
    groups: dict[str, dict] = {}
    for name, arm in arms.items():
        osds = _osd_layers(arm)
        key = json.dumps(osds, sort_keys=True)
        group = groups.setdefault(key, {"name": f"osd{len(groups)}", "arms": [], "layers": {}})
        group["arms"].append(name)
        encrypted = [first_layer(_below_osd(o), "luks") is not None for o in osds]
        if len(set(encrypted)) > 1:
            raise TestboxError(f"stacks.{name}: its OSDs are partly on luks layers: one or all")
        group["encrypted"] = encrypted[0]
        group["layers"] = {f"{group['name']}o{i}": _below_osd(o) for i, o in enumerate(osds)}
    helpers = {h: lay for g in groups.values() for h, lay in g["layers"].items()}
    clash = sorted(set(helpers) & set(plan["stacks"]))
    if clash:
        raise TestboxError(f"stack names {clash} are taken by the layers under the OSDs")
    others = {n: s for n, s in plan["stacks"].items() if n not in arms}
    base = plan["baseline"] if plan["baseline"] in others else next(iter(helpers))
    backend_plan = {**plan, "stacks": {**others, **helpers}, "baseline": base}
    ceph_part = {"plan": plan, "groups": list(groups.values()), "arms": arms}
    return backend_plan, ceph_part


def _split_existing(plan: dict, existing: dict, arms: dict) -> tuple[dict, dict]:
    """The backend builds the stacks beside the arms on an existing cluster (none, often)."""
    problems = [p for n, s in existing.items() for p in check_existing(s, f"stacks.{n}")]
    if arms:
        problems.append(
            f"stacks {sorted(existing)} use an existing cluster ('conf') and {sorted(arms)} the "
            "cluster this run builds: measure them in separate runs"
        )
    if problems:
        raise TestboxError("; ".join(problems))
    others = {n: s for n, s in plan["stacks"].items() if n not in existing}
    base = plan["baseline"] if plan["baseline"] in others else next(iter(others), None)
    return {**plan, "stacks": others, "baseline": base}, {"plan": plan, "existing": existing}


def check_existing(arm: dict, where: str) -> list[str]:
    return cephexisting.check_existing_layer(arm, where) + (
        [] if ceph.client_mode(arm) in ceph.MODES else [f"{where}.mode: not one of {ceph.MODES}"]
    )


def attach_existing(ceph_part: dict, state: dict, state_path: Path, described: dict) -> dict:
    """After the backend built the other stacks: the arms' images on the existing cluster (its
    record named in STATE before any is created), and the arms' STATE entries."""
    plan, arms = ceph_part["plan"], ceph_part["existing"]
    top = Path(state["scratch_dir"]) / cephexisting.EXISTING_DIR_NAME
    state["ceph"] = {"dir": str(top), "existing": True, "groups": [], "loop_over": []}
    write_json_atomic(state_path, state, mode=0o600)
    image_mib = _image_mib({"arms": arms}, plan)
    cluster = cephexisting.existing_up(state["scratch_dir"], arms, image_mib)
    state["ceph"].update(fsid=cluster["fsid"], conf=cluster["conf"])
    for name, arm in arms.items():
        pool = next(p for p in cluster["pools"] if p["group"] == f"{arm['pool']}/{arm['image']}")
        ceph_entry = {"group": pool["group"], "mode": ceph.client_mode(arm), "encrypted": None}
        ceph_entry.update(pool=pool["name"], image=pool["image"], cluster_dir=cluster["dir"])
        ceph_entry["client"] = cluster["client"]
        entry = {"stack": name, "kind": "rbd", "device": None, "device_type": "rbd"}
        entry.update(size_bytes=image_mib * MIB, mountpoint=None, ceph=ceph_entry)
        state["stacks"][name] = entry
        described[name] = _describe_arm(state, cluster, entry, cluster["osd_reports"])
        described[name]["cluster"] = {"fsid": cluster["fsid"], "existing": True}
        described[name]["conf"] = cluster["conf"]
    # the arms join the run's order only now: teardown walks the order's STATE entries
    state["order"] = [plan["baseline"], *[s for s in plan["stacks"] if s != plan["baseline"]]]
    write_json_atomic(state_path, state, mode=0o600)
    log(f"  ceph: {len(arms)} RBD arm(s) on the existing cluster of {cluster['conf']}")
    return described


def attach_cluster(ceph_part: dict, state: dict, state_path: Path, described: dict) -> dict:
    """After the backend built the layers under the OSDs: those layers leave the run's stacks
    (STATE keeps them under ``ceph_layers`` for teardown), the cluster is built on them and the
    arms take their place. The arms' descriptions."""
    if ceph_part.get("existing"):
        return attach_existing(ceph_part, state, state_path, described)
    plan, groups = ceph_part["plan"], ceph_part["groups"]
    layers = {h: state["stacks"].pop(h) for g in groups for h in g["layers"]}
    state["ceph_layers"] = layers
    under = {h: described.pop(h) for h in layers}
    state["order"] = [plan["baseline"], *[s for s in plan["stacks"] if s != plan["baseline"]]]
    write_json_atomic(state_path, state, mode=0o600)
    specs = osd_specs(layers, {g["name"]: list(g["layers"]) for g in groups})
    image_mib = _image_mib(ceph_part, plan)
    modes = plan["ceph"]["daemon_modes"]
    cluster = build_cluster(state, state_path, specs, image_mib=image_mib, daemon_modes=modes)
    for g in groups:  # the devices must be what the plan says before anything is measured
        osd_devices = check_encryption(cluster, g["name"], g["encrypted"])
        pool = next(p for p in cluster["pools"] if p["group"] == g["name"])
        for arm in g["arms"]:
            mode = ceph.client_mode(ceph_part["arms"][arm])
            ceph_entry = {"group": g["name"], "mode": mode, "encrypted": g["encrypted"]}
            ceph_entry.update(pool=pool["name"], image=pool["image"], cluster_dir=cluster["dir"])
            entry = {"stack": arm, "kind": "rbd", "device": None, "device_type": "rbd"}
            entry.update(size_bytes=image_mib * MIB, mountpoint=None, ceph=ceph_entry)
            state["stacks"][arm] = entry
            described[arm] = _describe_arm(state, cluster, entry, osd_devices)
            described[arm]["osd_layers"] = {h: under[h] for h in g["layers"]}
    write_json_atomic(state_path, state, mode=0o600)
    log(f"  ceph: {len(ceph_part['arms'])} RBD arm(s) over {len(groups)} OSD group(s)")
    return described


def _describe_arm(state: dict, cluster: dict, entry: dict, osd_devices: list[dict]) -> dict:
    arm = entry["ceph"]
    return {
        "kind": "rbd",
        "backend": state["backend"],
        "device": None,
        "device_type": "rbd",
        "device_size_bytes": entry["size_bytes"],
        "messenger_mode": arm["mode"],
        "daemon_modes": cluster["daemon_modes"],
        "pool": arm["pool"],
        "image": arm["image"],
        "osd_encrypted": arm["encrypted"],
        "osd_devices": osd_devices,
        "cluster": {
            k: cluster.get(k) for k in ("fsid", "mon_seconds", "osd_seconds", "up_seconds")
        },
        "notes": [],
    }


def _image_mib(ceph_part: dict, plan: dict) -> int:
    """The arms' image size: the smallest asked for, else half of a device (BlueStore keeps its
    own metadata on the same device)."""
    asked = [int(a["image_mib"]) for a in ceph_part["arms"].values() if a.get("image_mib")]
    return min(asked) if asked else max(int(plan["device_size_mib"]) // 2, 64)


def layer_entries(state: dict) -> list[dict]:
    """STATE entries of the layers under the OSDs (torn down like stacks, after the cluster)."""
    return list((state.get("ceph_layers") or {}).values())
