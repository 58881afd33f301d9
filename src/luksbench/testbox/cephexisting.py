"""RBD arms on a Ceph cluster luksbench does not build (an ``rbd`` layer with ``conf``): the arms'
images are created in the given pool at stack-up and removed at stack-down, and nothing else of
the cluster is touched (no daemon started or stopped, no pool, rule or setting created). Each run
is verified as on the run's own cluster: the client's messenger mode through ``CEPH_ARGS``, read
back from a probe client's connections. The OSDs' encryption cannot be chosen here (they are
someone else's): each OSD's device is recorded as the cluster's OSD metadata reports it.

An image that already exists under an arm's name is refused, never reused or deleted; an image
is recorded (``<scratch>/ceph-existing/cluster.json``) only once its ``rbd create`` succeeded, so
teardown removes only images this run created. Standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from luksbench.testbox.cephdown import RECORD_NAME
from luksbench.testbox.sysutil import TestboxError, log, run_tool, utc_now, write_json_atomic

EXISTING_DIR_NAME = "ceph-existing"
IMAGE_REMOVE_TIMEOUT_S = 90  # a killed client's watch lingers up to 30 s
# What `ceph osd metadata` says of an OSD's device (the encryption is not among its keys).
OSD_METADATA_KEYS = ("bluestore_bdev_dev_node", "bluestore_bdev_type", "devices", "hostname")


def is_existing_arm(stack) -> bool:
    """An ``rbd`` layer naming a cluster's ``conf``: an arm on a cluster luksbench does not build."""
    return isinstance(stack, dict) and stack.get("kind") == "rbd" and bool(stack.get("conf"))


def check_existing_layer(layer: dict, where: str) -> list[str]:
    """Problems with an arm on an existing cluster (empty: fine)."""
    if not is_existing_arm(layer) or not ("over" in layer or "members" in layer):
        return []
    return [
        f"{where}.conf: an arm on an existing cluster sits on no osd layer: luksbench builds no "
        "OSD on a cluster it does not build, so OSD-on-LUKS (or -on-plain) needs the cluster "
        "built here (drop 'conf'); on an existing cluster each OSD's device is recorded as the "
        "cluster reports it"
    ]


def client_args(cluster: dict) -> str:
    """CEPH_ARGS words every client of the existing cluster needs: its keyring and client name."""
    words = [f"--id={cluster['client']}"]
    if cluster.get("keyring"):
        words.append(f"--keyring={cluster['keyring']}")
    return " ".join(words)


def _cli(cluster: dict, tool: str, *args: str, timeout: float = 60) -> str:
    argv = [tool, "-c", cluster["conf"], f"--id={cluster['client']}"]
    if cluster.get("keyring"):
        argv.append(f"--keyring={cluster['keyring']}")
    if tool == "ceph":
        argv += ["--connect-timeout", "20"]
    return run_tool([*argv, *args], f"{tool} on the cluster of {cluster['conf']}", timeout).stdout


def _save(cluster: dict) -> None:
    write_json_atomic(Path(cluster["dir"]) / RECORD_NAME, cluster, mode=0o600)


def _images(cluster: dict, pool: str) -> list[str]:
    return json.loads(_cli(cluster, "rbd", "ls", "-p", pool, "--format", "json") or "[]")


def _osd_reports(cluster: dict) -> list[dict]:
    """Each OSD's device as the cluster reports it; the encryption cannot be read from here."""
    reports = []
    for meta in json.loads(_cli(cluster, "ceph", "osd", "metadata", "-f", "json") or "[]"):
        report = {"osd": meta.get("id"), "encryption": None, "encryption_known": False}
        report.update({k: meta.get(k) for k in OSD_METADATA_KEYS})
        reports.append(report)
    return reports


def _create_image(cluster: dict, pool: str, image: str, image_mib: int, where: str) -> dict:
    """A new prefilled image; refused when the pool is missing or the image exists."""
    pools = json.loads(_cli(cluster, "ceph", "osd", "pool", "ls", "-f", "json") or "[]")
    if pool not in pools:
        raise TestboxError(
            f"{where}.pool: pool {pool!r} does not exist on the cluster of {cluster['conf']} "
            "(luksbench creates images only, in a pool you made)"
        )
    if image in _images(cluster, pool):
        raise TestboxError(
            f"{where}.image: {pool}/{image} already exists on the cluster of {cluster['conf']}: "
            "refused (an existing image is never reused or deleted); choose another image name"
        )
    _cli(cluster, "rbd", "-p", pool, "create", "--size", f"{image_mib}M", image)
    made = {"name": pool, "group": f"{pool}/{image}", "image": image, "image_mib": image_mib}
    cluster["pools"].append(made)  # recorded only now: teardown removes only what we created
    _save(cluster)
    t0 = time.monotonic()
    bench = ["bench", "--io-type", "write", "--io-size", "4M", "--io-pattern", "seq"]
    _cli(cluster, "rbd", "-p", pool, *bench, "--io-total", f"{image_mib}M", image, timeout=1800)
    made["prefill_seconds"] = round(time.monotonic() - t0, 2)
    _save(cluster)
    return made


def existing_up(scratch: str | Path, arms: dict, image_mib: int) -> dict:
    """The record of the existing cluster the ``arms`` name, their images created and prefilled.
    A failure removes the images created so far."""
    confs = {(a["conf"], a["keyring"], a["client"]) for a in arms.values()}
    if len(confs) > 1:
        raise TestboxError(f"stacks {sorted(arms)}: every arm names the same conf, keyring, client")
    (conf, keyring, client) = confs.pop()
    for name, path in (("conf", conf), ("keyring", keyring)):
        if path and not os.path.isfile(path):
            arm = next(n for n, a in arms.items() if a.get(name) == path)
            raise TestboxError(f"stacks.{arm}.{name}: {path} is not a file")
    top = Path(scratch) / EXISTING_DIR_NAME
    if top.exists():
        raise TestboxError(f"{top} exists: an earlier run's images may be left; stack-down first")
    top.mkdir(mode=0o700, parents=True)
    cluster = {"dir": str(top), "conf": os.path.abspath(conf), "existing": True}
    cluster.update(keyring=keyring and os.path.abspath(keyring), client=client, created=utc_now())
    cluster.update(daemons=[], osds=[], pools=[], daemon_modes=None)
    _save(cluster)
    try:
        cluster["fsid"] = _cli(cluster, "ceph", "fsid").strip()
        cluster["osd_reports"] = _osd_reports(cluster)
        for (pool, image), name in {(a["pool"], a["image"]): n for n, a in arms.items()}.items():
            _create_image(cluster, pool, image, image_mib, f"stacks.{name}")
    except BaseException:
        existing_down(cluster)
        raise
    cluster["complete"] = True
    _save(cluster)
    log(f"  ceph: {len(cluster['pools'])} image(s) on the existing cluster {cluster['fsid'][:8]}")
    return cluster


def _remove_image(cluster: dict, made: dict) -> str | None:
    """Remove one image this run created (retrying while a killed client's watch lingers); the
    error, if any."""
    deadline = time.monotonic() + IMAGE_REMOVE_TIMEOUT_S
    while True:
        try:
            if made["image"] not in _images(cluster, made["name"]):
                return None
            _cli(cluster, "rbd", "-p", made["name"], "rm", "--no-progress", made["image"])
            return None
        except TestboxError as exc:
            if time.monotonic() > deadline:
                return str(exc)
        time.sleep(2)


def existing_down(cluster: dict) -> dict:
    """Remove the images this run created on the existing cluster, then its record's folder;
    no daemon is touched."""
    actions, errors = [], []
    for made in cluster.get("pools", []):
        error = _remove_image(cluster, made)
        if error:
            errors.append(error)
        else:
            actions.append(f"removed RBD image {made['name']}/{made['image']} (existing cluster)")
    left = existing_leftovers(cluster)
    if any(left.values()):
        errors.append(f"Ceph leftovers on the existing cluster: {left}")
    if not errors:
        shutil.rmtree(cluster["dir"], ignore_errors=True)
        actions.append(f"removed {cluster['dir']}")
    return {"actions": actions, "errors": errors, "leftovers": left}


def existing_leftovers(cluster: dict) -> dict:
    """Images of this run still on the existing cluster."""
    images = []
    for made in cluster.get("pools", []):
        try:
            if made["image"] in _images(cluster, made["name"]):
                images.append(f"{made['name']}/{made['image']}")
        except TestboxError as exc:
            images.append(f"{made['name']}/{made['image']} (unknown: {exc})")
    return {"images": images}
