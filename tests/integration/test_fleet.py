"""fio's client/server mode for real: two fio servers on 127.0.0.1, every run sent to both at once,
per-server results in one raw file, parsed per host."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from testkit.testbox import free_port, loop_plan
from testkit.testbox import testbox as tb

from luksbench.formats.fio import parse_fio_file
from luksbench.testbox.planbuild import PlanError, check_plan
from luksbench.testbox.runner import check_servers, client_argv
from luksbench.testbox.sysutil import TestboxError


def test_client_argv_moves_job_options_into_a_job_file(tmp_path):
    local = [
        "fio",
        "--output-format=json+",
        "--output=/r/rep1.json.tmp",
        "--name=plain-read-4k-qd1",
        "--filename=/dev/loop3",
        "--rw=read",
        "--bs=4096",
        "--time_based",
        "--runtime=2s",
    ]
    argv, job = client_argv(
        local,
        tmp_path / "j.fio",
        [{"name": "a", "address": "10.0.0.1"}, {"name": "b", "address": "10.0.0.2", "port": 9000}],
    )
    assert argv == [
        "fio",
        "--output-format=json+",
        "--output=/r/rep1.json.tmp",
        "--client=ip:10.0.0.1,8765",
        str(tmp_path / "j.fio"),
        "--client=ip:10.0.0.2,9000",
        str(tmp_path / "j.fio"),
    ]
    assert job.splitlines() == [
        "[plain-read-4k-qd1]",
        "filename=/dev/loop3",
        "rw=read",
        "bs=4096",
        "time_based",
        "runtime=2s",
    ]


def test_unreachable_servers_are_named():
    port = free_port()  # nothing listens there
    with pytest.raises(
        TestboxError, match=rf"fio servers not reachable: ghost \(127\.0\.0\.1:{port}"
    ):
        check_servers([{"name": "ghost", "address": "127.0.0.1", "port": port}], timeout=1)


def test_fleet_clients_needs_hosts():
    plan = {
        "run": "x",
        "host": "h",
        "backend": "kernel",
        "scratch_dir": "/srv/x/y",
        "device_size_mib": 64,
        "precondition": False,
        "baseline": "a",
        "stacks": {"a": {"kind": "loop"}, "b": {"kind": "loop"}},
        "matrix": {"rw": ["read"], "bs": ["4k"], "iodepth": [1]},
        "fio": {},
        "repetitions": 1,
        "seed": 1,
        "fleet": {"mode": "clients", "hosts": []},
    }
    with pytest.raises(PlanError, match=r"fleet\.hosts must list the fio servers"):
        check_plan(plan)


@pytest.mark.device
def test_every_run_goes_to_both_servers_and_parses_per_host(tmp_path, fio_servers):
    run = f"fl{os.getpid()}"
    plan = loop_plan(
        run,
        tmp_path / "scratch",
        host="coord",
        matrix={"rw": ["randread"], "bs": ["4k"], "iodepth": [4]},
        repetitions=2,
        fleet={"mode": "clients", "hosts": fio_servers},
    )
    check_plan(plan)
    plan_path, state = tmp_path / "plan.json", tmp_path / "state.json"
    plan_path.write_text(json.dumps(plan))

    tb("stack-up", "--plan", plan_path, "--state", state, "--describe", tmp_path / "s.json")
    host_dir = tmp_path / "raw" / run / "coord"
    try:
        out = tb(
            "run-fio",
            "--plan",
            plan_path,
            "--state",
            state,
            "--raw-host-dir",
            host_dir,
            "--manifest",
            tmp_path / "m.json",
        )
    finally:
        tb("stack-down", "--state", state)
    assert "MiB/s per server" in out.stderr
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert manifest["complete"] and manifest["fleet"]["hosts"] == fio_servers
    for stack in ("plain", "other"):
        for rep in (1, 2):
            path = host_dir / "fio" / stack / "randread-4k-qd4" / f"rep{rep}.json"
            rows = parse_fio_file(path)
            hosts = sorted(r["host"] for r in rows)
            assert hosts == sorted(f"127.0.0.1:{s['port']}" for s in fio_servers)
            assert all(r["iops"] > 0 and r["rw"] == "randread" for r in rows)
    assert not list(Path(host_dir).rglob("*.job.tmp"))
