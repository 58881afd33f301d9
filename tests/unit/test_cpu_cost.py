"""CPU cost net of the idle baseline (utilisation and CPU per I/O beside CPU per GiB) and the
fixed-rate pattern's plan, schema and fio command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from luksbench.analysis import ingest
from luksbench.formats.layout import Workload
from luksbench.testbox.plan import PlanError, check_patterns, resolve_patterns
from luksbench.testbox.runner import fio_argv

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"
IDLE = {"interval_s": 2.0, "busy_s": 0.5, "busy_pct": 12.5, "delta_s": {"system": 0.2}}


def test_cpu_columns_are_net_of_the_sessions_idle_baseline(tmp_path):
    raw = tmp_path / "raw" / "idle"
    shutil.copytree(SAMPLE, raw)
    for p in [raw, *raw.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    gross = ingest.fio_table(SAMPLE, workers=1)
    for session in (raw / "vm" / "fio" / "sessions").glob("*.json"):
        doc = json.loads(session.read_text())
        session.write_text(json.dumps({**doc, "cpu_idle_baseline": IDLE}))
    net = ingest.fio_table(raw, workers=1)
    assert gross["idle_busy_cpu_s"].isna().all()  # the sample recorded no baseline
    idle_busy = 0.25 * net["cpu_interval_s"]
    assert net["idle_busy_cpu_s"].to_numpy() == pytest.approx(idle_busy.to_numpy())
    gib = net.groupby("file")["io_gib"].transform("sum")
    expected = (net["busy_cpu_s"] - idle_busy) / gib
    assert net["busy_cpu_s_per_gib"].to_numpy() == pytest.approx(expected.to_numpy())
    sys_expected = (net["sys_cpu_s"] - 0.1 * net["cpu_interval_s"]) / gib
    assert net["sys_cpu_s_per_gib"].to_numpy() == pytest.approx(sys_expected.to_numpy())
    assert net["cpu_util_pct"].to_numpy() == pytest.approx((net["busy_cpu_pct"] - 12.5).to_numpy())
    ios = net["io_bytes"] / net["io_bs_bytes"]
    per_io = 1e6 * (net["busy_cpu_s"] - idle_busy) / ios
    assert net["busy_cpu_us_per_io"].to_numpy() == pytest.approx(per_io.to_numpy())
    assert (net["busy_cpu_s_per_gib"] < gross["busy_cpu_s_per_gib"]).all()


PATTERN = {
    "matrix": {"rw": ["randread"], "bs": ["4k"], "iodepth": [1]},
    "rate_pct": 80,
}


def test_a_fixed_rate_pattern_is_planned_and_runs_with_fio_rate_iops(tmp_path):
    patterns = resolve_patterns({"fixedrate": PATTERN}, {"ioengine": "libaio", "direct": True})
    assert patterns["fixedrate"]["rate_pct"] == 80
    plan = {"fio": {"runtime_s": 2}, "patterns": patterns}
    check_patterns(plan)
    w = Workload("randread", 4096, 1, "fixedrate")
    argv = fio_argv(plan, {"device": "/dev/x"}, "plain", w, tmp_path / "o.json", 0, 1234)
    assert "--rate_iops=1234" in argv
    assert not any(
        a.startswith("--rate")
        for a in fio_argv(plan, {"device": "/dev/x"}, "plain", w, tmp_path / "o.json", 0)
    )
    for bad in (0, 120, "80", True):
        bad_plan = {"patterns": {"fixedrate": {**patterns["fixedrate"], "rate_pct": bad}}}
        with pytest.raises(PlanError, match=r"patterns\.fixedrate\.rate_pct"):
            check_patterns(bad_plan)
    # plans made before rate_pct existed stay valid
    old = {k: v for k, v in patterns["fixedrate"].items() if k != "rate_pct"}
    check_patterns({"patterns": {"fixedrate": old}})


def test_the_schema_describes_rate_pct_with_its_default():
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    rate = schema["$defs"]["pattern"]["properties"]["rate_pct"]
    assert rate["default"] is None and "slower stack's pilot" in rate["description"]
