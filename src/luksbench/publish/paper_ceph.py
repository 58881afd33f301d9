"""The paper's Ceph section: on-disk (LUKS under the OSDs) and on-the-wire (msgr2 ``secure``)
encryption side by side, the CPU per I/O of the client and the OSDs, and the Ceph Reef study's
published numbers beside the cells of the same shape.

Read from processed tables only: ``ceph`` (ingest: which arm is which, verified per run),
``loss`` (throughput and latency of each arm against the reference), ``ceph_loss`` and
``ceph_arms`` (the loss stage's CPU rows and per-arm means) and ``ceph_reef`` (the published rows
the loss stage matched from ``data/reference``). No statistic is computed here.
"""

from __future__ import annotations

import pandas as pd

from luksbench.publish.paper_sentences import intervals_cover
from luksbench.publish.text import cell_words, decision_kind, effect_ci, fmt_num, missing

#: the encryption kinds of an arm against the reference (crc, plain OSDs): (on_disk, on_wire)
KINDS = {(True, False): "on_disk", (False, True): "on_wire", (True, True): "both"}
KIND_WORDS = {
    "on_disk": "on-disk (LUKS OSD)",
    "on_wire": "on-the-wire (msgr2 secure)",
    "both": "both",
}
#: the loss table's metrics the side-by-side table shows
#: (IOPS is bandwidth over the cell's fixed block size: the same test, not shown twice)
SIDE_METRICS = {"bw_bytes": "bandwidth", "clat_p99_ns": "p99 latency"}
CPU_SIDES = {"client": "client (fio + librbd)", "osd": "OSD daemons"}


def arm_roles(ceph: pd.DataFrame) -> tuple[str | None, dict[str, str]]:
    """(the reference arm: crc client, plain OSDs; {kind: arm}) from the ingested runs' verified
    mode and OSD encryption (one arm per kind: the first by name)."""
    if ceph.empty:
        return None, {}
    runs = ceph.drop_duplicates("stack").sort_values("stack")
    reference, roles = None, {}
    for r in runs.to_dict("records"):
        key = (bool(r["osd_encrypted"]), str(r["messenger_mode_seen"]) == "secure")
        if key == (False, False) and str(r["messenger_mode_seen"]) == "crc":
            reference = reference or str(r["stack"])
        elif key in KINDS:
            roles.setdefault(KINDS[key], str(r["stack"]))
    return reference, roles


def _row_text(row) -> str:
    if row is None:
        return "not measured"
    return f"{effect_ci(row)} {decision_kind(row['decision'])}"


def _find(table: pd.DataFrame, reference: str, arm: str, workload: str, metric: str, host: str):
    m = table[
        (table["baseline"] == reference)
        & (table["variant"] == arm)
        & (table["workload"] == workload)
        & (table["metric"] == metric)
        & (table["host"] == host)
    ]
    return m.iloc[0] if len(m) else None


def _cells(ceph_rows: pd.DataFrame) -> list[dict]:
    """The loss rows' cells (host, workload, rw, bs, iodepth, direction), in table order."""
    keys = ["host", "workload", "rw", "bs_bytes", "iodepth", "direction"]
    return ceph_rows.drop_duplicates(keys)[keys].to_dict("records")


def side_by_side(loss, reference, roles, multi_host) -> list[dict]:
    """Per cell and metric: each kind's effect against the reference, interval, decision."""
    rows = loss[(loss["baseline"] == reference) & loss["variant"].isin(roles.values())]
    rows = rows[rows["metric"].isin(SIDE_METRICS)]
    out = []
    for cell in _cells(rows):
        for metric, name in SIDE_METRICS.items():
            found = {
                kind: _find(rows, reference, arm, cell["workload"], metric, cell["host"])
                for kind, arm in roles.items()
            }
            if all(v is None for v in found.values()):
                continue
            texts = {kind: _row_text(found.get(kind)) for kind in KIND_WORDS}
            out.append({"workload": cell_words(cell, multi_host), "metric": name, **texts})
    return out


def _arm_mean(arms: pd.DataFrame, stack: str, cell: dict, metric: str) -> str:
    m = arms[
        (arms["stack"] == stack)
        & (arms["host"] == cell["host"])
        & (arms["rw"] == cell["rw"])
        & (arms["bs_bytes"] == cell["bs_bytes"])
        & (arms["iodepth"] == cell["iodepth"])
        & (arms["direction"] == cell["direction"])
        & (arms["metric"] == metric)
    ]
    if m.empty or missing(m["mean"].iloc[0]):
        return "n/a"
    mean, half = float(m["mean"].iloc[0]), m["ci_half"].iloc[0]
    return fmt_num(mean, 1) + ("" if missing(half) else f" ± {fmt_num(half, 1)}")


def cpu_rows(ceph_loss, arms, reference, roles, multi_host) -> list[dict]:
    """Per cell and side (client, OSD): the reference's mean CPU per I/O (µs, ± its half-width)
    and each kind's increase against it with interval and decision."""
    out = []
    for cell in _cells(ceph_loss):
        for side, words in CPU_SIDES.items():
            metric = f"{side}_cpu_us_per_io"
            found = {
                kind: _find(ceph_loss, reference, arm, cell["workload"], metric, cell["host"])
                for kind, arm in roles.items()
            }
            if all(v is None for v in found.values()):
                continue
            means = {kind: _arm_mean(arms, arm, cell, metric) for kind, arm in roles.items()}
            out.append(
                {
                    "workload": cell_words(cell, multi_host),
                    "side": words,
                    "reference": _arm_mean(arms, reference, cell, metric),
                    **{k: f"{means.get(k, 'n/a')}: {_row_text(found.get(k))}" for k in KIND_WORDS},
                }
            )
    return out


def reef_rows(reef, loss, reference, roles, multi_host) -> list[dict]:
    """The published Reef rows beside this run's on-disk bandwidth loss of the same cell."""
    arm = roles.get("on_disk")
    out = []
    for r in reef.to_dict("records"):
        ours = _find(loss, reference, arm, r["workload"], "bw_bytes", r["host"]) if arm else None
        cell = {**r, "direction": ours["direction"] if ours is not None else ""}
        out.append(
            {
                "workload": cell_words(cell, multi_host),
                "ours": _row_text(ours),
                "test_set": str(r["test_set"]),
                "configuration": str(r["configuration"]),
                "published": str(r["pct_of_unencrypted_as_published"]),
                "published_loss": f"{fmt_num(r['published_loss_pct'], 2)} %",
            }
        )
    return out


def ceph_section(run) -> dict:
    """The template's ``ceph_section``: ``present`` only when the run has Ceph arms."""
    ceph = run.table("ceph")
    if ceph.empty:
        return {"present": False}
    reference, roles = arm_roles(ceph)
    arms = [
        {
            "stack": str(r["stack"]),
            "mode": str(r["messenger_mode_seen"]),
            "encryption": str(r["osd_encryption"]),
            "osds": str(r["osd_ids"]),
            "runs": int((ceph["stack"] == r["stack"]).sum()),
        }
        for r in ceph.drop_duplicates("stack").sort_values("stack").to_dict("records")
    ]
    base = {"present": True, "arms": arms, "reference": reference}
    if reference is None or not roles:
        return base | {"compared": False}
    loss, ceph_loss = run.loss, run.table("ceph_loss")
    multi_host = ceph["host"].nunique() > 1
    shown = pd.concat([loss[loss["baseline"] == reference], ceph_loss], ignore_index=True)
    return base | {
        "compared": True,
        "roles": {k: roles.get(k, "not measured") for k in KIND_WORDS},
        "kind_words": KIND_WORDS,
        "side_by_side": side_by_side(loss, reference, roles, multi_host),
        "cpu": cpu_rows(ceph_loss, run.table("ceph_arms"), reference, roles, multi_host),
        "reef": reef_rows(run.table("ceph_reef"), loss, reference, roles, multi_host),
        "covers": intervals_cover(shown),
        "daemon_modes": ", ".join(sorted(set(ceph["daemon_modes"].astype(str)))),
        "client_basis": "; ".join(
            sorted(set(ceph["client_cpu_basis"].dropna().astype(str)) - {""})
        ),
        # qemu's userspace LUKS encrypts in qemu-storage-daemon, below the OSD: not in its CPU
        "userspace_luks": bool(ceph["osd_encryption"].astype(str).str.contains("qemu").any()),
    }
