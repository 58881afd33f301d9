"""Config values a careless or hostile user may give: refused before anything runs, naming the key.

Names end up in device-mapper names, paths and command lines; block sizes in every fio run.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from snakemake.utils import validate
from testkit.plans import PLAN_CONFIG as CONFIG

from luksbench.formats.layout import LayoutError, Workload, rep_of_key
from luksbench.testbox.planbuild import PlanError, plan_from_config
from luksbench.testbox.safety import SafetyError, check_name

REPO = Path(__file__).resolve().parents[2]
SCHEMA = str(REPO / "workflow" / "schemas" / "config.schema.yaml")


@pytest.mark.parametrize(
    "config",
    [
        {"run": "r1\n"},
        {"host": "box\n"},
        {"study": "scs-2023\n"},
        {"stacks": {"plain\n": {"kind": "plain"}, "luks": {"kind": "luks"}}},
        {"devices": {"d0\n": {"size_mib": 64}}},
        {"patterns": {"large\n": {}}},
        {"matrix": {"bs": ["4k\n"]}},
        {"fleet": {"hosts": [{"name": "s1\n", "address": "127.0.0.1"}]}},
    ],
    ids=["run", "host", "study", "stack", "device", "pattern", "bs", "fleet-host"],
)
def test_the_schema_refuses_a_name_with_a_trailing_newline(config):
    with pytest.raises(Exception, match="Error validating"):
        validate(copy.deepcopy(config), SCHEMA)


def test_name_checks_match_the_whole_name():
    with pytest.raises(SafetyError, match="run 'r1\\\\n'"):
        check_name("r1\n", "run")
    with pytest.raises(LayoutError):
        Workload.from_id("randread-4k-qd1\n")
    with pytest.raises(LayoutError):
        rep_of_key("h/fio/plain/randread-4k-qd1/rep1.json\n")


@pytest.mark.parametrize("bs", ["0", "0k", "00"])
def test_the_schema_refuses_a_block_size_of_zero(bs):
    with pytest.raises(Exception, match="Error validating"):
        validate({"matrix": {"bs": [bs]}}, SCHEMA)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"matrix": {**CONFIG["matrix"], "bs": ["4k", "0"]}}, "matrix.bs: '0'"),
        ({"matrix": {**CONFIG["matrix"], "bs": ["100"]}}, "matrix.bs: '100'"),
        ({"precondition": {"block_size": "0"}}, "precondition.block_size: '0'"),
        ({"precondition": {"ss_bs": "1"}}, "precondition.ss_bs: '1'"),
        (
            {
                "patterns": {
                    "odd": {
                        "matrix": {"rw": ["read"], "bs": ["4k"], "iodepth": [1]},
                        "io_bs": "256",
                        "fsync_per_block": False,  # as validation fills it
                    }
                }
            },
            "patterns.odd.io_bs: '256'",
        ),
    ],
    ids=["zero", "not-sectors", "fill", "steady-state", "io_bs"],
)
def test_a_degenerate_block_size_is_refused_by_the_plan(change, named, tmp_path):
    with pytest.raises(PlanError, match="whole number of 512-byte sectors") as err:
        pre = {**CONFIG["precondition"], **change.get("precondition", {})}
        plan_from_config({**CONFIG, **change, "precondition": pre}, "box", tmp_path)
    assert named in str(err.value)
