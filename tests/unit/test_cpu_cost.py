"""CPU cost net of the idle baseline (utilisation and CPU per I/O beside CPU per GiB) and the
fixed-rate pattern's plan, schema and fio command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from testkit.plans import PLAN_CONFIG, validated

from luksbench.analysis import cpucost, ingest, stats
from luksbench.analysis.loss import write_loss
from luksbench.formats.layout import Workload
from luksbench.publish import catalog, paper_figures, text
from luksbench.publish.run import Run, load_run
from luksbench.testbox.planbuild import PlanError, check_patterns, resolve_patterns
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
    configured = validated({"patterns": {"fixedrate": PATTERN}})["patterns"]
    patterns = resolve_patterns(configured, {"ioengine": "libaio", "direct": True})
    assert patterns["fixedrate"]["rate_pct"] == 80
    fio = {**PLAN_CONFIG["fio"], "ioengine": "libaio", "direct": True, "output_format": "json+"}
    plan = {"fio": fio, "patterns": patterns}  # the validated config's fio section
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


def _runs(idle_by_session: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A fio table of two sessions (reps 1 and 2) of host h and its schedule, with each
    session's idle rates (None: the session recorded no baseline)."""
    reps = [1, 1, 2, 2]
    fio = pd.DataFrame(
        {
            "host": "h",
            "host_dir": "h",
            "stack": ["plain", "luks"] * 2,
            "workload": "read-4k-qd1",
            "rep": reps,
            "file": [f"f{i}" for i in range(4)],
            "cpu_interval_s": 2.0,
            "io_bytes": 2**30,
            "io_bs_bytes": 4096,
            "io_gib": 1.0,
            "busy_cpu_s": 3.0,
            "sys_cpu_s": 1.0,
            "busy_cpu_pct": 40.0,
        }
    )
    rates = [idle_by_session[r] or dict.fromkeys(cpucost.IDLE_COLUMNS, np.nan) for r in reps]
    schedule = fio[["host", "stack", "workload", "rep"]].assign(status="ok")
    schedule = pd.concat([schedule, pd.DataFrame(rates)], axis=1)
    return fio, schedule


def test_a_host_is_net_only_when_every_session_recorded_a_baseline():
    idle = cpucost.idle_rates(IDLE)
    fio, schedule = _runs({1: idle, 2: None})
    mixed = cpucost.with_cpu_cost(fio, schedule)
    # one session without a baseline: every value of the host gross, never gross beside net
    assert not mixed["cpu_net"].any()
    assert (mixed["busy_cpu_s_per_gib"] == 3.0).all() and (mixed["cpu_util_pct"] == 40.0).all()
    assert (mixed["sys_cpu_s_per_gib"] == 1.0).all()
    net = cpucost.with_cpu_cost(*_runs({1: idle, 2: idle}))
    assert net["cpu_net"].all()
    assert net["busy_cpu_s_per_gib"].to_numpy() == pytest.approx([2.5] * 4)
    assert net["cpu_util_pct"].to_numpy() == pytest.approx([27.5] * 4)


def _sample_fio() -> pd.DataFrame:
    return ingest.fio_table(SAMPLE, workers=1)


def test_a_cpu_cell_with_a_run_within_idle_noise_is_insufficient_not_thinned(tmp_path):
    fio = _sample_fio()
    cell = (fio["workload"] == "randread-4k-qd1") & (fio["stack"] == "plain")
    low = fio.index[cell & (fio["rep"] == 1)]
    for metric in ("busy_cpu_s_per_gib", "cpu_util_pct", "busy_cpu_us_per_io"):
        fio.loc[low, metric] = -0.01
    fio.to_parquet(tmp_path / "fio.parquet", index=False)
    table, _ = write_loss(tmp_path)
    cpu = table[table["metric"].isin(["busy_cpu_s_per_gib", "cpu_util_pct"])]
    hit = cpu[cpu["workload"] == "randread-4k-qd1"]
    assert len(hit) == 2
    assert (hit["n"] == 0).all() and (hit["decision"] == "insufficient").all()
    assert (hit["verdict"] == "insufficient").all()
    assert (hit["note"] == cpucost.NOT_ABOVE_IDLE).all()
    # the other cells keep every pair and no note; bandwidth of the same cell is untouched
    rest = cpu[cpu["workload"] != "randread-4k-qd1"]
    assert (rest["n"] == 3).all() and (rest["note"] == "").all()
    bw = table[(table["metric"] == "bw_bytes") & (table["workload"] == "randread-4k-qd1")]
    assert (bw["n"] == 3).all() and (bw["note"] == "").all()


def test_cpu_per_io_repeats_cpu_per_gib_and_is_no_second_hypothesis():
    table = stats.loss_table(_sample_fio())
    per_io = table[table["metric"] == "busy_cpu_us_per_io"]
    assert len(per_io) and (per_io["derived_from"] == "busy_cpu_s_per_gib").all()
    others = table[~table["metric"].isin(["busy_cpu_us_per_io", "iops"])]
    assert (others["derived_from"] == "").all()


def _processed(raw: Path, out: Path) -> Run:
    ingest.write_processed(raw, out, workers=1)
    write_loss(out)
    return load_run(out)


def test_cpu_captions_say_net_only_when_the_values_are(tmp_path, processed_sample):
    raw = tmp_path / "raw" / "idle"
    shutil.copytree(SAMPLE, raw)
    for p in [raw, *raw.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    gross = load_run(processed_sample)  # the sample recorded no idle baseline
    # one idle sample per round, as the runner takes them (one per session nets every pair alike:
    # those CPU intervals are withheld and their figures not drawn)
    for session in (raw / "vm" / "fio" / "sessions").glob("*.json"):
        doc = json.loads(session.read_text())
        rounds = sorted({r["round"] for r in doc["runs"]})
        samples = [{**IDLE, "busy_s": 0.5 + 0.01 * k, "round": k} for k in rounds]
        runs = [{**r, "cpu_idle_sample": rounds.index(r["round"])} for r in doc["runs"]]
        session.write_text(json.dumps({**doc, "cpu_idle_samples": samples, "runs": runs}))
    net = _processed(raw, tmp_path / "net")
    for run, words, not_words in (
        (gross, "gross: no idle baseline recorded", "net of"),
        (net, "net of the idle baseline", "gross"),
    ):
        specs = [s for s in catalog.figure_specs(run) if s.family == "cpu"]
        assert specs
        for spec in specs:
            fig = spec.draw(*(run.tables[t] for t in spec.tables), **spec.kwargs)
            title = fig._suptitle.get_text()
            assert words in title and not_words not in title, title
        figures_dir = tmp_path / "figures" / words[:5]
        figures_dir.mkdir(parents=True)
        entry = {"family": "cpu", "name": specs[0].name, "caption": "c", "files": ["x.png"]}
        (figures_dir / catalog.INDEX).write_text(json.dumps({"figures": [entry]}))
        sections = paper_figures.figure_sections(
            figures_dir, tmp_path / "p.md", text.cpu_net(run.fio)
        )
        assert words in sections[0]["intro"] and not_words not in sections[0]["intro"]
