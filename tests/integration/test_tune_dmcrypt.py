"""The tune-dmcrypt study end to end on this machine's userspace backend (no dm-crypt here): a
tiny matrix, the workflow's `all`, and the paper's "Recommended settings for this box" from what
was measured, with the settings the backend could not apply stated, never ranked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from testkit.workflow import copy_workflow

pytestmark = [pytest.mark.device, pytest.mark.slow]

BIN = Path(sys.executable).parent
RUN = "tune-userspace"
# The userspace backend builds plain and luks arms on their own files: the study's arms that it
# can take, with the study's settings; only the key size is honoured (qemu reads LUKS1 only).
CONFIG = f"""
study: tune-dmcrypt
run: {RUN}
backend: userspace
device_size_mib: 64
devices: {{}}
precondition: {{fill_passes: 1}}
stacks:
  plain: {{kind: plain}}
  luks: {{kind: luks}}
  luks-nowq: {{kind: luks, perf_flags: [no_read_workqueue, no_write_workqueue]}}
  luks-4k: {{kind: luks, sector_size: 4096}}
  luks-key256: {{kind: luks, key_bits: 256}}
matrix: {{rw: [randread], bs: [4k], iodepth: [1]}}
patterns:
  seq: {{matrix: {{rw: [read], bs: [64k], iodepth: [4]}}}}
  equalload: {{matrix: {{rw: [randread], bs: [4k], iodepth: [4]}}, rate_pct: 50}}
fio: {{runtime_s: 1, ramp_time_s: 0}}
repetitions: 3
analysis:
  comparisons:
    - {{baseline: plain, variant: luks}}
    - {{baseline: luks, variant: luks-nowq}}
    - {{baseline: luks, variant: luks-4k}}
    - {{baseline: luks, variant: luks-key256}}
    - {{baseline: plain, variant: luks-key256}}
"""


@pytest.mark.slow
def test_the_study_on_the_userspace_backend_recommends_from_measured_data(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("device tests need root", pytrace=False)
    work = copy_workflow(tmp_path / "work")
    (work / "tune.yaml").write_text(CONFIG)
    result = subprocess.run(
        [str(BIN / "snakemake"), "--cores", "1", "all", "--configfile", "tune.yaml"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    tuning = pd.read_parquet(work / "data" / "processed" / RUN / "tuning.parquet")
    per = tuning.groupby("setting").first()
    assert set(per.index) == {"luks-nowq", "luks-4k", "luks-key256"}
    # the skips in the raw data: the stack descriptions say what was not applied, and why
    manifest = next((work / "data" / "raw" / RUN).glob("*/fio/manifest.json"))
    notes = {
        name: desc["notes"]
        for name, desc in json.loads(manifest.read_text())["stack_descriptions"]["stacks"].items()
    }
    assert any("perf flags" in n and "skipped" in n for n in notes["luks-nowq"])
    assert any("plan asked 4096" in n for n in notes["luks-4k"])
    # decided from the descriptions' recorded settings, not from the notes' wording
    assert per.loc["luks-nowq", "not_applied"] == (
        "perf flag no_read_workqueue not applied: not recorded as applied; "
        "perf flag no_write_workqueue not applied: not recorded as applied"
    )
    assert per.loc["luks-4k", "not_applied"] == "sector_size 512, plan asked 4096"
    assert set(per.loc[["luks-nowq", "luks-4k"], "recommendation"]) == {"not measured"}
    # the one setting this backend applies is decided from its measured rows, as one family
    key256 = tuning[tuning["setting"] == "luks-key256"]
    assert per.loc["luks-key256", "not_applied"] == ""
    assert set(key256["metric"]) == {"bw_bytes", "clat_p99_ns", "busy_cpu_us_per_io"}
    assert set(key256.loc[key256["metric"] == "busy_cpu_us_per_io", "pattern"]) == {"equalload"}
    assert key256["ceiling_decision"].notna().all()
    m = int(key256["ci_low"].notna().sum())
    assert (key256["n_decisions"] == m).all() and m >= 2
    loss = pd.read_parquet(work / "data" / "processed" / RUN / "loss.parquet")
    row = key256[(key256["metric"] == "bw_bytes") & (key256["workload"] == "randread-4k-qd1")]
    row = row.iloc[0]
    alone = loss[
        (loss["baseline"] == "luks")
        & (loss["variant"] == "luks-key256")
        & (loss["metric"] == "bw_bytes")
        & (loss["workload"] == "randread-4k-qd1")
    ].iloc[0]
    # the family's interval holds the row's own 95 % interval
    assert row["ci_low"] < alone["ci_low"] and alone["ci_high"] < row["ci_high"]
    paper = (work / "paper" / RUN / "index.md").read_text()
    section = paper.split("## Recommended settings for this box")[1].split("\n## ")[0]
    recommendation = per.loc["luks-key256", "recommendation"]
    assert recommendation in ("recommended", "undecided", "no measured benefit", "costs")
    if recommendation == "recommended":  # the paper holds it to every metric (publish.recommend)
        ranked = "### 1. `luks-key256`: recommended"
        held = "### `luks-key256`: undecided (a gain, but undecided toward a material cost"
        assert ranked in section or held in section
    else:
        assert f"### `luks-key256`: {recommendation}" in section
    assert f"{row['ci_low']:,.1f}, {row['ci_high']:,.1f}]" in section  # tuning.parquet's interval
    assert f"These are {m} decisions" in section
    level = f"{100 * row['row_confidence']:.4g}"
    assert f"at {level} % (Bonferroni)" in section and "together at 95 %" in section
    assert "--key-size 256" in section
    assert re.search(r"\.\n\n\| metric \| cell \|", section)
    assert "**`luks-nowq` was not measured**" in section and "--perf-no_read_workqueue" in section
    assert "**`luks-4k` was not measured**" in section and "plan asked 4096" in section
    assert "cryptsetup 2." in section and "kernel " in section  # the versions measured
