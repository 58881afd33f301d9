"""An order effect inside pairs, injected into raw data laid out as the runner schedules it,
cancels from the loss estimate, and the order table measures it (seeded, through the CLI)."""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from simulate import _scale_fio_json

from luksbench import cli
from luksbench.analysis import ingest
from luksbench.analysis.loss import write_loss
from luksbench.formats.layout import Workload
from luksbench.testbox.runner import schedule

REPO = Path(__file__).resolve().parents[2]
SECOND_FASTER = 1.10  # the run second in its pair measures 10 % more throughput


def ordered_run(raw: Path, reps: int) -> Path:
    """The sample's plain results as both arms (true ratio 1), ``reps`` repetitions (rep 4 a copy
    of rep 1), laid out in the order schedule() gives; the second run of each pair scaled by
    SECOND_FASTER, and the manifest recording that schedule."""
    shutil.copytree(REPO / "data" / "raw" / "sample", raw)
    for p in [raw, *raw.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    fio = raw / "vm" / "fio"
    shutil.rmtree(fio / "sessions")
    manifest = json.loads((fio / "manifest.json").read_text())
    cells = [Workload.from_id(c) for c in manifest["cells"]]
    plan = {
        "seed": manifest["seed"],
        "repetitions": reps,
        "baseline": "plain",
        "stacks": {"plain": {}, "luks": {}},
        "matrix": {
            "rw": sorted({w.rw for w in cells}),
            "bs": sorted({w.bs for w in cells}),
            "iodepth": sorted({w.iodepth for w in cells}),
        },
    }
    runs = schedule(plan)
    originals = {  # read before any is rewritten
        (w.id, k): [
            (fio / "plain" / w.id / f"rep{k}{ext}").read_bytes() for ext in (".json", ".cpu.json")
        ]
        for w in cells
        for k in (1, 2, 3)
    }
    for r in runs:
        cell = r["workload"].id
        target = fio / r["stack"] / cell / f"rep{r['rep']}.json"
        result, sidecar = originals[cell, r["rep"] if r["rep"] <= 3 else 1]
        target.write_bytes(result)
        target.with_suffix(".cpu.json").write_bytes(sidecar)
        if r["position_in_cell"] == 1:
            _scale_fio_json(target, SECOND_FASTER)
        r["workload"] = cell
    manifest["repetitions"], manifest["runs"] = reps, runs
    (fio / "manifest.json").write_text(json.dumps(manifest))
    return raw


@pytest.mark.parametrize("reps", [3, 4])
def test_an_injected_order_effect_cancels_from_the_loss_and_is_measured(tmp_path, reps):
    raw = ordered_run(tmp_path / "raw" / "ordered", reps)
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["loss", str(raw), "--metric", "bw_bytes"]) == 0
    loss = pd.read_csv(io.StringIO(out.getvalue()))
    assert len(loss) == 16 and (loss["n"] == reps).all()
    per_pair = 100 * (SECOND_FASTER - 1)
    if reps % 2 == 0:  # balanced within every cell: no cell is biased
        assert np.allclose(loss["loss_pct"], 0, atol=1e-6), loss["loss_pct"]
    else:  # one extra pair per cell, half of the cells each way: cancels over the run
        assert (loss["loss_pct"].abs() > per_pair / reps / 2).all()
        assert abs(loss["loss_pct"].mean()) < 0.1 * per_pair / reps
        assert (loss["loss_pct"] > 0).sum() == (loss["loss_pct"] < 0).sum()
    processed = tmp_path / "processed"
    ingest.write_processed(raw, processed)
    write_loss(processed)
    order = pd.read_parquet(processed / "order.parquet").set_index("metric")
    row = order.loc["bw_bytes"]
    assert row["n_cells"] == 16 and row["n_in_order"] == row["n_reversed"] == 16 * reps // 2
    assert row["order_pct"] == pytest.approx(per_pair, rel=1e-6)
    assert row["ci_low"] <= row["order_pct"] <= row["ci_high"]
    # latency of the scaled runs is unchanged: no order effect there
    assert order.loc["clat_p50_ns", "order_pct"] == pytest.approx(0, abs=1e-9)


def test_the_paper_states_the_measured_order_effect(tmp_path):
    from luksbench.publish.paper_sentences import order_effect_phrases

    raw = ordered_run(tmp_path / "raw" / "ordered", 4)
    processed = tmp_path / "processed"
    ingest.write_processed(raw, processed)
    write_loss(processed)
    words = order_effect_phrases(pd.read_parquet(processed / "order.parquet"), "plain", "luks")
    assert "Bandwidth 10.0 % [10.0, 10.0] over 16 cells" in words
