"""fio's client/server mode for real: two fio servers on 127.0.0.1, every run sent to both at once,
per-server results in one raw file, parsed per host."""

from __future__ import annotations

import socket

import pytest

from luksbench.testbox.env import TestboxError
from luksbench.testbox.plan import PlanError, check_plan
from luksbench.testbox.runner import check_servers, client_argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
