"""fio job options: the config and plan keys, fio's command line, NUMA pinning from sysfs, the
saturation flags and the paper's list of limited cells."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
from snakemake.utils import validate
from testkit.testbox import loop_plan

from luksbench.analysis import saturation
from luksbench.analysis.ingest_tables import plan_frames
from luksbench.formats.layout import Workload
from luksbench.publish.paper import job_devices
from luksbench.publish.paper_tables import limited_cells, unchecked_cells
from luksbench.studies import available_studies, load_config
from luksbench.testbox import jobs
from luksbench.testbox.planbuild import (
    PlanError,
    cell_options,
    check_plan,
    plan_from_config,
    workloads,
)
from luksbench.testbox.runner import fio_argv

REPO = Path(__file__).resolve().parents[2]
CELL = Workload("randread", 4096, 32)


def argv(plan: dict, w: Workload = CELL) -> list[str]:
    return fio_argv(plan, {"device": "/dev/null"}, "plain", w, Path("/tmp/out.json"), 0)


def test_one_job_keeps_group_reporting_and_several_get_their_own_entries(tmp_path):
    plan = loop_plan("r", tmp_path)
    assert {"--numjobs=1", "--group_reporting"} <= set(argv(plan))
    plan["fio"].update(numjobs=4, cpus_allowed="0-3", cpus_allowed_policy="split")
    check_plan(plan)
    args = argv(plan)
    assert {"--numjobs=4", "--cpus_allowed=0-3", "--cpus_allowed_policy=split"} <= set(args)
    assert "--group_reporting" not in args


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("numjobs", 0),
        ("numjobs", "4"),
        ("numjobs", 257),
        ("cpus_allowed", "0-3; rm -rf /"),
        ("hipri", "yes"),
    ],
)
def test_a_bad_job_option_is_refused_naming_the_key(tmp_path, key, value):
    plan = loop_plan("r", tmp_path)
    plan["fio"][key] = value
    with pytest.raises(PlanError, match=rf"fio\.{key}: "):
        check_plan(plan)
    with pytest.raises(Exception, match="Error validating"):  # the schema refuses it too
        validate({"fio": {key: value}}, str(REPO / "workflow/schemas/config.schema.yaml"))


def test_several_jobs_need_json_plus_output_so_percentiles_come_from_merged_histograms(tmp_path):
    plan = loop_plan("r", tmp_path)
    plan["fio"].update(numjobs=256, output_format="json+")
    check_plan(plan)
    plan["fio"]["output_format"] = "json"
    with pytest.raises(PlanError, match=r"fio\.numjobs: 256 jobs need fio\.output_format json\+"):
        check_plan(plan)
    plan["fio"]["numjobs"] = 1
    check_plan(plan)
    plan["patterns"] = {"many": {"description": "", "matrix": {"rw": ["read"], "bs": ["4k"]}}}
    plan["patterns"]["many"]["matrix"]["iodepth"] = [1]
    plan["patterns"]["many"] |= {"io_bs": "", "fsync_per_block": False}
    plan["patterns"]["many"]["fio"] = {"ioengine": "psync", "direct": True, "sync": False}
    check_plan(plan)
    plan["patterns"]["many"]["fio"]["numjobs"] = 2
    with pytest.raises(PlanError, match=r"patterns\.many\.fio\.numjobs: 2 jobs need"):
        check_plan(plan)


def test_options_the_engine_lacks_are_skipped_with_the_reason(tmp_path):
    plan = loop_plan("r", tmp_path)
    plan["fio"].update(fixedbufs=True, hipri=True)
    setup = jobs.job_setup(cell_options(plan, CELL), {"plain": "/dev/null"})
    assert setup["skipped"] == {
        "fixedbufs": "ioengine libaio has no fixedbufs (io_uring only)",
        "hipri": "ioengine libaio has no hipri (io_uring only)",
    }
    assert not any(a.startswith(("--fixedbufs", "--hipri")) for a in argv(plan))
    plan["fio"]["ioengine"] = "io_uring"
    setup = jobs.job_setup(cell_options(plan, CELL), {"plain": "/dev/null"})
    assert setup["args"] == ["--fixedbufs=1"] and list(setup["skipped"]) == ["hipri"]


def fake_sys(root: Path, target: Path) -> None:
    """A sysfs tree where ``target``'s file system sits on dm-0 over nvme0n1 on NUMA node 1."""
    st = os.stat(target)
    nvme = root / "devices/pci0000:00/0000:00:01.0/nvme/nvme0/nvme0n1"
    (nvme / "device").mkdir(parents=True)
    (nvme / "device/numa_node").write_text("1\n")
    (nvme / "queue").mkdir()
    (nvme / "queue/scheduler").write_text("[none] mq-deadline\n")
    (nvme / "queue/io_poll").write_text("1\n")
    for q in range(3):
        (nvme / "mq" / str(q)).mkdir(parents=True)
    dm = root / "devices/virtual/block/dm-0"
    (dm / "slaves").mkdir(parents=True)
    (dm / "slaves/nvme0n1").symlink_to(nvme)
    (root / "dev/block").mkdir(parents=True)
    (root / "dev/block" / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}").symlink_to(dm)
    (root / "devices/system/node/node1").mkdir(parents=True)
    (root / "devices/system/node/node1/cpulist").write_text("8-15\n")


def test_jobs_are_pinned_to_the_numa_node_under_a_device_mapper_stack(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"")
    fake_sys(tmp_path / "sys", target)
    plan = loop_plan("r", tmp_path)
    plan["fio"].update(numa_pin=True, ioengine="io_uring", hipri=True)
    setup = jobs.job_setup(cell_options(plan, CELL), {"luks": str(target)}, tmp_path / "sys")
    assert setup["numa_nodes"] == {"luks": 1} and setup["cpus_allowed"] == "8-15"
    assert setup["args"] == ["--cpus_allowed=8-15", "--cpus_allowed_policy=shared"]
    # polling is the top device's: dm-0 has no poll queues here, though the nvme below has
    assert "no poll queues" in setup["skipped"]["hipri"]
    facts = jobs.queue_facts(str(target), tmp_path / "sys")
    assert (facts["block_device"], facts["numa_node"]) == ("dm-0", 1)
    # the node is recorded without pinning too; a device without one runs unpinned, reason kept
    plan["fio"]["numa_pin"] = False
    setup = jobs.job_setup(cell_options(plan, CELL), {"luks": str(target)}, tmp_path / "sys")
    assert setup["numa_nodes"] == {"luks": 1}
    plan["fio"]["numa_pin"] = True
    setup = jobs.job_setup(cell_options(plan, CELL), {"luks": str(target)}, tmp_path / "nothing")
    assert setup["cpus_allowed"] == "" and "no NUMA node" in setup["skipped"]["numa_pin"]


def test_job_options_are_decided_once_for_all_the_stacks_of_a_cell(tmp_path):
    target, sys_root = tmp_path / "target", tmp_path / "sys"
    target.write_bytes(b"")
    fake_sys(sys_root, target)  # the luks arm: dm-0 (no poll queues) over nvme0n1
    raw = os.stat("/dev").st_dev  # the raw arm: a file system on nvme0n1 itself (polled)
    assert raw != os.stat(target).st_dev
    nvme = next(sys_root.glob("devices/pci*/**/nvme0n1"))
    (sys_root / "dev/block" / f"{os.major(raw)}:{os.minor(raw)}").symlink_to(nvme)
    plan = loop_plan("r", tmp_path)
    plan["fio"].update(numa_pin=True, ioengine="io_uring", hipri=True)
    cell = cell_options(plan, CELL)
    assert "--hipri=1" in jobs.job_setup(cell, {"raw": "/dev"}, sys_root)["args"]
    both = jobs.job_setup(cell, {"raw": "/dev", "luks": str(target)}, sys_root)
    assert "--hipri=1" not in both["args"] and both["skipped"]["hipri"].startswith("stack luks:")
    assert both["numa_nodes"] == {"raw": 1, "luks": 1} and both["cpus_allowed"] == "8-15"
    # one stack without a NUMA node: no stack is pinned, the reason names it
    three = jobs.job_setup(cell, {"raw": "/dev", "luks": str(target), "x": "/none"}, sys_root)
    assert three["cpus_allowed"] == "" and three["skipped"]["numa_pin"].startswith("stack x:")
    assert not any(a.startswith("--cpus_allowed") for a in three["args"])


def test_nvme_saturate_and_the_tuning_study_add_jobs_and_the_seed_studies_keep_one(tmp_path):
    for study in available_studies(REPO / "config/studies"):
        mybox = tmp_path / f"{study}.yaml"
        mybox.write_text(f"study: {study}\n")
        plain = plan_from_config(load_config(REPO, [mybox]), "h", tmp_path)
        numjobs = {w.pattern: cell_options(plain, w)["numjobs"] for w in workloads(plain)}
        if study == "tune-dmcrypt":  # 4k cells with 4 jobs, each its own CPU of the node
            assert numjobs == {"": 4, "equalload": 4, "seq": 1}
            assert plain["fio"]["numa_pin"] and plain["fio"]["cpus_allowed_policy"] == "split"
        else:
            assert plain["fio"]["numjobs"] == 1 and not plain["fio"]["numa_pin"]
            assert set(numjobs.values()) == {1}
        config = load_config(REPO, [mybox, REPO / "config/nvme-saturate.yaml"])
        plan = plan_from_config(config, "h", tmp_path)
        added = set(workloads(plan)) - set(workloads(plain))
        assert {w.pattern for w in added} == {"saturate"} and len(added) == 2
        assert all(cell_options(plan, w)["numjobs"] == 4 for w in added)
        assert all(cell_options(plan, w)["numa_pin"] for w in added)


def test_flags_follow_the_busiest_job_and_the_machine_and_reach_the_loss_rows():
    fio = pd.DataFrame(
        {
            "host": "h",
            "workload": "w",
            "job_slot": 0,
            "direction": "read",
            "stack": ["plain", "plain", "plain", "luks"],
            "file": ["a", "a", "b", "c"],
            "usr_cpu": [20.0, 60.0, 10.0, 80.0],
            "sys_cpu": [10.0, 35.0, 10.0, 19.0],
            "busy_cpu_pct": [50.0, 50.0, 95.0, 99.0],
        }
    )
    flagged = saturation.with_flags(fio)
    assert flagged["fio_bound"].tolist() == [True, True, False, True]  # a: one job at 95 %
    assert flagged["cpu_saturated"].tolist() == [False, False, True, True]
    loss = pd.DataFrame(
        {"host": "h", "workload": "w", "job_slot": 0, "direction": "read"}
        | {"baseline": ["plain"], "variant": ["luks"]}
    )
    flags = saturation.loss_flags(loss, flagged).iloc[0]
    assert bool(flags["fio_bound"]) and bool(flags["cpu_saturated"])
    assert flags["baseline_job_cpu_pct"] == 95.0 and flags["baseline_busy_pct"] == 95.0
    listed = limited_cells(pd.concat([loss, saturation.loss_flags(loss, flagged)], axis=1))
    assert listed == [
        {
            "host": "h",
            "comparison": "`luks` vs `plain`",
            "cell": "w read",
            "limit": "fio-bound, CPU saturated",
            "bias": "unknown: may be over- or understated",  # a saturated CPU: either way
            "job_cpu": "95",
            "busy": "95",
        }
    ]
    calm = saturation.with_flags(fio.assign(usr_cpu=10.0, sys_cpu=5.0, busy_cpu_pct=40.0))
    quiet = pd.concat([loss, saturation.loss_flags(loss, calm)], axis=1)
    assert not quiet["fio_bound"].iloc[0] and not limited_cells(quiet)
    assert unchecked_cells(quiet) == 0
    # a baseline without fio's CPU or a sidecar is not "not limited": it is unchecked
    blind = saturation.with_flags(fio.assign(usr_cpu=None, busy_cpu_pct=None))
    assert unchecked_cells(pd.concat([loss, saturation.loss_flags(loss, blind)], axis=1)) == 1


def test_the_environment_appendix_lists_each_device_with_its_queues_and_the_jobs_cpus(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"")
    fake_sys(tmp_path / "sys", target)
    plan = loop_plan("r", tmp_path, devices={"d0": {"path": str(target)}})
    plan["fio"]["numa_pin"] = True
    facts = jobs.device_facts(plan, cell_options(plan, CELL), tmp_path / "sys")
    env = plan_frames("r", "h", {"job_devices": facts})["job_devices"]  # as ingest writes it
    expected = [
        {
            "host": "h",
            "device": "a planned device, `dm-0`",  # no path of the measuring machine
            "numa_node": "1",
            "queues": "n/a",  # dm-0 has no hardware queues of its own
            "scheduler": "n/a",
            "poll": "no",
            "cpus": "8-15",
        }
    ]
    assert job_devices(env) == expected
    # the path only where the user asks for it (config paper.machine_paths)
    assert job_devices(env, machine_paths=True) == [expected[0] | {"device": f"`{target}` (dm-0)"}]


def test_luksbench_loss_prints_the_baselines_flags_as_the_loss_table_has_them(tmp_path, capsys):
    import io

    from luksbench import cli
    from luksbench.analysis import ingest, loss

    sample = REPO / "data" / "raw" / "sample"
    assert cli.main(["loss", str(sample), "--metric", "bw_bytes"]) == 0
    printed = pd.read_csv(io.StringIO(capsys.readouterr().out))
    ingest.write_processed(sample, tmp_path)
    loss.write_loss(tmp_path)
    table = pd.read_parquet(tmp_path / "loss.parquet")
    table = table[(table["metric"] == "bw_bytes") & (table["variant"] == "luks")]
    assert set(saturation.LOSS_FLAG_COLUMNS) <= set(printed.columns)
    keys = ["host", "workload", "direction"]
    flags = ["fio_bound", "cpu_saturated"]
    merged = printed[keys + flags].merge(table[keys + flags], on=keys, suffixes=("", "_table"))
    assert len(merged) == len(printed) > 0
    for flag in flags:
        assert (merged[flag] == merged[f"{flag}_table"]).all(), flag
