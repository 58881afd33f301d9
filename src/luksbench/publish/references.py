"""Published results beside this run: the transcribed tables of ``data/reference/`` (SCS 2023,
Ceph Reef 2023, RAID-5 2012; its README says where every number comes from), matched only where
rw pattern, block size and queue depth (and I/O mode) are the same."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from luksbench.analysis.cells import with_pattern
from luksbench.publish.text import (
    bs_human,
    cell_words,
    decision_kind,
    effect_ci,
    fmt_pct,
    metric_heading,
    missing,
    pattern_name,
    rw_rank,
    rw_words,
)

REFERENCE_FILES = {
    "scs": "scs_2023_loss_tables.csv",
    "ceph": "ceph_reef_2023_luks.csv",
    "raid5": "raid5_2012_conclusions.csv",
}


def read_references(reference_dir: Path | None = None) -> dict[str, pd.DataFrame]:
    """The transcribed published results (default: the repository's ``data/reference/*.csv``);
    missing files are left out."""
    folder = Path(reference_dir or Path(__file__).resolve().parents[3] / "data" / "reference")
    paths = {key: folder / name for key, name in REFERENCE_FILES.items()}
    return {key: pd.read_csv(path) for key, path in paths.items() if path.exists()}


#: the SCS tables' metric names ("random read IOPS") -> (rw, metric)
_SCS_METRIC = {
    f"{rw.replace('rand', 'random ')} {name}": (rw, metric)
    for rw in ("read", "write", "randread", "randwrite")
    for name, metric in (("bandwidth", "bw_bytes"), ("IOPS", "iops"))
}
_SCS_BS = {"4 KiB": 4096, "64 KiB": 65536, "1 MiB": 2**20, "4 MiB": 4 * 2**20}
_SCS_BS |= {"16 MiB": 16 * 2**20, "64 MiB": 64 * 2**20}


def scs_long(scs: pd.DataFrame) -> pd.DataFrame:
    """The SCS tables with rw, metric, bs_bytes, iodepth and device columns (iodepth 1 = fio default)."""
    df = scs.copy()
    df["rw"] = df["metric"].map(lambda m: _SCS_METRIC[m][0])
    df["our_metric"] = df["metric"].map(lambda m: _SCS_METRIC[m][1])
    df["bs_bytes"] = df["block_size"].map(_SCS_BS).astype("int64")
    df["iodepth"] = df["device_config"].map(lambda d: 32 if "iodepth=32" in d else 1)
    df["device"] = df["device_config"].str.replace(" iodepth=32", "", regex=False)
    return df


def _who(row, losses: pd.DataFrame | bool) -> str:
    """The comparison of a row for the published-results tables: `variant` (and its baseline
    when the comparisons have several baselines: ``losses``, or whether they have)."""
    several = losses if isinstance(losses, bool) else losses["baseline"].nunique() > 1
    if several:
        return f"`{row['variant']}` vs `{row['baseline']}`"
    return f"`{row['variant']}`"


def compare_scs(losses: pd.DataFrame, scs: pd.DataFrame | None) -> dict:
    """This run beside the SCS 2023 tables where rw, block size and iodepth are the same (main
    matrix cells only: a config pattern's cells ran with other fio options than the study)."""
    if scs is None or scs.empty:
        return {"present": False, "rows": [], "devices": []}
    ref = scs_long(scs)
    devices = ["SAS HDD", "SAS RAID-0", "NVME", "NVME RAID-0"]
    devices = [d for d in devices if (ref["device"] == d).any()]
    multi_host = losses["host"].nunique() > 1
    rows = []
    losses = with_pattern(losses)
    ours = losses[losses["metric"].isin(["bw_bytes", "iops"]) & (losses["pattern"] == "")]
    ours = ours.assign(
        _rw=ours["rw"].map(rw_rank), _m=ours["metric"].map({"bw_bytes": 0, "iops": 1})
    )
    # the published losses of each (rw, metric, block size, iodepth), per device
    keys = ["rw", "our_metric", "bs_bytes", "iodepth"]
    published = {
        (rw, metric, int(bs), int(qd)): dict(zip(g["device"], g["loss_pct"], strict=True))
        for (rw, metric, bs, qd), g in ref.groupby(keys, sort=False)
    }
    several = losses["baseline"].nunique() > 1
    ordered = ours.sort_values(["host", "_rw", "_m", "iodepth", "bs_bytes"], kind="stable")
    for r in ordered.to_dict("records"):
        at = published.get((r["rw"], r["metric"], int(r["bs_bytes"]), int(r["iodepth"])))
        if at is None:
            continue
        rows.append(
            {
                "workload": cell_words(r, multi_host),
                "metric": metric_heading(str(r["metric"])),
                "ours": f"{effect_ci(r)} ({decision_kind(r['decision'])}, {_who(r, several)})",
                "scs": [fmt_pct(at.get(d), 2) for d in devices],
            }
        )
    return {"present": True, "rows": rows, "devices": devices}


def compare_ceph(losses: pd.DataFrame, ceph: pd.DataFrame | None) -> dict:
    """Ceph Reef's published % of unencrypted performance beside this run's matching cells."""
    if ceph is None or ceph.empty:
        return {"present": False, "rows": [], "n_unmatched": 0, "n_total": 0}
    bw = losses[losses["metric"] == "bw_bytes"]
    multi_host = losses["host"].nunique() > 1
    rows, matched = [], set()
    several = losses["baseline"].nunique() > 1
    for i, ref in ceph.iterrows():
        m = bw[
            (bw["rw"] == ref["rw"])
            & (bw["bs_bytes"] == int(ref["bs_bytes"]))
            & (bw["iodepth"] == int(ref["iodepth"]))
        ]
        for r in m.to_dict("records"):
            matched.add(i)
            rows.append(
                {
                    "workload": cell_words(r, multi_host),
                    "ours": f"{effect_ci(r)} ({decision_kind(r['decision'])}, {_who(r, several)})",
                    "test_set": str(ref["test_set"]),
                    "configuration": str(ref["configuration"]),
                    "published": str(ref["pct_of_unencrypted_as_published"]),
                    "loss": fmt_pct(ref["loss_pct"], 2),
                }
            )
    other = ceph.drop(index=list(matched))
    shapes = sorted(
        {f"{rw_words(r['rw'])} {r['io_size']} QD{int(r['iodepth'])}" for _, r in other.iterrows()}
    )
    return {
        "present": True,
        "rows": rows,
        "n_unmatched": len(other),
        "n_total": len(ceph),
        "unmatched_shapes": ", ".join(shapes),
    }


def compare_raid5(
    losses: pd.DataFrame,
    raid5: pd.DataFrame | None,
    direct: list[int],
    cell_direct: dict | None = None,
) -> dict:
    """The 2012 RAID-5 conclusions beside this run's cells of the same rw pattern, block-size
    range and I/O mode (direct or buffered). ``direct``: the run's direct values; ``cell_direct``
    ({(host, workload): 0/1}, from the results' job options) decides per cell when a config
    pattern ran some cells buffered."""
    if raid5 is None or raid5.empty:
        return {"present": False, "rows": []}
    bw = losses[losses["metric"] == "bw_bytes"]
    if cell_direct and len(direct) > 1:
        cells = zip(bw["host"], bw["workload"], strict=True)
        bw = bw.assign(_direct=[cell_direct.get(cell) for cell in cells])
    multi_host = losses["host"].nunique() > 1
    several, several_variants = bw["baseline"].nunique() > 1, bw["variant"].nunique() > 1
    rows = []
    for _, ref in raid5.iterrows():
        claim = f"“{ref['claim_as_published']}”"
        if missing(ref["rw"]) or str(ref["rw"]).strip() == "":
            rows.append({"claim": claim, "ours": "no workload named: context only"})
            continue
        ref_direct = str(ref["direct"]).strip().lower() == "true"
        if direct and int(ref_direct) not in direct:
            mode = "direct I/O" if ref_direct else "buffered I/O with fsync"
            this_run = "direct" if 1 in direct else "buffered"
            ours = f"no matching cell: that test used {mode}, this run {this_run} I/O"
            rows.append({"claim": claim, "ours": ours})
            continue
        m = bw[
            (bw["rw"] == ref["rw"])
            & (bw["bs_bytes"] >= int(ref["bs_min_bytes"]))
            & (bw["bs_bytes"] <= int(ref["bs_max_bytes"]))
        ].sort_values(["host", "bs_bytes", "iodepth"])
        if "_direct" in m:
            m = m[m["_direct"] == int(ref_direct)]
        if m.empty:
            rows.append({"claim": claim, "ours": f"no `{ref['rw']}` cell in that block-size range"})
            continue
        ours = "; ".join(
            (f"{r['host']}: " if multi_host else "")
            + f"{bs_human(r['bs_bytes'])} QD{int(r['iodepth'])}"
            + (f" [{pattern_name(r)}]" if pattern_name(r) else "")
            + (f" ({_who(r, several)})" if several_variants else "")
            + f" {effect_ci(r)}"
            for r in m.to_dict("records")
        )
        rows.append({"claim": claim, "ours": f"`{ref['rw']}`: {ours}"})
    return {"present": True, "rows": rows}
