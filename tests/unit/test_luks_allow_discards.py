"""A luks layer's ``allow_discards``: opened with --allow-discards (as ceph-volume opens an
encrypted OSD), kept by the plan for luks layers only, shown in the plan printout, and noted as
not applied by the userspace backend. The kernel's dm table is checked in tests/vm (osd-dmcrypt)."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit.paths import SCHEMA
from testkit.plans import plan_stacks, validated
from testkit.testbox import loop_plan

from luksbench.formats.plan import Plan, PlanError
from luksbench.studies import ConfigError, check_layer_kinds
from luksbench.testbox.backends.kernel_tools import luks_open_argv
from luksbench.testbox.planview import layer_layout


def test_open_passes_allow_discards_only_when_asked():
    plain = luks_open_argv("/dev/vdb", "luksbench-r-luks", "/k")
    assert "--allow-discards" not in plain
    argv = luks_open_argv("/dev/vdb", "luksbench-r-luks", "/k", ["no_read_workqueue"], True)
    assert argv == [
        "cryptsetup",
        "open",
        "--type",
        "luks",
        "--perf-no_read_workqueue",
        "--allow-discards",
        "--key-file",
        "/k",
        "/dev/vdb",
        "luksbench-r-luks",
    ]


def test_plan_keeps_allow_discards_on_luks_layers_only():
    stacks = plan_stacks({"s": {"kind": "luks", "allow_discards": True}, "p": {"kind": "plain"}})
    assert stacks["s"]["allow_discards"] is True
    # every luks layer carries it (false unless asked); the schema's default on another kind
    # is dropped, a real setting there refused on the config, naming the key
    assert plan_stacks({"s": {"kind": "luks"}})["s"]["allow_discards"] is False
    assert "allow_discards" not in stacks["p"]
    config = validated({"stacks": {"s": {"kind": "luks"}, "p": {"kind": "plain"}}})
    check_layer_kinds(config, SCHEMA)
    config["stacks"]["p"]["allow_discards"] = True
    with pytest.raises(
        ConfigError, match=r"stacks\.p\.allow_discards: not a setting of kind plain"
    ):
        check_layer_kinds(config, SCHEMA)


def test_a_plan_layer_without_one_of_its_settings_is_refused_naming_it():
    plan = loop_plan("r", Path("/nonexistent"))  # a version 1 document, migrated
    del plan["stacks"]["plain"]["size_mib"]
    with pytest.raises(PlanError, match=r"missing key\(s\) stacks\.plain\.size_mib"):
        Plan.from_document(plan)


def test_plan_printout_shows_allow_discards():
    stacks = plan_stacks({"s": {"kind": "luks", "allow_discards": True}, "t": {"kind": "luks"}})
    assert layer_layout(stacks["s"], {}) == (
        "luks aes-xts-plain64 512-bit key luks2 allow-discards over its own scratch file"
    )
    assert "allow-discards" not in layer_layout(stacks["t"], {})
