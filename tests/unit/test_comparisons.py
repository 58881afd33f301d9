"""Several comparisons, pattern cells and unavailable stacks, from config to paper (issue 3).

The run is the shipped sample (real fio json+ output of ``plain`` and ``luks``) reduced to three
cells, with known additions (``tests/simulate.py::derived_run``): ``raid0`` is an exact copy of
``plain``, ``raid0-luks`` a copy of ``plain`` whose throughput is scaled by 0.5, 0.55 and 0.45 in
repetitions 1-3 (true loss against ``raid0``: 1 - geometric mean), the cell randwrite-1m-qd1 is
copied as the ``largeblock`` pattern cell with ``luks`` scaled by 0.9 and other job options
(psync, buffered), and the optional stack ``null-cipher`` could not be built.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from simulate import derived_run
from testkit.workflow import copy_workflow

from luksbench.analysis import contrasts as comparisons
from luksbench.analysis import design as adaptive
from luksbench.analysis import ingest, stats
from luksbench.analysis.loss import write_loss
from luksbench.publish import catalog, render
from luksbench.publish.ceilings import crypto_ceilings
from luksbench.publish.text import cell_name, fmt_ci, fmt_num, fmt_pct

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"
BIN = Path(sys.executable).parent

RAID0_LUKS_FACTORS = [0.5, 0.55, 0.45]
TRUE_RAID0_LUKS_LOSS = 100 * (1 - math.prod(RAID0_LUKS_FACTORS) ** (1 / 3))
LARGEBLOCK_LUKS_FACTOR = 0.9
REASON = "cryptsetup open: cipher_null-ecb is not offered by this kernel"
LARGEBLOCK = {
    "from": "randwrite-1m-qd1",
    "factors": {"luks": [LARGEBLOCK_LUKS_FACTOR] * 3},
    "options": {"ioengine": "psync", "direct": "0"},
    "plan": {
        "description": "8 KiB buffered writes, an fsync, a seek to the next large block",
        "io_bs": "8k",
        "fsync_per_block": True,
        "fio": {"ioengine": "psync", "direct": False, "sync": False},
    },
}
#: headline named second on purpose: the loss table and the paper put it first
COMPARISONS = [
    {"baseline": "raid0", "variant": "raid0-luks"},
    {"baseline": "plain", "variant": "luks"},
    {"baseline": "luks", "variant": "raid0-luks"},
]
PAIRS = [("plain", "luks"), ("raid0", "raid0-luks"), ("luks", "raid0-luks")]


# ------------------------------------------------------------------------------- config checks

STACKS = ["raw", "luks", "raid0", "raid0-luks"]


def test_empty_comparisons_are_every_stack_against_the_baseline_headline_first():
    assert comparisons.check(STACKS, "raw", "raid0-luks", []) == [
        ("raw", "raid0-luks"),
        ("raw", "luks"),
        ("raw", "raid0"),
    ]


def test_the_headline_is_the_variant_if_listed_else_the_first_comparison():
    given = [{"baseline": "raid0", "variant": "raid0-luks"}, {"baseline": "raw", "variant": "luks"}]
    assert comparisons.check(STACKS, "raw", "luks", given) == [
        ("raw", "luks"),
        ("raid0", "raid0-luks"),
    ]
    # analysis.variant (default luks) against a baseline it is not compared with: first listed
    assert comparisons.check(STACKS, "raid0", "luks", given)[0] == ("raid0", "raid0-luks")


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (
            [{"baseline": "raw", "variant": "luks"}, {"baseline": "raw", "variant": "lusk"}],
            "analysis.comparisons[1].variant: no stack 'lusk'",
        ),
        ([{"baseline": "rwa", "variant": "luks"}], "analysis.comparisons[0].baseline: no stack"),
        ([{"baseline": "luks", "variant": "luks"}], "analysis.comparisons[0].variant: 'luks' is"),
        (
            [{"baseline": "raw", "variant": "luks"}, {"baseline": "raw", "variant": "luks"}],
            "analysis.comparisons[1]: `luks` against `raw` repeats analysis.comparisons[0]",
        ),
        ([{"baseline": "raw"}], "analysis.comparisons[0].variant must name a stack"),
    ],
)
def test_a_bad_comparison_names_its_key(given, named):
    with pytest.raises(comparisons.ComparisonError) as err:
        comparisons.check(STACKS, "raw", "luks", given)
    assert named in str(err.value)


def test_with_no_comparisons_the_variant_must_be_a_stack():
    with pytest.raises(comparisons.ComparisonError, match=r"analysis\.variant: 'luks2' is not"):
        comparisons.check(STACKS, "raw", "luks2", [])


def test_with_comparisons_the_variant_must_still_be_a_stack():
    """It reaches the notebooks' command line: a value that is no stack is refused."""
    given = [{"baseline": "raw", "variant": "luks"}]
    with pytest.raises(comparisons.ComparisonError, match=r"analysis\.variant: no stack 'luks; "):
        comparisons.check(STACKS, "raw", "luks; touch pwned", given)


@pytest.mark.slow
def test_the_workflow_refuses_a_bad_comparison_before_anything_runs(tmp_path):
    work = copy_workflow(tmp_path / "wf")
    config = tmp_path / "bad.yaml"
    config.write_text("analysis:\n  comparisons:\n    - {baseline: plain, variant: lusk}\n")
    result = subprocess.run(
        [str(BIN / "snakemake"), "--cores", "1", "-n", "all", "--configfile", str(config)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode != 0
    assert "analysis.comparisons[0].variant: no stack 'lusk'" in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        (
            "raid5-2012",
            [
                ("raid5", "luks-raid5"),
                ("raid5", "ext4-luks-raid5"),
                ("linear-raid5", "luks-raid5"),
            ],
        ),
        ("scs-2023", [("raw", "luks"), ("raid0", "raid0-luks")]),
        ("ceph-reef-2023", [("raw", "luks-submit"), ("raw", "luks-4k"), ("luks", "luks-4k")]),
    ],
)
def test_the_profiles_compare_what_their_studies_compared(profile, expected, tmp_path):
    from luksbench.studies import load_config

    user = tmp_path / "user.yaml"
    user.write_text(f"study: {profile}\n")
    pairs = comparisons.check_config(load_config(REPO, [user]))
    assert pairs[0] == expected[0]  # the headline
    assert set(expected) <= set(pairs)


# ------------------------------------------------------------------------------- a derived run


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("comparisons")
    raw = derived_run(
        SAMPLE,
        base / "raw" / "cmp",
        stack_factors={"raid0": ("plain", [1, 1, 1]), "raid0-luks": ("plain", RAID0_LUKS_FACTORS)},
        patterns={"largeblock": LARGEBLOCK},
        unavailable={"null-cipher": REASON},
    )
    processed = base / "processed" / "cmp"
    ingest.write_processed(raw, processed, workers=2)
    loss, _ = write_loss(
        processed, baseline="plain", variant="luks", comparisons=json.dumps(COMPARISONS)
    )
    figures_dir = base / "figures" / "cmp"
    figures = catalog.make_figures(processed, figures_dir, "cmp", workers=2)
    md = render.render_paper(processed, figures_dir, base / "paper" / "cmp" / "index.md", "cmp")
    return {
        "raw": raw,
        "processed": processed,
        "fio": pd.read_parquet(processed / "fio.parquet"),
        "loss": loss,
        "figures": figures,
        "md": md.read_text(),
    }


@pytest.mark.slow
def test_loss_parquet_holds_every_comparison_headline_first(run):
    loss = pd.read_parquet(run["processed"] / "loss.parquet")
    assert comparisons.comparison_pairs(loss) == PAIRS
    for baseline, variant in PAIRS:
        rows = loss[(loss["baseline"] == baseline) & (loss["variant"] == variant)]
        alone = stats.loss_table(run["fio"], baseline, variant)
        # the same rows as the comparison alone: the BH adjustment stays within the comparison
        rows = rows[stats.LOSS_COLUMNS].reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, alone, check_dtype=False)


@pytest.mark.slow
def test_a_known_ratio_comes_out(run):
    loss = run["loss"]
    bw = loss[
        (loss["baseline"] == "raid0")
        & (loss["variant"] == "raid0-luks")
        & (loss["metric"] == "bw_bytes")
    ]
    assert len(bw) == 4  # three main cells and the pattern cell
    assert bw["effect_pct"].to_numpy() == pytest.approx([TRUE_RAID0_LUKS_LOSS] * 4, abs=1e-6)


@pytest.mark.slow
def test_pattern_cells_are_never_merged_with_main_cells(run):
    loss = run["loss"]
    bw = loss[(loss["variant"] == "luks") & (loss["metric"] == "bw_bytes")].set_index("workload")
    main, block = bw.loc["randwrite-1m-qd1"], bw.loc["randwrite-1m-qd1-largeblock"]
    # same rw, block size and queue depth; only the pattern differs
    assert (main["rw"], main["bs_bytes"], main["iodepth"]) == (
        block["rw"],
        block["bs_bytes"],
        block["iodepth"],
    )
    assert (main["pattern"], block["pattern"]) == ("", "largeblock")
    assert main["n"] == block["n"] == 3
    assert block["ratio"] == pytest.approx(main["ratio"] * LARGEBLOCK_LUKS_FACTOR, rel=1e-9)


@pytest.mark.slow
def test_the_paper_has_one_section_per_comparison_with_its_numbers(run):
    md = run["md"]
    assert md.splitlines()[1] == 'title: "What does luks cost? luksbench run cmp"'
    for part in ("## Loss tables", "## Results"):
        body = md.split(part)[1].split("\n## ")[0]
        found = re.findall(r"^### `([^`]+)` against `([^`]+)`$", body, re.MULTILINE)
        assert [(b, v) for v, b in found] == PAIRS, part
    results = md.split("## Results")[1].split("\n## ")[0]
    sections = re.split(r"^### ", results, flags=re.MULTILINE)[1:]
    for (baseline, variant), section in zip(PAIRS, sections, strict=True):
        assert section.startswith(f"`{variant}` against `{baseline}`")
        table = section.split("#### Bandwidth (loss)")[1].split("####")[0]
        assert f"| cell | {baseline} (MiB/s) | {variant} (MiB/s) |" in table
        rows = run["loss"][
            (run["loss"]["baseline"] == baseline)
            & (run["loss"]["variant"] == variant)
            & (run["loss"]["metric"] == "bw_bytes")
        ]
        for _, r in rows.iterrows():
            name = cell_name(r)
            line = next(x for x in table.splitlines() if x.startswith(f"| {name} |"))
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert cells[1] == fmt_num(r["baseline_mean"] / 2**20, 1)
            assert cells[2] == fmt_num(r["variant_mean"] / 2**20, 1)
            assert cells[3] == fmt_pct(r["effect_pct"])
            assert cells[4] == fmt_ci(r["ci_low"], r["ci_high"])
            assert cells[5] == r["decision"]
            assert cells[6] == f"{r['verdict']} ({fmt_num(r['q_value'], 3)})"
    # the TL;DR and the recommendation cover every comparison, the headline first
    tldr = md.split("**TL;DR.**")[1].split("\n")[0]
    starts = [tldr.index(f"`{v}` against `{b}` on `vm`") for b, v in PAIRS]
    assert starts == sorted(starts)
    assert "`raid0-luks` against `raid0`: do not turn it on" in md


@pytest.mark.slow
def test_the_paper_keeps_pattern_cells_apart_and_describes_the_pattern(run):
    md = run["md"]
    # the pattern cell has rows of its own, labelled with its pattern
    assert "| randwrite 1m QD1 [largeblock] |" in md and "| randwrite 1m QD1 |" in md
    assert "#### Random write, pattern `largeblock`: bandwidth loss" in md
    measured = md.split("## What was measured")[1].split("\n## ")[0]
    line = next(x for x in measured.splitlines() if "`largeblock`" in x)
    # description from the plan in env.json, options from the results' job options
    assert LARGEBLOCK["plan"]["description"] in line
    assert "ioengine psync" in line and "direct=0" in line and "an fsync after every block" in line
    main = next(x for x in measured.splitlines() if "main matrix" in x)
    assert "ioengine libaio" in main and "direct=1" in main


@pytest.mark.slow
def test_the_unavailable_stack_is_listed_with_its_reason(run):
    stacks = pd.read_parquet(run["processed"] / "stacks.parquet")
    row = stacks.set_index("stack").loc["null-cipher"]
    assert not row["available"] and row["reason"] == REASON
    assert stacks.set_index("stack").loc["luks", "available"]
    gaps = run["md"].split("**Not in this run.**")[1].split("\n## ")[0]
    assert f"Stack `null-cipher` (luks) could not be built on `vm`: {REASON}." in gaps
    assert "skipped" not in gaps  # not listed a second time as a planned stack without results
    assert "| vm | `null-cipher` |" not in run["md"]  # not among the stacks that were built
    ceilings = crypto_ceilings(
        pd.DataFrame(), stacks, pd.read_parquet(run["processed"] / "env.parquet")
    )
    assert "null-cipher" not in {c["stack"] for c in ceilings}


@pytest.mark.slow
def test_figures_per_comparison_and_per_pattern(run):
    figures = run["figures"]
    assert {"loss", "loss-raid0-luks-vs-raid0", "loss-raid0-luks-vs-luks"} <= set(figures)
    assert not any(n.startswith("loss-luks-vs") for n in figures)  # the headline is "loss"
    params = json.loads(Image.open(figures["loss-raid0-luks-vs-luks"][0]).text["params"])
    assert params == {"baseline": "luks", "variant": "raid0-luks"}
    for name in (
        "throughput-randwrite-bw_bytes",
        "throughput-randwrite-largeblock-bw_bytes",
        "latency-randwrite",
        "latency-randwrite-largeblock",
    ):
        assert name in figures, name
    params = json.loads(
        Image.open(figures["throughput-randwrite-largeblock-bw_bytes"][0]).text["params"]
    )
    assert params["pattern"] == "largeblock"
    # the pattern's bars are its own: bar heights of the two figures differ by the 0.9 factor
    arms = pd.read_parquet(run["processed"] / "arms.parquet")
    summ = arms[arms["metric"] == "bw_bytes"]
    luks = summ[(summ["stack"] == "luks") & (summ["rw"] == "randwrite")].set_index("pattern")
    assert luks.loc["largeblock", "mean"] == pytest.approx(
        LARGEBLOCK_LUKS_FACTOR * luks.loc["", "mean"], rel=1e-9
    )


@pytest.mark.slow
def test_the_headline_falls_back_to_the_first_comparison(run, tmp_path):
    import shutil

    processed = tmp_path / "processed"
    shutil.copytree(run["processed"], processed)
    given = [
        {"baseline": "raid0", "variant": "raid0-luks"},
        {"baseline": "luks", "variant": "raid0-luks"},
    ]
    loss, _ = write_loss(processed, baseline="plain", variant="luks", comparisons=given)
    assert comparisons.comparison_pairs(loss) == [("raid0", "raid0-luks"), ("luks", "raid0-luks")]
    md = render.render_paper(processed, tmp_path / "figures", tmp_path / "index.md", "cmp")
    assert "What does raid0-luks cost?" in md.read_text().splitlines()[1]


@pytest.mark.slow
def test_a_comparison_without_results_is_left_out_with_a_note(run, tmp_path, capsys):
    import shutil

    processed = tmp_path / "processed"
    shutil.copytree(run["processed"], processed)
    given = [
        {"baseline": "plain", "variant": "null-cipher"},
        {"baseline": "plain", "variant": "luks"},
    ]
    loss, _ = write_loss(processed, baseline="plain", variant="null-cipher", comparisons=given)
    assert comparisons.comparison_pairs(loss) == [("plain", "luks")]
    assert "`null-cipher` against `plain` left out: no results for `null-cipher`" in (
        capsys.readouterr().err
    )
    with pytest.raises(comparisons.ComparisonError, match="nothing to compare"):
        write_loss(processed, baseline="plain", variant="x", comparisons=given[:1])


@pytest.mark.slow
def test_adaptive_pilot_sds_cover_every_comparison(run):
    """The pilot's noise is the largest SD over the comparisons: raid0-luks vs luks is noisier
    than raid0-luks vs raid0 (whose SD is that of ln of the three factors)."""
    fio = run["fio"]
    alone = adaptive.pilot_targets(
        fio, "raid0", [], pilot_pairs=3, comparisons=[("raid0", "raid0-luks")]
    )["vm"]
    sd = pd.Series([math.log(f) for f in RAID0_LUKS_FACTORS]).std(ddof=1)
    for cell in alone["cells"].values():
        assert cell["pilot_sd_log_ratio"] == pytest.approx(sd, abs=1e-6)
    both = adaptive.pilot_targets(
        fio,
        "raid0",
        [],
        pilot_pairs=3,
        comparisons=[("raid0", "raid0-luks"), ("luks", "raid0-luks"), ("plain", "null-cipher")],
    )["vm"]
    assert both["comparisons"] == [["raid0", "raid0-luks"], ["luks", "raid0-luks"]]
    for workload, cell in both["cells"].items():
        assert cell["pilot_sd_log_ratio"] >= alone["cells"][workload]["pilot_sd_log_ratio"] - 1e-9
    assert any(
        cell["pilot_sd_log_ratio"] > alone["cells"][w]["pilot_sd_log_ratio"] + 1e-3
        for w, cell in both["cells"].items()
    )
