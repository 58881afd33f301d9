"""A run with several hosts keeps ``host`` as a dimension through ingest, statistics, figures and
paper, and never pairs across hosts.

The two-host run is the shipped sample (real fio json+ output) with its host folder copied as a
second test box ``vm2``, whose encrypted results of one cell are scaled to 0.8x bandwidth: a known
per-host difference.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from simulate import rerecord
from testkit.workflow import copy_workflow

from luksbench.analysis import ingest, stats
from luksbench.analysis.loss import write_loss
from luksbench.publish import catalog, render

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"
BIN = Path(sys.executable).parent
CELL = "read-1m-qd1"


def make_two_host_run(raw: Path) -> Path:
    shutil.copytree(SAMPLE, raw)
    for p in [raw, *raw.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    shutil.copytree(raw / "vm", raw / "vm2")
    for rep in (raw / "vm2" / "fio" / "luks" / CELL).glob("rep?.json"):
        doc = json.loads(rep.read_text())
        for job in doc["jobs"]:
            for key in ("bw_bytes", "bw", "iops"):
                job["read"][key] *= 0.8
            for key in ("io_bytes", "io_kbytes"):  # the same runtime moved fewer bytes
                job["read"][key] = round(job["read"][key] * 0.8)
        rep.write_text(json.dumps(doc))
    return raw


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("multihost")
    raw = make_two_host_run(base / "raw" / "fleet")
    processed = base / "processed" / "fleet"
    ingest.write_processed(raw, processed, workers=2)
    write_loss(processed)
    figures = catalog.make_figures(
        processed, base / "figures", "fleet", notebook="tests/test_multihost.py"
    )
    md = render.render_paper(processed, base / "figures", base / "paper" / "index.md", "fleet")
    return {"raw": raw, "processed": processed, "figures": figures, "md": md, "base": base}


def test_pairs_never_cross_hosts(fleet):
    loss = pd.read_parquet(fleet["processed"] / "loss.parquet")
    assert set(loss["host"]) == {"vm", "vm2"}
    single = stats.loss_table(ingest.fio_table(SAMPLE))
    cols = ["mean_log_ratio", "sd_log_ratio", "ci_low", "ci_high", "n"]
    keys = ["workload", "job_slot", "direction", "metric"]
    vm = loss[loss["host"] == "vm"].set_index(keys)[cols].sort_index()
    # host vm's intervals are exactly those of the sample alone: vm2's pairs took no part
    pd.testing.assert_frame_equal(vm, single.set_index(keys)[cols].sort_index())
    # vm2 differs from vm only in the scaled cell, by exactly ln 0.8 in every pair
    vm2 = loss[loss["host"] == "vm2"].set_index(keys)[cols].sort_index()
    shift = (vm2["mean_log_ratio"] - vm["mean_log_ratio"]).abs()
    # (the same runtime moved 0.8 times the bytes and I/Os: CPU per GiB and per I/O rise by 1 / 0.8)
    moved = ["bw_bytes", "iops", "busy_cpu_s_per_gib", "sys_cpu_s_per_gib", "busy_cpu_us_per_io"]
    scaled = shift.index.get_level_values("workload").isin([CELL]) & shift.index.get_level_values(
        "metric"
    ).isin(moved)
    # rows withheld on one host (too few I/Os beyond a percentile) are withheld on both
    assert (vm2["mean_log_ratio"].isna() == vm["mean_log_ratio"].isna()).all()
    assert (shift[~scaled].dropna() == 0).all()
    assert shift[scaled].to_numpy() == pytest.approx([-math.log(0.8)] * scaled.sum())
    # (io_bytes are whole bytes: 0.8 times them rounds, by 1e-10 at most in d)
    assert (vm2["sd_log_ratio"] - vm["sd_log_ratio"]).abs().max() < 1e-8


def test_host_is_a_dimension_of_every_table(fleet):
    tables = ingest.read_processed(fleet["processed"])
    for name in ("fio", "env", "stacks", "schedule", "cryptsetup", "loss"):
        assert set(tables[name]["host"]) == {"vm", "vm2"}, name


def test_figures_per_host_and_side_by_side(fleet):
    figures = fleet["figures"]
    for host in ("vm", "vm2"):
        for name in (f"throughput-{host}-read-bw_bytes", f"heatmap-{host}-bw_bytes"):
            assert name in figures, name
    assert {"hosts-bw_bytes", "hosts-clat_p99_ns"} <= set(figures)
    from PIL import Image

    meta = json.loads(Image.open(figures["hosts-bw_bytes"][0]).text["params"])
    assert meta["hosts"] == ["vm", "vm2"]


def test_paper_says_hosts_are_separate_boxes(fleet):
    text = fleet["md"].read_text()
    assert "**Hosts.**" in text and "separate test boxes" in text
    assert "pairs never cross hosts" in text
    assert "luksbench compare fleet fleet --host vm=vm2" in text
    table = text.split("**Hosts.**")[1].split("\n\n")[1]
    rows = [line for line in table.splitlines() if line.startswith("| vm")]
    assert [r.split(" | ")[0] for r in rows] == ["| vm", "| vm2"]
    assert "Hosts side by side" in text and "hosts-bw_bytes.png" in text
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (fleet["md"].parent / link).exists(), link
    assert not re.search(r"\bnan\b", text, re.IGNORECASE)


def test_single_host_paper_has_no_hosts_section(tmp_path):
    raw = tmp_path / "raw" / "one"
    shutil.copytree(SAMPLE, raw)
    for cell in raw.glob("*/fio/*/*"):  # a few cells are enough here
        if cell.is_dir() and cell.name not in ("read-1m-qd1", "write-4k-qd32"):
            shutil.rmtree(cell)
    rerecord(raw / "vm")
    processed = tmp_path / "processed"
    ingest.write_processed(raw, processed, workers=1)
    write_loss(processed)
    (tmp_path / "figures").mkdir()
    md = render.render_paper(processed, tmp_path / "figures", tmp_path / "index.md", "one")
    assert "**Hosts.**" not in md.read_text()


@pytest.mark.slow
def test_workflow_publishes_a_two_host_run(tmp_path):
    """The analysis rules of the workflow on a two-host run folder: paper with a host dimension."""
    work = copy_workflow(tmp_path / "wf")
    make_two_host_run(work / "data" / "raw" / "fleet")
    result = subprocess.run(
        [str(BIN / "snakemake"), "--cores", "2", "paper/fleet/index.md"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = (work / "paper" / "fleet" / "index.md").read_text()
    assert "pairs never cross hosts" in text and "| vm2: luks, QD1 |" in text
    assert (work / "figures" / "fleet" / "hosts-bw_bytes.png").is_file()
    assert (work / "data" / "processed" / "fleet" / "schedule.parquet").is_file()
    assert (work / "data" / "processed" / "fleet" / ingest.CACHE_DIRNAME / "meta.json").is_file()
    log = (work / "logs" / "fleet" / "ingest_raw.log").read_text()
    assert "192 fio results: 192 parsed, 0 unchanged" in log


# ------------------------------------------------------------------ fio client/server (fleet) runs


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory) -> Path:
    """A fleet run measured here for real: two fio servers on 127.0.0.1, every repetition sent to
    both at once with `fio --client` (as the runner's clients mode does), results in the raw layout
    of the coordinating host `coord` with a manifest naming the servers. The `luks` arm is fio's
    rate limit (300 IOPS) on a second file: a loss every server must show."""
    import contextlib
    import os
    import socket
    import time

    base = tmp_path_factory.mktemp("fleet")
    servers = []
    for i in (1, 2):
        port, pidfile = _free_port(), base / f"server{i}.pid"
        subprocess.run(
            ["fio", f"--server=ip:127.0.0.1,{port}", f"--daemonize={pidfile}"], check=True
        )
        servers.append({"name": f"client{i}", "address": "127.0.0.1", "port": port})
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"fio server on {port} did not come up"
                time.sleep(0.1)
    host = base / "raw" / "fleetrun" / "coord"
    cell = "randread-4k-qd1"
    sidecar = (SAMPLE / "vm" / "fio" / "plain" / "read-4k-qd1" / "rep1.cpu.json").read_text()
    runs, index, session_start = [], 0, time.time()
    try:
        for rep in (1, 2, 3):
            for stack in ("plain", "luks") if rep in (1, 4) else ("luks", "plain"):
                target = base / f"{stack}.img"
                job = base / f"{stack}.fio"
                job.write_text(
                    f"[{stack}-{cell}]\nfilename={target}\nsize=16m\nrw=randread\nbs=4k\n"
                    "iodepth=1\nruntime=1\ntime_based\n"
                    + ("rate_iops=300\n" if stack == "luks" else "")
                )
                out = host / "fio" / stack / cell / f"rep{rep}.json"
                out.parent.mkdir(parents=True, exist_ok=True)
                clients = [a for s in servers for a in (f"--client=ip:127.0.0.1,{s['port']}", job)]
                started = time.time()
                subprocess.run(
                    ["fio", "--output-format=json+", f"--output={out}", *map(str, clients)],
                    check=True,
                    capture_output=True,
                    timeout=120,
                )
                index += 1
                runs.append(
                    {
                        "index": index,
                        "round": rep,
                        "rep": rep,
                        "stack": stack,
                        "workload": cell,
                        "path": f"fio/{stack}/{cell}/rep{rep}.json",
                        "started": _iso(started),
                        "ended": _iso(time.time()),
                        "skipped_existing": False,
                        "status": "ok",
                    }
                )
                (out.parent / f"rep{rep}.cpu.json").write_text(sidecar)
    finally:
        for i in (1, 2):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int((base / f"server{i}.pid").read_text()), 15)
    manifest = {
        "run": "fleetrun",
        "host": "coord",
        "seed": 1,
        "repetitions": 3,
        "baseline": "plain",
        "stacks": ["plain", "luks"],
        "fleet": {"mode": "clients", "hosts": servers},
        "started": _iso(session_start),
        "ended": _iso(time.time()),
        "runs": runs,
    }
    (host / "fio" / "manifest.json").write_text(json.dumps(manifest))
    (host / "fio" / "sessions").mkdir()
    (host / "fio" / "sessions" / "session1.json").write_text(json.dumps(manifest))
    shutil.copyfile(SAMPLE / "vm" / "env.json", host / "env.json")
    return host.parent


@pytest.mark.device
def test_fleet_servers_are_the_hosts(fleet_run, tmp_path):
    from luksbench.analysis import runcompare as compare

    processed = tmp_path / "processed" / "fleetrun"
    ingest.write_processed(fleet_run, processed, workers=1)
    tables = ingest.read_processed(processed)
    fio = tables["fio"]
    assert set(fio["host"]) == {"client1", "client2"}  # the names the plan gave the servers
    assert set(fio["host_dir"]) == {"coord"}
    assert fio.groupby("host").size().to_dict() == {"client1": 6, "client2": 6}
    # the sidecar measured the coordinating fio client, not the servers: no CPU values
    assert fio[["busy_cpu_s", "sys_cpu_s_per_gib"]].isna().all().all()
    env = tables["env"].set_index("host")
    assert set(env.index) == {"coord", "client1", "client2"}
    assert env.loc["client1", "backend"] == env.loc["coord", "backend"]

    loss = write_loss(processed)[0]
    bw = loss[loss["metric"] == "bw_bytes"].set_index("host")
    assert set(bw.index) == {"client1", "client2"} and (bw["n"] == 3).all()
    assert (bw["verdict"] == "significant").all() and (bw["effect_pct"] > 50).all()

    figures = catalog.make_figures(processed, tmp_path / "figures", "fleetrun", workers=2)
    assert {"throughput-client1-randread-bw_bytes", "hosts-bw_bytes"} <= set(figures)
    assert "latency-client2-randread" in figures  # json+ histograms, per server
    md = render.render_paper(processed, tmp_path / "figures", tmp_path / "index.md", "fleetrun")
    text = md.read_text()
    assert "the fio servers of a fleet run" in text and "coordinated from `coord`" in text
    assert "`client1`, `client2`" in text.split("**TL;DR.**")[1].split("\n")[0]

    run = compare.load_run_data(processed)
    table = compare.compare_runs(run, run, hosts=["client1=client2"], metrics=["bw_bytes"])
    # both servers ran every repetition at the same time, in the same round: paired
    assert set(table["design"]) == {"paired"} and (table["n"] == 3).all()
