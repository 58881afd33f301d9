"""A whole fleet run for real: two `fio --server` daemons on 127.0.0.1, `snakemake --cores 1 all`
in client mode against them, and a published run whose host dimension is the two servers.

The stacks are built here (the userspace backend on this kernel, kernel where dm-crypt exists);
both servers run on this machine, so the stacks' paths are valid for both, and every repetition
goes to both servers at once.
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from testkit.workflow import copy_workflow, our_mounts, our_processes, snakemake

from luksbench.formats.fio import parse_fio_file

pytestmark = [pytest.mark.device, pytest.mark.slow]

RUN = "fleet-e2e"
CELLS = ("randread-4k-qd4", "write-4k-qd4")
STACKS = ("plain", "luks")
REPS = 2


def fleet_config(servers: list[dict]) -> str:
    hosts = "\n".join(
        f"    - {{name: {s['name']}, address: {s['address']}, port: {s['port']}}}" for s in servers
    )
    return f"""\
run: {RUN}
device_size_mib: 64
matrix:
  rw: [randread, write]
  bs: [4k]
  iodepth: [4]
fio:
  runtime_s: 1
  ramp_time_s: 0
repetitions: {REPS}
fleet:
  mode: clients
  hosts:
{hosts}
"""


@pytest.fixture
def fleet_run(tmp_path, fio_servers):
    """The workflow copied and run end to end against the two servers; (workdir, servers)."""
    servers = [{**s, "name": name} for s, name in zip(fio_servers, ("east", "west"), strict=True)]
    work = copy_workflow(tmp_path / "wf")
    (work / "fleet.yaml").write_text(fleet_config(servers))
    result = snakemake(work, "all", configfiles=("fleet.yaml",))
    assert result.returncode == 0, result.stderr[-4000:]
    return work, servers


def test_a_fleet_run_is_measured_per_server_and_published_with_a_host_dimension(fleet_run):
    work, servers = fleet_run
    names = [s["name"] for s in servers]
    addresses = sorted(f"127.0.0.1:{s['port']}" for s in servers)

    # raw: one coordinating host folder; every repetition holds both servers' results
    host_dirs = [p for p in (work / "data" / "raw" / RUN).iterdir() if p.is_dir()]
    assert len(host_dirs) == 1
    host_dir = host_dirs[0]
    manifest = json.loads((host_dir / "fio" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["fleet"]["mode"] == "clients"
    assert [h["name"] for h in manifest["fleet"]["hosts"]] == names
    reps = sorted(p for p in host_dir.glob("fio/*/*/rep*.json") if ".cpu." not in p.name)
    assert len(reps) == len(STACKS) * len(CELLS) * REPS
    for path in reps:
        rows = parse_fio_file(path)
        assert sorted(r["host"] for r in rows) == addresses, path
        assert all(r["iops"] > 0 for r in rows), path

    processed = work / "data" / "processed" / RUN
    fio = pd.read_parquet(processed / "fio.parquet")
    assert set(fio["host"]) == set(names)
    per_host = fio.groupby("host").size().to_dict()
    assert per_host == dict.fromkeys(names, len(STACKS) * len(CELLS) * REPS)

    loss = pd.read_parquet(processed / "loss.parquet")
    bw = loss[loss["metric"] == "bw_bytes"]
    assert set(bw["host"]) == set(names)
    for name in names:
        rows = bw[bw["host"] == name]
        assert sorted(rows["workload"]) == sorted(CELLS) and (rows["n"] == REPS).all(), name

    figures = {p.stem for p in (work / "figures" / RUN).glob("*.png")}
    assert {"hosts-bw_bytes", "hosts-clat_p99_ns"} <= figures
    for name in names:
        assert f"throughput-{name}-randread-bw_bytes" in figures, name

    paper = work / "paper" / RUN / "index.md"
    text = paper.read_text()
    assert "**Hosts.**" in text and "the fio servers of a fleet run" in text
    assert f"coordinated from `{host_dir.name}`" in text
    hosts_table = text.split("**Hosts.**")[1].split("\n\n")[1]
    rows = {line.split(" | ")[0].strip("| "): line for line in hosts_table.splitlines()[2:]}
    assert sorted(rows) == sorted(names), hosts_table
    for name in names:
        # a row of numbers per server: cells, significant cells, median effect in %
        cells = [c.strip() for c in rows[name].strip("|").split("|")]
        assert str(len(CELLS)) in cells and any(re.search(r"-?\d+(\.\d+)? ?%", c) for c in cells)
    assert "hosts-bw_bytes.png" in text
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (paper.parent / link).exists(), link
    assert not re.search(r"\bnan\b", text, re.IGNORECASE), "a missing value leaked into the paper"

    assert our_mounts(work) == []
    assert our_processes(work) == []
