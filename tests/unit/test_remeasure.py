"""Flagged pairs measured again (the fixed design, adaptive stage 2): the re-measure targets from
an ingested table, capped; the file's reader; and, seeded through the CLI, the share of cells a
fixed design decides when 5 % of runs are 30 % slow and flagged, left out vs measured again."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from simulate import cli, simulate_logs, write_raw_reps, wrong_decision

from luksbench.analysis.ingest import fio_table
from luksbench.analysis.remeasure import design_pairs, remeasure_targets, write_remeasure_targets
from luksbench.analysis.sequential import DECIDED
from luksbench.formats.remeasure import read_remeasured, remeasure_path, remeasure_pending
from luksbench.formats.targets import TargetsError, read_targets


def flagged_table(pairs: int, flagged: dict[str, list[tuple[str, int, str]]]) -> pd.DataFrame:
    """Two cells a, b with ``pairs`` pairs of plain and luks; ``flagged``: cell -> (stack, rep,
    flag) runs fio flagged (flag: "error" or "ss")."""
    rows = []
    for w in ("a", "b"):
        for rep in range(1, pairs + 1):
            for stack in ("plain", "luks"):
                rows.append({"host": "h", "stack": stack, "workload": w, "rep": rep})
                rows[-1].update(error=0, ss_attained=math.nan, bw_bytes=1e9)
                for s, r, flag in flagged.get(w, []):
                    if (s, r) == (stack, rep):
                        rows[-1].update({"error": 5} if flag == "error" else {"ss_attained": 0})
    return pd.DataFrame(rows)


def test_each_flagged_pair_gets_a_new_pair_up_to_the_cap():
    # a: rep 2 flagged in both stacks (one pair), rep 3 an error; b: nothing flagged
    fio = flagged_table(3, {"a": [("plain", 2, "ss"), ("luks", 2, "ss"), ("luks", 3, "error")]})
    doc = remeasure_targets(fio, "h", {"a": 3, "b": 3}, 5)
    assert doc["pairs"] == {"a": 5, "b": 3}
    assert doc["cells"]["a"] == {
        "design_pairs": 3,
        "flagged_pairs": 2,
        "measured_pairs": 3,
        "remeasured_pairs": 0,
    }
    assert not doc["done"]
    capped = remeasure_targets(fio, "h", {"a": 3, "b": 3}, 1)
    assert capped["pairs"] == {"a": 4, "b": 3}
    assert remeasure_targets(fio, "h", {"a": 3, "b": 3}, 0)["pairs"] == {"a": 3, "b": 3}
    assert remeasure_targets(fio, "h", {"a": 3, "b": 3}, 0)["done"]


def test_a_replacement_flagged_again_is_replaced_while_the_cap_allows():
    once = flagged_table(4, {"a": [("luks", 2, "ss")]})
    doc = remeasure_targets(once, "h", {"a": 3, "b": 3}, 2)
    assert doc["done"] and doc["pairs"]["a"] == 4 and doc["cells"]["a"]["remeasured_pairs"] == 1
    # b got no replacement, so its fourth pair is no re-measured one
    assert doc["cells"]["b"]["remeasured_pairs"] == 0
    twice = flagged_table(4, {"a": [("luks", 2, "ss"), ("plain", 4, "error")]})
    doc = remeasure_targets(twice, "h", {"a": 3, "b": 3}, 2)
    assert doc["pairs"]["a"] == 5 and not doc["done"]
    thrice = flagged_table(5, {"a": [("luks", 2, "ss"), ("plain", 4, "error"), ("luks", 5, "ss")]})
    doc = remeasure_targets(thrice, "h", {"a": 3, "b": 3}, 2)
    assert doc["pairs"]["a"] == 5 and doc["done"], "the cap bounds the replacements"
    assert doc["cells"]["a"]["remeasured_pairs"] == 2


def test_stage_two_targets_are_the_design_and_other_hosts_do_not_count():
    assert design_pairs(["a", "b", "c"], 3, {"a": 7, "b": 2}) == {"a": 7, "b": 3, "c": 3}
    fio = flagged_table(3, {"a": [("luks", 1, "ss")]})
    other = fio.assign(host="g")
    doc = remeasure_targets(pd.concat([fio, other]), "g", {"a": 7, "b": 3}, 2)
    assert doc["pairs"] == {"a": 8, "b": 3}
    assert remeasure_targets(fio, "g", {"a": 7}, 2)["cells"]["a"]["measured_pairs"] == 0
    with pytest.raises(ValueError, match="remeasure_flagged_max"):
        remeasure_targets(fio, "h", {"a": 3}, -1)


def test_a_fleet_run_is_counted_by_its_raw_host_folder_not_its_servers():
    # fleet mode: every repetition holds one row per fio server, all under the coordinator's folder
    fio = flagged_table(3, {"a": [("luks", 2, "ss")]})
    fleet = pd.concat([fio.assign(host=server) for server in ("10.0.0.1:8765", "10.0.0.2:8765")])
    fleet = fleet.assign(host_dir="vm")
    doc = remeasure_targets(fleet, "vm", {"a": 3, "b": 3}, 2)
    assert doc["cells"]["a"] == {
        "design_pairs": 3,
        "flagged_pairs": 1,
        "measured_pairs": 3,
        "remeasured_pairs": 0,
    }
    assert doc["pairs"] == {"a": 4, "b": 3} and not doc["done"]
    assert remeasure_targets(flagged_table(3, {}).assign(host_dir="vm"), "vm", {"a": 3}, 2)["done"]


def test_the_file_is_a_targets_file_for_the_runner_and_counts_for_ingest(tmp_path):
    fio = flagged_table(3, {"a": [("luks", 1, "ss")]})
    path = remeasure_path(tmp_path / "h")
    assert not remeasure_pending(tmp_path / "h")
    write_remeasure_targets(fio, "h", path, {"a": 3, "b": 3}, 2)
    assert {w: t[0] for w, t in read_targets(path).items()} == {"a": 4, "b": 3}
    assert read_remeasured(path) == {"a": 0, "b": 0}
    assert remeasure_pending(tmp_path / "h")
    write_remeasure_targets(flagged_table(4, {}), "h", path, {"a": 3, "b": 3}, 2)
    assert not remeasure_pending(tmp_path / "h")
    doc = json.loads(path.read_text())
    doc["cells"]["a"]["remeasured_pairs"] = -1
    path.write_text(json.dumps(doc))
    with pytest.raises(TargetsError, match="remeasured_pairs of 'a'"):
        read_remeasured(path)


def fixed_run(raw, logs, unsettled, cells: int, pairs: int, most: int) -> pd.DataFrame:
    """A fixed design of ``pairs`` pairs written in the raw layout, then, with ``most`` > 0,
    topped up from the re-measure file (written from the ingested table) until done; the loss
    table from ``luksbench loss``."""
    import io

    write_raw_reps(raw, logs, [range(1, pairs + 1)] * cells, unsettled=unsettled)
    design = {f"randread-4k-qd{w + 1}": pairs for w in range(cells)}
    path = remeasure_path(raw / "sim")
    for _ in range(most + 1):
        doc = write_remeasure_targets(fio_table(raw), "sim", path, design, most)
        if doc["done"]:
            break
        wanted = [range(1, doc["pairs"][w] + 1) for w in design]
        write_raw_reps(raw, logs, wanted, unsettled=unsettled)
    assert doc["done"]
    table = pd.read_csv(io.StringIO(cli("loss", raw, "--metric", "bw_bytes")))
    return table.sort_values("iodepth").reset_index(drop=True)


@pytest.mark.slow
def test_flagged_runs_measured_again_keep_the_fixed_designs_decisions(tmp_path):
    """200 cells, 3 pairs, sd(d) 0.01-0.05, true losses 0-25 %, 5 % of runs 30 % slow and flagged
    (steady state not attained), through ``luksbench loss``: left out (remeasure_flagged_max 0)
    and measured again (2). The flagged pairs are left out either way; measured again, the cells
    keep their 3 pairs and the share decided is near the clean run's."""
    cells, pairs, room = 200, 3, 5
    rng = np.random.default_rng(2812)
    sd_d = np.exp(rng.uniform(math.log(0.01), math.log(0.05), cells))
    true_loss = rng.uniform(0, 25, cells)
    lb, lv = simulate_logs(rng, cells, room, sd_d / math.sqrt(2), np.log1p(-true_loss / 100), 0)
    flags = {s: rng.random(lb.shape) < 0.05 for s in ("plain", "luks")}
    clean = {s: np.zeros(lb.shape, bool) for s in flags}
    shares, wrong = {}, {}
    arms = [("clean", clean, clean, 0), ("kept", flags, clean, 0)]
    arms += [("left out", flags, flags, 0), ("again", flags, flags, 2)]
    for name, slow_runs, unsettled, most in arms:  # kept: slow, but fio flagged nothing
        slow = {s: np.log(0.7) * slow_runs[s] for s in flags}
        logs = {"plain": lb + 18 + slow["plain"], "luks": lv + 18 + slow["luks"]}
        loss = fixed_run(tmp_path / name.replace(" ", "-"), logs, unsettled, cells, pairs, most)
        shares[name] = loss["decision"].isin(DECIDED).mean()
        wrong[name] = wrong_decision(loss["decision"], true_loss).mean()
        if name == "again":
            flagged_pairs = (flags["plain"] | flags["luks"])[:, :pairs].sum(axis=1)
            assert (loss["remeasured_pairs"] > 0).sum() >= (flagged_pairs > 0).sum()
            assert (loss["n"] + loss["n_ss_not_attained"] >= pairs).all()
            assert (loss["n"][loss["remeasured_pairs"] < 2] == pairs).all()
        else:
            assert (loss["remeasured_pairs"] == 0).all()
    print(f"share decided (fixed design, 3 pairs): {shares}; wrong decisions: {wrong}")
    assert shares["again"] >= shares["clean"] - 0.02, shares
    assert shares["again"] > shares["left out"] + 0.02, shares
    assert wrong["again"] <= 0.05, wrong


def test_the_measurement_is_final_only_once_the_flagged_pairs_were_measured_again(tmp_path):
    """A complete manifest of the fixed design is final only when no re-measure is pending (else
    a run interrupted between its pairs and their replacements would never replace them)."""
    from testkit.plans import PLAN_CONFIG as CONFIG

    from luksbench.testbox.planbuild import plan_from_config, workloads
    from luksbench.testbox.runner import measurement_final

    plan = plan_from_config(CONFIG, "box1", tmp_path)
    fio = tmp_path / "fio"
    fio.mkdir()
    (tmp_path / "env.json").write_text(json.dumps({"plan": plan}))
    cells = [w.id for w in workloads(plan)]
    manifest = {"complete": True, "cells": cells, "repetitions": plan["repetitions"]}
    manifest.update(adaptive=plan.get("adaptive"), stacks=list(plan["stacks"]))
    (fio / "manifest.json").write_text(json.dumps(manifest))
    final = lambda: measurement_final(plan, fio / "manifest.json", tmp_path / "env.json")  # noqa: E731
    assert final(), "a run without a re-measure file (remeasure_flagged_max 0, older runs)"
    design = dict.fromkeys(cells, plan["repetitions"])
    table = flagged_table(plan["repetitions"], {}).assign(host="box1", workload=cells[0])
    write_remeasure_targets(table, "box1", remeasure_path(tmp_path), design, 2)
    assert not final(), "cells without their pairs yet"
    full = pd.concat([table.assign(workload=w) for w in cells])
    write_remeasure_targets(full, "box1", remeasure_path(tmp_path), design, 2)
    assert final()
    (fio / "remeasure.json").write_text("{")
    assert not final(), "an unreadable file is no finished re-measure"
