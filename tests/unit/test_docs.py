"""The front door and the manual: README stays a front door (short, the two commands CI runs, its
figure and links there), and the MkDocs site in docs/ builds with --strict, where a broken link or
anchor fails the build."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=config.parent)


def test_the_manual_builds_strict(tmp_path):
    result = _mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr
    pages = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
    assert {"install", "your-disk", "statistics", "architecture", "benchmarks"} <= pages


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    for broken in ("[gone](no-such-page.md)", "[gone](statistics.md#no-such-section)"):
        work = tmp_path / broken[7:12]
        shutil.copytree(REPO / "docs", work / "docs")
        shutil.copy(REPO / "mkdocs.yml", work / "mkdocs.yml")
        with (work / "docs" / "install.md").open("a") as f:
            f.write(f"\nSee {broken}.\n")
        result = _mkdocs_build(work / "mkdocs.yml", tmp_path / "site")
        assert result.returncode != 0, broken
        assert "install.md" in result.stderr, result.stderr


def _commands(text: str) -> list[str]:
    """The command lines of the first ```sh block (comments left out)."""
    block = re.search(r"```sh\n(.*?)```", text, re.S)[1]
    return [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]


def test_readme_is_a_front_door_with_the_two_commands_ci_runs():
    assert len(README.splitlines()) < 150
    run, test = _commands(README)
    assert run == "bash scripts/setup.sh && . .venv/bin/activate && snakemake --cores 1 all"
    assert test == "bash scripts/setup.sh && . .venv/bin/activate && pytest"
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == test  # CI runs README's test command, exactly
    install = (REPO / "docs" / "install.md").read_text()
    assert _commands(install) == [run, test]  # the manual repeats them as they are


def test_readme_figure_and_links_point_at_files_that_exist():
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README)
    assert images == ["docs/img/loss-heatmap.png"]
    assert (REPO / images[0]).stat().st_size < 150_000
    links = re.findall(r"(?<!!)\[[^\]]+\]\((docs/[^)#]+)", README)
    assert len(links) >= 10
    for link in links:
        assert (REPO / link).is_file(), link


def test_the_benchmark_results_the_manual_names_exist():
    text = "\n".join(p.read_text() for p in (REPO / "docs").glob("*.md"))
    named = set(re.findall(r"benchmarks/results/(\w+\.txt)", text))
    assert named == {p.name for p in (REPO / "benchmarks" / "results").glob("*.txt")}
    scripts = {p.stem for p in (REPO / "benchmarks").glob("*.py")}
    assert {Path(n).stem for n in named} <= scripts
