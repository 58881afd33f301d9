"""A luks layer's ``allow_discards``: opened with --allow-discards (as ceph-volume opens an
encrypted OSD), kept by the plan for luks layers only, shown in the plan printout, and noted as
not applied by the userspace backend. The kernel's dm table is checked in tests/vm (osd-dmcrypt)."""

from __future__ import annotations

import pytest

from luksbench.formats.plan import PlanError
from luksbench.testbox.backends.kernel_tools import luks_open_argv
from luksbench.testbox.layers import resolve_layer
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
    layer = resolve_layer({"kind": "luks", "allow_discards": True}, "stacks.s")
    assert layer["allow_discards"] is True
    # absent stays absent: plans written before the key resolve as they did
    assert "allow_discards" not in resolve_layer({"kind": "luks"}, "stacks.s")
    # the schema's default on another kind is dropped; a real setting there is an error
    assert "allow_discards" not in resolve_layer({"kind": "plain", "allow_discards": False}, "s")
    with pytest.raises(PlanError, match="allow_discards: not a setting of kind plain"):
        resolve_layer({"kind": "plain", "allow_discards": True}, "stacks.s")


def test_plan_printout_shows_allow_discards():
    layer = resolve_layer({"kind": "luks", "allow_discards": True}, "stacks.s")
    assert layer_layout(layer, {}) == (
        "luks aes-xts-plain64 512-bit key luks2 allow-discards over its own scratch file"
    )
    assert "allow-discards" not in layer_layout(resolve_layer({"kind": "luks"}, "s"), {})
