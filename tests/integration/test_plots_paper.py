"""Figures and paper from the real-fio raw layout of test_ingest (smoke + the paper's promises)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from PIL import Image
from simulate import rerecord

from luksbench.analysis import ingest, stats
from luksbench.analysis.loss import CPU_METRICS, write_loss
from luksbench.publish import catalog, paper_sentences, render, style
from luksbench.publish.ceilings import crypto_ceilings
from luksbench.publish.text import bs_human, fmt_ci, fmt_pct


@pytest.fixture(scope="module")
def processed(external_dir, tmp_path_factory) -> Path:
    from testkit.raw import build_raw

    base = tmp_path_factory.mktemp("pp")
    raw = build_raw(external_dir, base / "raw" / "tumrun")
    out = base / "processed" / "tumrun"
    ingest.write_processed(raw, out)
    write_loss(out)
    return out


@pytest.fixture(scope="module")
def figures(processed) -> dict:
    return catalog.make_figures(processed, processed.parent.parent / "figures" / "tumrun", "tumrun")


def test_figures_written_with_provenance(figures, processed):
    fio = ingest.read_processed(processed)["fio"]
    cells = list(fio[["host", "rw"]].drop_duplicates().itertuples(index=False))
    hosts = sorted(fio["host"].unique())
    throughput = {f"throughput-{h}-{rw}-{m}" for h, rw in cells for m in ("bw_bytes", "iops")}
    # two hosts: host in every per-host name; plain json results (no json+ bins): no latency
    # figures; only tum-direct2 has CPU sidecars; one host has cipher rows, so the cipher bars exist
    expected = (
        {"loss", "ciphers"}
        | throughput
        | {f"heatmap-{h}-{m}" for h in hosts for m in ("bw_bytes", "clat_p99_ns")}
        | {"ceiling-tum-direct2"}  # the other host has no ceiling: no figure (test below)
        | {f"cpu-tum-direct2-{m}" for m in CPU_METRICS}
        | {f"hosts-{m}" for m in ("bw_bytes", "clat_p99_ns")}  # the two boxes side by side
    )
    assert set(figures) == expected
    for name, (png, svg) in figures.items():
        assert png.suffix == ".png" and svg.suffix == ".svg"
        assert png.stat().st_size > 1000 and svg.stat().st_size > 1000
        text = Image.open(png).text
        assert text["run"] == "tumrun" and text["figure"] == name
        assert text["made_by"].startswith("luksbench.publish.figures")
        assert "fio.parquet" in json.loads(text["sources_sha256"])
        for key in ("git_commit", "config_hash", "fio_version", "cryptsetup_version"):
            assert text[key], (name, key)
        head = svg.read_text()
        assert "luksbench.publish.figures" in head and "<dc:date>" not in head
        assert '"git_commit"' in head and '"config_hash"' in head


def test_crypto_ceiling_from_the_cipher_benchmark(figures, processed):
    """Host tum-direct2 recorded aes-xts 512b: ceiling = its speed x CPUs; the other host's cipher
    benchmark failed: it gets no ceiling figure, and the figure index records why."""
    import pandas as pd

    tables = ingest.read_processed(processed)
    ceilings = {
        c["host"]: c for c in crypto_ceilings(tables["cryptsetup"], tables["stacks"], tables["env"])
    }
    a = ceilings["tum-direct2"]
    cpus = int(tables["env"].set_index("host").loc["tum-direct2", "cpu_count"])
    assert a["reason"] is None and a["algorithm"] == "aes-xts" and a["key_bits"] == 512
    assert a["read_ceiling_mib_s"] == pytest.approx(1979.6 * cpus)
    assert a["write_ceiling_mib_s"] == pytest.approx(1983.0 * cpus)
    others = [c for h, c in ceilings.items() if h != "tum-direct2"]
    assert others and all(c["reason"] and c["read_ceiling_mib_s"] is None for c in others)
    figures_dir = processed.parent.parent / "figures" / "tumrun"
    skipped = {e["name"]: e["reason"] for e in catalog.read_skipped(figures_dir)}
    for c in others:
        assert f"ceiling-{c['host']}" not in figures
        assert c["reason"] in skipped[f"ceiling-{c['host']}"]
    assert isinstance(tables["cryptsetup"], pd.DataFrame)


def test_figures_are_byte_stable(figures, processed, tmp_path):
    again = catalog.make_figures(processed, tmp_path / "again", "tumrun")
    for name, (png, svg) in figures.items():
        assert again[name][0].read_bytes() == png.read_bytes(), name
        assert again[name][1].read_bytes() == svg.read_bytes(), name


def test_save_figure_accepts_suffix(tmp_path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    paths = style.save_figure(fig, tmp_path / "x.png", {"run": "r", "nested": {"a": 1}})
    plt.close(fig)
    assert [p.name for p in paths] == ["x.png", "x.svg"]
    assert json.loads(Image.open(paths[0]).text["nested"]) == {"a": 1}


def test_paper_contains_loss_table_and_no_nan(processed, figures, tmp_path):
    out = tmp_path / "paper" / "tumrun" / "index.md"
    md = render.render_paper(
        processed, processed.parent.parent / "figures" / "tumrun", out, "tumrun"
    )
    text = md.read_text()
    meta, body = render.split_front_matter(text)
    assert text.startswith("---\n") and meta["title"] and meta["author"] and meta["date"]
    assert body.lstrip().startswith("# ")
    assert "**TL;DR.**" in text and "significant" in text
    assert "kernel dm-crypt" in text  # the backend the run recorded, said explicitly
    assert "### Bandwidth (loss)" in text and "### p99 completion latency (increase)" in text
    assert "| tum-direct2: randread 4k QD1, job `alat randread` |" in text
    assert not re.search(r"\bnan\b", text, re.IGNORECASE)
    assert "[n/a]" in text  # the single-pair host has no interval, and says so
    assert "insufficient" in text
    # cryptsetup: the cipher table of host A and the recorded failure of the other host
    assert "| aes-xts | 512 | 1,983.0 | 1,979.6 |" in text
    assert "did not run" in text
    # every figure linked relative to the .md and present
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == len(figures)
    for link in links:
        assert not Path(link).is_absolute() and (md.parent / link).exists(), link
    html = render.render_html(md)
    assert "<table>" in html.read_text()


def test_paper_numbers_come_from_the_tables(processed, figures, tmp_path):
    """The TL;DR's decision counts and largest decided cost of every metric are the loss
    table's, formatted."""
    loss = ingest.read_processed(processed)["loss"]
    md = render.render_paper(
        processed, processed.parent.parent / "figures" / "tumrun", tmp_path / "p.md", "tumrun"
    )
    tldr = md.read_text().split("**TL;DR.**")[1].split("\n")[0]
    rows = loss[(loss["n"] > 0) & (loss["derived_from"].fillna("") == "")]
    for metric, g in rows.groupby("metric"):
        assert f"{paper_sentences.decision_counts(g)} of {len(g)} cells" in tldr, metric
        if g["decision"].isin(["material", "moderate"]).any():  # the largest, adjusted
            w = g[g["largest"]].iloc[0]
            ci = fmt_ci(w["selection_ci_low"], w["selection_ci_high"])
            assert f"{fmt_pct(w['effect_pct'])} {ci} ({int(w['n'])} pairs)" in tldr
            assert f"adjusted for picking the largest of {int(w['family_cells'])} cells" in tldr


def test_userspace_backend_is_named(processed, figures, tmp_path):
    import pandas as pd

    env = pd.read_parquet(processed / "env.parquet")
    alt = tmp_path / "processed"
    alt.mkdir()
    for p in processed.glob("*.parquet"):
        (alt / p.name).write_bytes(p.read_bytes())
    env.assign(backend="userspace").to_parquet(alt / "env.parquet", index=False)
    md = render.render_paper(
        alt, processed.parent.parent / "figures" / "tumrun", tmp_path / "u.md", "tumrun"
    )
    assert "qemu-storage-daemon's LUKS driver via FUSE, not dm-crypt" in md.read_text()


# ------------------------------------------------------------------------ published references

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "data" / "reference"


def test_reference_tables_are_transcribed_with_provenance(external_dir):
    import pandas as pd

    shared = external_dir / "SovereignCloudStack__website"
    scs = REFERENCE / "scs_2023_loss_tables.csv"
    assert (
        scs.read_bytes()
        == (shared / "scs_blog_2023-02-24_luks_loss_tables_DERIVED.csv").read_bytes()
    )
    ceph = pd.read_csv(REFERENCE / "ceph_reef_2023_luks.csv")
    published = ceph["pct_of_unencrypted_as_published"].str.rstrip("%").astype(float)
    assert (100 - published - ceph["loss_pct"]).abs().max() < 1e-9
    assert set(ceph["rw"]) == {"randread", "randwrite"} and set(ceph["iodepth"]) == {1, 128}
    raid5 = pd.read_csv(REFERENCE / "raid5_2012_conclusions.csv")
    seed = (REPO.parent / "shared" / "seeds" / "003_241cdf8e2e59a806.txt").read_text()
    for claim in raid5["claim_as_published"]:  # verbatim from the seed (modulo line breaks)
        assert claim.split(", ")[-1].split()[0] in seed
    readme = (REFERENCE / "README.md").read_text()
    for name in (
        "scs_2023_loss_tables.csv",
        "ceph_reef_2023_luks.csv",
        "raid5_2012_conclusions.csv",
    ):
        assert name in readme
    assert "000_68094c2a7250d3db.txt" in readme and "002_a5f91ba7f457fa49.txt" in readme


def _loss_row(**kw):
    row = {
        "host": "h",
        "workload": f"{kw['rw']}-{kw['bs']}-qd1",
        "rw": kw["rw"],
        "bs_bytes": {"4k": 4096, "1m": 2**20}[kw["bs"]],
        "iodepth": 1,
        "direction": "write" if "write" in kw["rw"] else "read",
        "job": "j",
        "job_slot": 0,
        "metric": "bw_bytes",
        "baseline": "plain",
        "variant": "luks",
        "n": 5,
        "effect": "loss",
        "effect_pct": kw["eff"],
        "ci_low": kw["lo"],
        "ci_high": kw["hi"],
        "confidence": 0.95,
        "verdict": kw["verdict"],
        "decision": stats.decision(kw["lo"], kw["hi"], 5, 20),
        "decision_lower_pct": 5.0,
        "decision_upper_pct": 20.0,
        "derived_from": "",
    }
    return row


def test_recommendation_follows_the_stated_thresholds():
    import pandas as pd

    hosts = [{"backend": "kernel"}]
    small = pd.DataFrame(
        [
            _loss_row(rw="read", bs="4k", eff=1.0, lo=-1.0, hi=3.0, verdict="inconclusive"),
            _loss_row(rw="write", bs="1m", eff=2.0, lo=0.5, hi=4.9, verdict="significant"),
        ]
    )
    rec = paper_sentences.recommendation(small, hosts)
    assert "Bandwidth ±5 / 20 %" in rec["thresholds"]
    (verdict,) = rec["verdicts"]
    assert verdict["turn_on"] and "turn it on: no cell of Bandwidth" in verdict["text"]
    assert (
        "no cost (negligible, a gain, or undecided short of 5 %) in 2 of 2" in verdict["metrics"][0]
    )
    assert rec["caveats"] == []
    material = _loss_row(rw="write", bs="4k", eff=30, lo=20.5, hi=40, verdict="significant")
    big = pd.concat([small, pd.DataFrame([material | {"material_listed": True}])])
    rec = paper_sentences.recommendation(big, [{"backend": "userspace"}])
    (verdict,) = rec["verdicts"]
    assert not verdict["turn_on"] and "do not turn it on" in verdict["text"]
    assert "material (listed after Benjamini-Hochberg" in verdict["metrics"][0]
    assert "in 1 of 3 cells (30.0 %)" in verdict["metrics"][0]
    assert "not the kernel's dm-crypt" in rec["caveats"][0]
    # material on its own interval but not after the adjustment: still in the way, said so
    alone = paper_sentences.recommendation(big.assign(material_listed=False), hosts)["verdicts"][0]
    assert "do not turn it on" in alone["text"]
    assert "material on its own interval, not after adjusting" in alone["metrics"][0]
    # a cell whose interval straddles 20 % is undecided, not material, and in the way
    edge = pd.DataFrame(
        [_loss_row(rw="read", bs="1m", eff=30, lo=19.9, hi=40, verdict="significant")]
    )
    verdict = paper_sentences.recommendation(edge, hosts)["verdicts"][0]
    assert (
        "undecided, the interval reaching past 20 % (material) in 1 of 1" in verdict["metrics"][0]
    )
    assert "stands in the way" in verdict["text"]
    # a 0.6 % loss with a tight interval is negligible, not a headline: significant or not
    tight = pd.DataFrame(
        [_loss_row(rw="read", bs="4k", eff=0.6, lo=0.4, hi=0.8, verdict="significant")]
    )
    assert paper_sentences.recommendation(tight, hosts)["verdicts"][0]["turn_on"]
    # and three cells wholly between 5 and 20 % are decided: moderate, not "need more pairs"
    moderate = pd.DataFrame(
        [
            _loss_row(rw=rw, bs="1m", eff=10, lo=6, hi=15, verdict="significant")
            for rw in ("read", "write", "randread")
        ]
    )
    verdict = paper_sentences.recommendation(moderate, hosts)["verdicts"][0]
    assert "only where a moderate cost is acceptable" in verdict["text"]
    assert "moderate in 3 of 3 cells (10.0 %)" in verdict["metrics"][0]
    assert "undecided" not in verdict["metrics"][0]


# ------------------------------------------------------------------ the shipped sample, end to end

SAMPLE = REPO / "data" / "raw" / "sample"


def _pipeline(raw: Path, base: Path, run: str) -> dict:
    out = base / "processed" / run
    ingest.write_processed(raw, out)
    write_loss(out)
    figs = catalog.make_figures(
        out, base / "figures" / run, run, notebook="tests/test_plots_paper.py"
    )
    md = render.render_paper(out, base / "figures" / run, base / "paper" / run / "index.md", run)
    return {"processed": out, "figures": figs, "md": md, "html": render.render_html(md)}


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> dict:
    import shutil

    base = tmp_path_factory.mktemp("sample")
    raw = base / "raw" / "sample"
    shutil.copytree(SAMPLE, raw)
    return _pipeline(raw, base, "sample")


def test_sample_has_every_figure_family(sample):
    kinds = {name.split("-")[0] for name in sample["figures"]}
    assert kinds == {"throughput", "heatmap", "latency", "cpu", "loss"}, kinds
    # json+ histograms: one latency figure per access pattern; no cipher rows: no cipher bars
    assert {n for n in sample["figures"] if n.startswith("latency")} == {
        "latency-read",
        "latency-write",
        "latency-randread",
        "latency-randwrite",
    }
    text = Image.open(sample["figures"]["loss"][0]).text
    assert text["notebook"] == "tests/test_plots_paper.py"
    # no cipher benchmark, so no ceiling: the figure is not drawn and the index says why
    skipped = catalog.read_skipped(sample["processed"].parent.parent / "figures" / "sample")
    assert [e["name"] for e in skipped] == ["ceiling"]
    assert "Required kernel crypto interface not available" in skipped[0]["reason"]


def test_latency_histograms_come_from_the_raw_json_plus(sample):
    import pandas as pd

    from luksbench.formats import fio as fio_parser
    from luksbench.publish import figures_arms as plots

    fio = pd.read_parquet(sample["processed"] / "fio.parquet")
    lat = pd.read_parquet(sample["processed"] / "latency.parquet")
    one = fio[(fio["stack"] == "luks") & (fio["workload"] == "read-1m-qd1") & (fio["rep"] == 1)]
    row = one[one["direction"] == "read"].iloc[0]
    hist = fio_parser.clat_histogram(SAMPLE / row["file"])[(int(row["job_index"]), "read")]
    got = lat[(lat["stack"] == "luks") & (lat["workload"] == "read-1m-qd1") & (lat["rep"] == 1)]
    assert sorted(zip(got["ns"], got["count"], strict=True)) == sorted(hist)
    assert set(got["direction"]) == {"read"}  # the idle write direction is not a measurement
    # pooled percentile curve is monotone and ends below p100
    x, y = plots.percentile_curve(got)
    assert (x[1:] > x[:-1]).all() and (y[1:] > y[:-1]).all()


def test_sample_paper_is_computed_from_the_tables(sample):
    import pandas as pd

    md = sample["md"].read_text()
    meta, body = render.split_front_matter(md)
    assert meta["title"] == "What does luks cost? luksbench run sample"
    assert meta["author"] == "luksbench" and meta["date"] == "2026-11-21"  # env.json "captured"
    loss = pd.read_parquet(sample["processed"] / "loss.parquet")
    bw = loss[loss["metric"] == "bw_bytes"]
    assert bw["decision"].isin(["material", "moderate"]).any()
    worst = bw[bw["largest"]].iloc[0]  # quoted with its interval adjusted for picking it
    tldr = body.split("**TL;DR.**")[1].split("\n")[0]
    rw = {"read": "sequential read", "write": "sequential write"}.get(worst["rw"], "")
    rw = rw or {"randread": "random read", "randwrite": "random write"}[worst["rw"]]
    expected = (
        f"Largest loss: {rw}, {bs_human(worst['bs_bytes'])}, "
        f"QD{int(worst['iodepth'])}, {fmt_pct(worst['effect_pct'])} "
        f"{fmt_ci(worst['selection_ci_low'], worst['selection_ci_high'])}"
    )
    assert expected in tldr
    assert "not dm-crypt" in tldr  # the backend, in the first sentence
    assert "**Recommendation.**" in body and "Bandwidth, IOPS ±5 / 20 %" in body
    assert "**no crypto ceiling**" in body and "Required kernel crypto interface" in body
    # SCS-shaped tables: stack rows x block-size columns
    assert "### Sequential write: bandwidth loss" in body
    assert "| stack | 4 KiB % loss | 1 MiB % loss |" in body
    cell = loss[(loss["metric"] == "bw_bytes") & (loss["workload"] == "write-1m-qd32")].iloc[0]
    table = body.split("### Sequential write: bandwidth loss")[1].split("###")[0]
    row = next(line for line in table.splitlines() if line.startswith("| luks, QD32 |"))
    ci = fmt_ci(cell["ci_low"], cell["ci_high"])
    decided = cell["decision"].split(":")[0]
    assert row.split(" | ")[2].rstrip(" |") == f"{fmt_pct(cell['effect_pct'])} {ci} {decided}"
    assert "## Methodology" in body and "## Appendix: environment" in body
    # the sample recorded no idle CPU baseline: its CPU values and their captions are gross
    assert not pd.read_parquet(sample["processed"] / "fio.parquet")["cpu_net"].any()
    assert "gross: no idle baseline recorded" in body and "net of the" not in body
    cpu_png = sample["figures"]["cpu-busy_cpu_s_per_gib"][0]
    assert json.loads(Image.open(cpu_png).text["params"])["net"] is False


def test_sample_paper_compares_with_published_results(sample):
    import pandas as pd

    body = sample["md"].read_text().split("## Compared with published results")[1]
    assert "other hardware with other backends" in body
    loss = pd.read_parquet(sample["processed"] / "loss.parquet")
    ours = loss[(loss["metric"] == "bw_bytes") & (loss["workload"] == "write-1m-qd1")].iloc[0]
    scs = pd.read_csv(REFERENCE / "scs_2023_loss_tables.csv")
    nvme = scs[
        (scs["metric"] == "write bandwidth")
        & (scs["device_config"] == "NVME")
        & (scs["block_size"] == "1 MiB")
    ]["loss_pct"].item()
    row = next(
        line
        for line in body.splitlines()
        if line.startswith("| sequential write, 1 MiB, QD1 | Bandwidth")
    )
    assert fmt_pct(ours["effect_pct"]) in row and fmt_pct(nvme, 2) in row
    # SCS rows at iodepth=32 are matched to QD32 cells, never to QD1
    qd32 = scs[
        (scs["metric"] == "write bandwidth")
        & (scs["device_config"] == "NVME iodepth=32")
        & (scs["block_size"] == "1 MiB")
    ]["loss_pct"].item()
    row32 = next(
        line
        for line in body.splitlines()
        if line.startswith("| sequential write, 1 MiB, QD32 | Bandwidth")
    )
    assert fmt_pct(qd32, 2) in row32
    # Ceph: only the QD1 sync 4 KiB rows match this run's cells; the rest are counted
    assert "single-client sync" in body and "| 100.89% |" in body
    assert "24 of 28 published rows have no matching cell" in body
    # RAID-5 2012: small-block random reads against this run's randread cells; the buffered
    # large-block writes are said not to match direct I/O
    assert "about 5% for small block random reads" in body
    assert "buffered I/O with fsync, this run direct I/O" in body


# ------------------------------------------------------------------------------- other profiles


def _subset(raw: Path, workloads=("read-1m-qd1", "read-4k-qd32", "write-1m-qd32")) -> None:
    """Keep only a few cells of a copied sample (the figures are what take time)."""
    import shutil

    for cell in raw.glob("*/fio/*/*"):
        if cell.is_dir() and cell.name not in workloads:
            shutil.rmtree(cell)


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.unlink()
    path.write_text(json.dumps(data))


def _no_cipher_benchmark(raw: Path) -> None:
    (raw / "vm" / "cryptsetup-benchmark.txt").unlink()


def _third_stack(raw: Path) -> None:
    import shutil

    fio = raw / "vm" / "fio"
    shutil.copytree(fio / "luks", fio / "luks4k")

    def manifest(m):
        stacks = m["stack_descriptions"].get("stacks", m["stack_descriptions"])
        stacks["luks4k"] = {**stacks["luks"], "sector_size": 4096}

    def env(e):  # the plan also asked for a serpent stack that never ran: a skipped stack
        e["plan"]["stacks"]["luks4k"] = {**e["plan"]["stacks"]["luks"], "sector_size": 4096}
        e["plan"]["stacks"]["serpent"] = {"kind": "luks", "cipher": "serpent-xts-plain64"}

    _edit_json(fio / "manifest.json", manifest)
    _edit_json(raw / "vm" / "env.json", env)


def _two_hosts(raw: Path) -> None:
    import shutil

    shutil.copytree(raw / "vm", raw / "vm2")


@pytest.mark.parametrize("profile", ["no_cipher_benchmark", "third_stack", "two_hosts"])
def test_other_profiles_render(profile, tmp_path):
    import shutil

    raw = tmp_path / "raw" / profile
    shutil.copytree(SAMPLE, raw)
    for p in raw.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)  # the sample's results are read-only
    _subset(raw)
    {
        "no_cipher_benchmark": _no_cipher_benchmark,
        "third_stack": _third_stack,
        "two_hosts": _two_hosts,
    }[profile](raw)
    for host in (p for p in raw.iterdir() if p.is_dir()):
        rerecord(host)  # the manifest records the results kept and added, as the runner's would
    out = _pipeline(raw, tmp_path, profile)
    md, figures = out["md"].read_text(), out["figures"]
    assert not re.search(r"\bnan\b", md, re.IGNORECASE)
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) == len(figures)
    assert out["html"].read_text().count('src="data:image/png;base64,') == len(links)
    if profile == "no_cipher_benchmark":
        assert "No `cryptsetup benchmark` output was recorded on `vm`." in md
        skipped = catalog.read_skipped(tmp_path / "figures" / profile)
        assert "ceiling" not in figures and [e["name"] for e in skipped] == ["ceiling"]
        assert "no `cryptsetup benchmark` output was recorded on vm" in skipped[0]["reason"]
        assert "*Crypto ceiling*: not drawn, no stack has a crypto ceiling" in md
    elif profile == "third_stack":
        # every stack against the baseline: two comparisons, the headline (luks) first
        assert "2 comparisons, the headline first: `luks` against `plain`; `luks4k` against" in md
        assert "| luks4k, QD1 |" in md and "| luks, QD1 |" in md
        assert "`serpent`" in md and "skipped" in md
        assert {"heatmap-bw_bytes", "loss", "loss-luks4k-vs-plain"} <= set(figures)
        loss4k = stats.loss_table(pd_read(out["processed"] / "fio.parquet"), "plain", "luks4k")
        row = loss4k[(loss4k["metric"] == "bw_bytes") & (loss4k["workload"] == "read-1m-qd1")].iloc[
            0
        ]
        tables = md.split("## Loss tables")[1].split("\n## ")[0]
        section = tables.split("### `luks4k` against `plain`")[1]
        table = section.split("#### Sequential read: bandwidth loss")[1].split("###")[0]
        line = next(x for x in table.splitlines() if x.startswith("| luks4k, QD1 |"))
        assert line.split(" | ")[1] == "not measured"  # 4 KiB at QD1 is not in this subset
        assert line.split(" | ")[2].startswith(fmt_pct(row["effect_pct"]))
    else:
        assert "`vm`, `vm2`" in md.split("**TL;DR.**")[1].split("\n")[0]
        assert "| vm2: luks, QD32 |" in md and "| vm: luks, QD32 |" in md
        for kind in (
            "throughput-vm2-read-bw_bytes",
            "heatmap-vm2-bw_bytes",
            "latency-vm2-read",
        ):
            assert kind in figures, kind
        skipped = catalog.read_skipped(tmp_path / "figures" / profile)
        assert {e["name"] for e in skipped} == {"ceiling-vm", "ceiling-vm2"}  # no cipher rows


def pd_read(path):
    import pandas as pd

    return pd.read_parquet(path)


# --------------------------------------------------------------------------- in a real browser


def _chromium() -> str:
    import shutil

    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    pytest.fail(
        "no chromium found: install it (scripts/setup.sh does: apt-get install chromium)",
        pytrace=False,
    )


def _browser(*args: str, tmp: Path) -> str:
    import subprocess

    result = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp / 'chromium-profile'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


CHECK_SCRIPT = """<script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  const out = {
    images: imgs.length,
    broken: imgs.filter((i) => !(i.complete && i.naturalWidth > 0)).map((i) => i.alt),
    tables: document.querySelectorAll("table").length,
    rows: document.querySelectorAll("table tbody tr").length,
    h1: document.querySelector("h1") ? document.querySelector("h1").textContent : null,
  };
  const pre = document.createElement("pre");
  pre.id = "luksbench-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def test_html_renders_in_a_real_browser(sample, tmp_path):
    """The self-contained page, alone in an empty folder, opened by headless chromium: every
    image decodes (naturalWidth > 0), the tables render; a screenshot is saved for a human."""
    import html as html_lib

    page = tmp_path / "alone" / "index.html"
    page.parent.mkdir()
    page.write_text(sample["html"].read_text())  # nothing beside it: must work on its own
    # the check is a script: the page's own policy forbids every script, so the harness drops it
    # (and the same script in the page as published must not run)
    policy = re.compile(r"<meta http-equiv='Content-Security-Policy'[^>]*>\n")
    assert policy.search(page.read_text())
    blocked = page.with_name("blocked.html")
    blocked.write_text(page.read_text().replace("</body>", CHECK_SCRIPT + "</body>"))
    dom = _browser("--virtual-time-budget=20000", "--dump-dom", blocked.as_uri(), tmp=tmp_path)
    assert "<body" in dom and 'id="luksbench-check"' not in dom, "a script ran despite the policy"
    check = page.with_name("check.html")
    harness = policy.sub("", page.read_text())
    check.write_text(harness.replace("</body>", CHECK_SCRIPT + "</body>"))
    dom = _browser("--virtual-time-budget=20000", "--dump-dom", check.as_uri(), tmp=tmp_path)
    found = re.search(r'<pre id="luksbench-check">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    result = json.loads(html_lib.unescape(found.group(1)))
    n_links = len(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", sample["md"].read_text()))
    assert result["images"] == n_links > 10 and result["broken"] == [], result
    assert result["tables"] >= 20 and result["rows"] >= 100, result
    assert result["h1"] == "What does luks cost? luksbench run sample"

    shot = tmp_path / "paper-screenshot.png"
    _browser("--window-size=1280,9000", f"--screenshot={shot}", page.as_uri(), tmp=tmp_path)
    print(f"screenshot: {shot}")
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 9000)
    # not a blank page: text, tables and figures give many distinct colours
    assert len(image.getcolors(maxcolors=1 << 20) or []) > 500


def test_throughput_bars_show_the_repetitions_and_say_they_are_unpaired(sample):
    import pandas as pd

    from luksbench.publish import figures_arms

    processed = sample["processed"]
    arms, fio = (pd.read_parquet(processed / f"{t}.parquet") for t in ("arms", "fio"))
    fig = figures_arms.throughput_figure(arms, fio, "read")
    from matplotlib.collections import PathCollection  # what scatter draws

    scattered = [c for ax in fig.axes for c in ax.collections if isinstance(c, PathCollection)]
    dots = sum(len(c.get_offsets()) for c in scattered)
    measured = fio[(fio["rw"] == "read") & (fio["direction"] == "read")]
    assert dots == len(measured) > 0  # one dot per repetition, stack and cell
    assert "per arm, unpaired" in fig.get_suptitle()
    assert "unpaired" in catalog.FIGURE_FAMILIES["throughput"][1]
    assert "per arm and unpaired" in sample["md"].read_text()


def test_post_folder_holds_front_matter_and_figures_for_a_site(processed, figures, tmp_path):
    """config paper.front_matter reaches the post's YAML front matter as a Jekyll site (the SCS
    blog) reads it, and the post's folder works on its own: figures beside it, linked relative."""
    yaml = pytest.importorskip("yaml")
    extra = {"layout": "post", "image": "blog/luks.png", "tags": ["luks", "performance"]}
    extra["author"] = ["Jane Doe", "Max Muster"]
    own_figures, out = tmp_path / "figures", tmp_path / "paper" / "tumrun" / "index.md"
    shutil.copytree(figures["loss"][0].parent, own_figures)
    render.render_paper(processed, own_figures, out, "tumrun", front_matter=extra)
    site = tmp_path / "site" / "_posts" / "luks"
    shutil.copytree(out.parent, site)
    shutil.rmtree(out.parent.parent)
    shutil.rmtree(own_figures)  # the originals are gone: the post's own copy must do
    text = (site / "index.md").read_text()
    head = yaml.safe_load(text.split("---\n")[1])
    assert {k: head[k] for k in extra} == extra and head["run"] == "tumrun"
    assert head["title"].startswith("What does") and str(head["date"]) == "2024-02-13"
    assert 'author:\n  - "Jane Doe"\n  - "Max Muster"\n' in text
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == len(figures)
    assert all(link.startswith("figures/") and (site / link).is_file() for link in links)
    meta, _ = render.split_front_matter(text)
    assert meta["author"] == ["Jane Doe", "Max Muster"] and meta["tags"] == extra["tags"]
    html = render.render_html(site / "index.md").read_text()
    assert '<p class="byline">Jane Doe, Max Muster · 2024-02-13</p>' in html


def test_pdf_of_the_paper_with_pandoc(processed, tmp_path, monkeypatch):
    figures_dir = tmp_path / "figures"
    catalog.make_figures(processed, figures_dir, "tumrun")
    md = render.render_paper(processed, figures_dir, tmp_path / "paper" / "index.md", "tumrun")
    pdf = render.render_pdf(md)
    assert pdf == md.with_suffix(".pdf") and pdf.read_bytes().startswith(b"%PDF")
    assert pdf.stat().st_size > 100_000  # the figures are in it
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    with pytest.raises(FileNotFoundError, match="apt-get install pandoc weasyprint"):
        render.render_pdf(md)


def test_a_site_figures_folder_beside_the_post_is_refused_not_deleted(processed, tmp_path):
    figures_dir = tmp_path / "figures"
    catalog.make_figures(processed, figures_dir, "tumrun")
    out = tmp_path / "site" / "_posts" / "luks" / "index.md"
    (out.parent / "figures").mkdir(parents=True)
    (out.parent / "figures" / "logo.png").write_bytes(b"the site's own")
    with pytest.raises(ValueError, match="not written by luksbench"):
        render.render_paper(processed, figures_dir, out, "tumrun")
    assert (out.parent / "figures" / "logo.png").read_bytes() == b"the site's own"
    with pytest.raises(ValueError, match="hold one another"):
        render.render_paper(processed, figures_dir, figures_dir / "post" / "index.md", "x")
    assert (figures_dir / catalog.INDEX).is_file()
    render.render_paper(processed, figures_dir, tmp_path / "post" / "index.md", "tumrun")
    render.render_paper(processed, figures_dir, tmp_path / "post" / "index.md", "tumrun")
    assert (tmp_path / "post" / "figures" / catalog.INDEX).is_file()  # its own copy is replaced
