"""The fixed design and the adaptive design's stage 2, with flagged pairs measured again: run
``luksbench testbox run-fio`` (with stage 2's targets, if any), ingest, write the re-measure
document (:func:`luksbench.analysis.remeasure.write_remeasure_targets`), run-fio ``--targets``
it, again until every cell has its pairs (the cap bounds the replacements).

Kept out of :mod:`luksbench.analysis` so that the analysis only looks and decides; this module
drives the test box, as :mod:`luksbench.orchestrate.sequential` does for the sequential design.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd

from luksbench.analysis.remeasure import design_pairs, write_remeasure_targets
from luksbench.formats.remeasure import remeasure_path
from luksbench.formats.targets import read_targets


def _fio(raw_dir: Path, fio_dir: Path) -> pd.DataFrame:
    """The run's ingested fio table (ingest is the one reader of raw); empty before any result."""
    from luksbench.analysis.ingest import fio_table

    return fio_table(raw_dir) if any(fio_dir.glob("*/*/rep*.json")) else pd.DataFrame()


def run_fio_rule(input, output, params, host: str, log) -> dict | None:
    """The workflow's ``run_fio`` rule: its plan, state and stack description, the raw folder, the
    cells, the adaptive targets (if any) and the design (repetitions, sessions,
    remeasure_flagged_max) to :func:`measure_and_remeasure`."""
    stacks = ("--plan", input.plan, "--state", params.state, "--describe", input.stacks)
    targets = params.targets[0] if params.targets else None
    return measure_and_remeasure(
        params.raw_dir,
        host,
        output.manifest,
        log,
        stacks,
        cells=params.cells,
        targets=targets,
        **params.design,
    )


def measure_and_remeasure(
    raw_dir,
    host: str,
    manifest,
    log,
    stacks: tuple,
    *,
    cells: list[str],
    repetitions: int,
    sessions: int = 1,
    targets=None,
    remeasure_flagged_max: int = 0,
) -> dict | None:
    """The workflow's run_fio: measure every cell (``targets``: stage 2's file, else the plan's
    repetitions), then replace flagged pairs (``remeasure_flagged_max`` 0: never; with sessions
    >= 2 not done, as a top-up would open stack-ups of its own); run-fio's output to ``log``.
    The re-measure document, or None when there was none to make. An interrupted run resumes:
    every pass starts from the raw results."""
    raw_dir, manifest, log = Path(raw_dir), Path(manifest), Path(log)
    fio_dir = raw_dir / host / "fio"
    run_fio = ["testbox", "run-fio", *map(str, stacks), "--raw-host-dir", str(raw_dir / host)]
    run_fio += ["--manifest", str(manifest)]
    log.parent.mkdir(parents=True, exist_ok=True)

    def measure(*options: str) -> None:
        """run-fio in a job shell, as a shell rule runs it: its progress to ``log`` and the
        terminal (a real run takes hours). tee ignores the stop signals and ends with run-fio's
        output: how an interrupted run unwound is logged too."""
        argv = [sys.executable, "-m", "luksbench.cli", *run_fio, *options]
        tee = f"(trap '' INT TERM; exec tee -a {shlex.quote(str(log))} >&2)"
        script = f"set -o pipefail; {shlex.join(argv)} 2>&1 | {tee}"
        subprocess.run(["bash", "-c", script], check=True)

    stage2 = {w: t[0] for w, t in read_targets(Path(targets)).items()} if targets else None
    design = design_pairs(cells, repetitions, stage2)
    replacing = remeasure_flagged_max > 0 and sessions == 1
    path = remeasure_path(raw_dir / host)
    if replacing:  # written first: a run stopped before the replacements is not final
        write_remeasure_targets(_fio(raw_dir, fio_dir), host, path, design, 0)
    measure(*(("--targets", str(targets)) if targets else ()))
    if not replacing:
        if remeasure_flagged_max > 0:
            _note(log, "flagged pairs not re-measured: sessions >= 2")
        return None
    return _replace_flagged(raw_dir, host, path, design, remeasure_flagged_max, measure, log)


def _note(log: Path, line: str) -> None:
    """One line of progress to the rule's log and the terminal."""
    with open(log, "a") as out:
        print(line, file=out)
    print(line, file=sys.stderr, flush=True)


def _replace_flagged(raw_dir, host, path, design, most, measure, log) -> dict:
    """Ingest, write the re-measure document, measure what it adds; until nothing is missing."""
    fio_dir = Path(raw_dir) / host / "fio"
    last = None
    while True:
        doc = write_remeasure_targets(_fio(raw_dir, fio_dir), host, path, design, most)
        flagged = sum(c["flagged_pairs"] for c in doc["cells"].values())
        again = sum(c["remeasured_pairs"] for c in doc["cells"].values())
        _note(log, f"re-measure: {flagged} flagged pair(s), {again} measured again so far")
        if doc["done"]:
            return doc
        if doc["pairs"] == last:
            raise RuntimeError(f"re-measuring flagged pairs measured nothing new; see {log}")
        last = doc["pairs"]
        measure("--targets", str(path))
