"""Where Ceph spends CPU: ingest's ceph table from the sidecars' ``ceph`` records, the loss
stage's Ceph tables (client and OSD CPU per GiB and per I/O against the reference, the Reef rows
of the same shape) and the paper's Ceph section, on a small synthetic four-arm run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from simulate import _fio_job

from luksbench.analysis import ceph_loss, loss
from luksbench.analysis.ceph_tables import CEPH_COLUMNS, JOB_THREAD, PROCESS_TREE, seen_mode
from luksbench.analysis.ingest import ingest_run
from luksbench.analysis.losssettings import LossSettings
from luksbench.publish.paper_ceph import arm_roles, ceph_section
from luksbench.publish.run import Run

WORKLOAD = "randread-4k-qd128"
#: arm -> (client mode, OSD id, OSD encrypted, OSD CPU factor, client CPU factor)
ARMS = {
    "plain": ("crc", 0, False, 1.0, 1.0),
    "secure": ("secure", 0, False, 1.05, 1.6),
    "luks": ("crc", 1, True, 2.0, 1.0),
    "luks-secure": ("secure", 1, True, 2.1, 1.6),
}
PAIRS = 4
BW = 4096 * 2000.0  # bytes/s: 2,000 IOPS of 4 KiB over fio's 6 s
OSD_US_PER_IO = 150.0  # the reference's OSD CPU per I/O
CLIENT_US_PER_IO = 40.0


def _ceph_record(arm: str, osd_s: float, seconds: float, connections=None) -> dict:
    mode, osd, encrypted, _, _ = ARMS[arm]
    other = 1 - osd
    return {
        "pool": f"p{osd}",
        "image": "bench",
        "messenger_mode": mode,
        "mode_probe": {
            "asked": mode,
            "connections": connections or {"mon.0": mode, f"osd.{osd}": mode},
            "probe_seconds": 0.5,
            "log": "rep1.ceph-probe.log",
        },
        "osd_devices": [
            {"osd": osd, "block": "/dev/x", "encryption": "dm-crypt" if encrypted else None}
        ],
        "daemon_modes": "crc secure",
        "seconds": seconds,
        "daemon_cpu_s": {f"ceph-osd.{osd}": osd_s, f"ceph-osd.{other}": 0.02, "ceph-mon.a": 0.05},
        "daemon_peak_rss_bytes": {f"ceph-osd.{osd}": 900 * 2**20, "ceph-mon.a": 60 * 2**20},
    }


def write_ceph_run(raw: Path, seed: int = 7, record=None) -> Path:
    """A raw run of the four Ceph arms, one cell, :data:`PAIRS` pairs: OSD and client CPU per I/O
    of each arm its factor (:data:`ARMS`) times the reference's, off by exp(N(0, 0.03)) per run.
    ``record(arm, k, doc)``: changes a run's ``ceph`` record before it is written."""
    rng = np.random.default_rng(seed)
    host = raw / "vm"
    runs, stacks = [], {}
    for arm, (mode, _, _, osd_factor, client_factor) in ARMS.items():
        stacks[arm] = {"kind": "rbd", "backend": "kernel", "messenger_mode": mode}
        folder = host / "fio" / arm / WORKLOAD
        folder.mkdir(parents=True)
        for k in range(1, PAIRS + 1):
            job = _fio_job("j0", BW, 128)
            ios = job["read"]["io_bytes"] / 4096
            client_s = CLIENT_US_PER_IO * client_factor * ios / 1e6 * np.exp(rng.normal(0, 0.03))
            # fio's own figures count its job thread only: a third of the process tree here
            job |= {"usr_cpu": 100 * client_s / 6.0 * 0.2, "sys_cpu": 100 * client_s / 6.0 * 0.13}
            job["job_runtime"] = 6000
            (folder / f"rep{k}.json").write_text(
                json.dumps({"fio version": "fio-3.33", "jobs": [job]})
            )
            osd_s = OSD_US_PER_IO * osd_factor * ios / 1e6 * np.exp(rng.normal(0, 0.03))
            doc = _ceph_record(arm, float(osd_s), 6.1) | {"client_cpu_s": round(client_s, 4)}
            if record:
                record(arm, k, doc)
            sidecar = {"version": 2, "interval_s": 6.1, "busy_s": 5.0, "busy_pct": 41.0}
            sidecar |= {"delta_s": {"system": 2.0}, "ceph": doc}
            (folder / f"rep{k}.cpu.json").write_text(json.dumps(sidecar))
            path = f"fio/{arm}/{WORKLOAD}/rep{k}.json"
            runs.append({"rep": k, "round": k, "stack": arm, "workload": WORKLOAD, "path": path})
    manifest = {"run": raw.name, "host": "vm", "sessions": 1, "runs": runs}
    manifest["stack_descriptions"] = {"stacks": stacks}
    (host / "fio" / "manifest.json").write_text(json.dumps(manifest))
    return raw


def settings() -> LossSettings:
    return LossSettings("plain", "luks", 0.95, 2.0, {})


@pytest.fixture(scope="module")
def ceph_run(tmp_path_factory):
    raw = write_ceph_run(tmp_path_factory.mktemp("raw") / "cephsim")
    tables = ingest_run(raw, workers=1)
    return tables, loss.loss_tables(tables, settings()), raw


def test_the_ceph_table_has_each_runs_osd_and_client_cpu(ceph_run):
    tables, _, raw = ceph_run
    ceph, fio = tables["ceph"], tables["fio"]
    assert list(ceph.columns) == CEPH_COLUMNS
    assert len(ceph) == len(ARMS) * PAIRS
    for row in ceph.to_dict("records"):
        mode, osd, encrypted, _, _ = ARMS[row["stack"]]
        assert row["messenger_mode_seen"] == mode and row["osd_ids"] == str(osd)
        assert row["osd_encrypted"] == encrypted
        assert row["osd_encryption"] == ("dm-crypt" if encrypted else "none")
        assert row["other_daemon_cpu_s"] == pytest.approx(0.07), "the other OSD and the monitor"
        run = fio[fio["file"] == row["file"]].iloc[0]
        sidecar = json.loads((raw / row["file"].replace(".json", ".cpu.json")).read_text())
        assert row["client_cpu_s"] == sidecar["ceph"]["client_cpu_s"]
        assert row["client_cpu_basis"] == PROCESS_TREE and row["client_window_s"] == 6.1
        assert row["ios"] == pytest.approx(run["io_bytes"] / 4096)
        assert row["osd_cpu_us_per_io"] == pytest.approx(1e6 * row["osd_cpu_s"] / row["ios"])
        assert row["client_cpu_s_per_gib"] == pytest.approx(row["client_cpu_s"] / run["io_gib"])
    plain = ceph[ceph["stack"] == "plain"]
    assert plain["osd_cpu_us_per_io"].mean() == pytest.approx(OSD_US_PER_IO, rel=0.05)


def test_a_ceph_record_that_is_not_the_runners_is_a_problem_naming_file_and_key(tmp_path):
    def broken(arm, k, doc):
        if arm == "luks" and k == 2:
            doc["daemon_cpu_s"]["ceph-osd.1"] = -3

    tables = ingest_run(write_ceph_run(tmp_path / "bad", record=broken), workers=1)
    problems = tables["problems"]
    hit = problems[problems["reason"].str.contains("ceph.daemon_cpu_s.ceph-osd.1", regex=False)]
    assert len(hit) == 1 and "luks/randread-4k-qd128/rep2.cpu.json" in hit["file"].iloc[0]
    assert len(tables["ceph"]) == len(ARMS) * PAIRS - 1


def test_without_the_runners_record_the_client_is_fios_job_thread(tmp_path):
    def older(arm, k, doc):
        del doc["client_cpu_s"]

    tables = ingest_run(write_ceph_run(tmp_path / "old", record=older), workers=1)
    ceph, fio = tables["ceph"], tables["fio"]
    assert ceph["client_cpu_basis"].eq(JOB_THREAD).all()
    for row in ceph.to_dict("records"):
        run = fio[fio["file"] == row["file"]].iloc[0]
        client = (run["usr_cpu"] + run["sys_cpu"]) / 100 * run["job_runtime_ms"] / 1000
        assert row["client_cpu_s"] == pytest.approx(client)
        assert row["client_window_s"] == run["job_runtime_ms"] / 1000


def test_the_verified_mode_is_what_the_connections_used_not_the_label():
    assert seen_mode({"mon.0": "secure", "osd.0": "secure"}) == "secure"
    assert seen_mode({"mon.0": "crc", "osd.0": "secure"}) == "mon.0: crc; osd.0: secure"
    runs = pd.DataFrame(
        {
            "stack": ["a", "b"],
            "osd_encrypted": [False, False],
            "messenger_mode_seen": ["crc", "mon.0: crc; osd.0: secure"],
        }
    )
    assert arm_roles(runs) == ("a", {}), (
        "an arm whose connections were not all secure is no on-the-wire arm"
    )


def test_the_loss_stage_tables_client_and_osd_cpu_against_the_reference(ceph_run):
    _, out, _ = ceph_run
    table = out["ceph_loss"]
    assert set(table["metric"]) == set(ceph_loss.CEPH_CPU_METRICS)
    assert set(zip(table["baseline"], table["variant"], strict=True)) == {
        ("plain", a) for a in ARMS if a != "plain"
    }
    assert table["covers"].eq("repetitions within one session").all()
    for arm, (_, _, _, osd_factor, client_factor) in ARMS.items():
        if arm == "plain":
            continue
        for metric, factor in (
            ("osd_cpu_us_per_io", osd_factor),
            ("client_cpu_us_per_io", client_factor),
        ):
            row = table[(table["variant"] == arm) & (table["metric"] == metric)].iloc[0]
            # the estimate near the true increase (runs off by 3 %), inside its own interval
            assert abs(row["effect_pct"] - 100 * (factor - 1)) < 8, (arm, metric)
            assert row["ci_low"] <= row["effect_pct"] <= row["ci_high"]
            assert row["interval"] == "t" and row["derived_from"] == metric.replace(
                "us_per_io", "s_per_gib"
            )
    luks = table[(table["variant"] == "luks") & (table["metric"] == "osd_cpu_us_per_io")].iloc[0]
    assert luks["decision"] == "material"  # twice the reference's: beyond the CPU margin of 50 %
    arms = out["ceph_arms"]
    ref = arms[(arms["stack"] == "plain") & (arms["metric"] == "osd_cpu_us_per_io")].iloc[0]
    assert abs(ref["mean"] - OSD_US_PER_IO) < ref["ci_half"] + 5
    assert set(arms.loc[arms["on_disk"], "stack"]) == {"luks", "luks-secure"}
    assert set(arms.loc[arms["on_wire"], "stack"]) == {"secure", "luks-secure"}


def test_the_reef_rows_are_the_reference_tables_rows_of_the_runs_shape(ceph_run):
    _, out, _ = ceph_run
    reef = out["ceph_reef"]
    published = ceph_loss.read_reef()
    same = published[(published["rw"] == "randread") & (published["bs_bytes"] == 4096)]
    same = same[same["iodepth"] == 128]
    assert len(reef) == len(same) > 0
    assert set(reef["workload"]) == {WORKLOAD}
    assert sorted(reef["published_loss_pct"]) == sorted(same["loss_pct"])


def test_a_run_without_ceph_arms_has_empty_ceph_tables_and_no_section(processed_sample):
    tables = loss.read_tables(processed_sample)
    out = loss.loss_tables(tables, settings())
    assert all(out[name].empty for name in ceph_loss.CEPH_LOSS_TABLES)
    assert ceph_section(Run(processed_sample, {**tables, **out}))["present"] is False


def test_the_papers_ceph_section_prints_the_tables_rows(ceph_run):
    tables, out, _ = ceph_run
    section = ceph_section(Run(Path("."), {**tables, **out}))
    assert section["present"] and section["compared"] and section["reference"] == "plain"
    assert section["roles"] == {"on_disk": "luks", "on_wire": "secure", "both": "luks-secure"}
    losses = out["loss"]
    bw = losses[(losses["variant"] == "luks") & (losses["metric"] == "bw_bytes")].iloc[0]
    row = next(r for r in section["side_by_side"] if r["metric"] == "bandwidth")
    assert row["on_disk"].startswith(f"{bw['effect_pct']:.1f} % [{bw['ci_low']:.1f}, ")
    cpu = out["ceph_loss"]
    osd = cpu[(cpu["variant"] == "luks") & (cpu["metric"] == "osd_cpu_us_per_io")].iloc[0]
    line = next(r for r in section["cpu"] if r["side"] == "OSD daemons")
    assert (
        f"{osd['effect_pct']:.1f} % [{osd['ci_low']:.1f}, {osd['ci_high']:.1f}] material"
        in line["on_disk"]
    )
    arms = out["ceph_arms"]
    ref = arms[(arms["stack"] == "plain") & (arms["metric"] == "osd_cpu_us_per_io")].iloc[0]
    assert line["reference"] == f"{ref['mean']:,.1f} ± {ref['ci_half']:,.1f}"
    assert [r["published"] for r in section["reef"]] == list(
        out["ceph_reef"]["pct_of_unencrypted_as_published"]
    )
    assert "repetition" in section["covers"]
