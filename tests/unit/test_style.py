"""ruff is the project's linter and formatter: the tree (notebooks included) stays clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).parent / "ruff"


def test_ruff_check_is_clean():
    result = subprocess.run([str(RUFF), "check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean():
    result = subprocess.run(
        [str(RUFF), "format", "--check", "."], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_interval_bars_draw_a_mean_at_or_below_zero():
    # net CPU within idle noise can average below 0: its bar has no lower error bar, no error
    import matplotlib.pyplot as plt

    from luksbench.publish.style import interval_bars

    fig, ax = plt.subplots()
    interval_bars(ax, [0, 1, 2], [-0.2, 0.0, 2.0], [0.5, 0.1, 0.5], 0.8, "C0", "net")
    plt.close(fig)


def test_snakefmt_is_clean():
    # line length and file pattern come from pyproject's [tool.snakefmt]
    snakefmt = Path(sys.executable).parent / "snakefmt"
    result = subprocess.run(
        [str(snakefmt), "--check", "Snakefile", "workflow"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_figure_is_saved_in_both_formats_from_one_layout_at_its_tight_size(tmp_path):
    """save_figure lays a constrained figure out once: both files have the size
    ``bbox_inches="tight"`` gives (a legend outside the axes included), and the layout engine
    is off afterwards, so the second format is not laid out again."""
    import xml.etree.ElementTree as ET

    import matplotlib.pyplot as plt
    from matplotlib.image import imread
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    from luksbench.publish.style import DPI, save_figure

    def drawn():
        fig, axes = plt.subplots(1, 2, figsize=(6, 3), layout="constrained")
        for ax in axes:
            ax.plot([0, 1], [0, 1], label="a long legend label")
        fig.legend(loc="outside lower center")
        fig.suptitle("a title")
        return fig

    reference = drawn()
    tight = tmp_path / "tight.png"
    reference.savefig(tight, dpi=DPI, bbox_inches="tight")
    plt.close(reference)
    fig = drawn()
    png, svg = save_figure(fig, tmp_path / "one", {"title": "t"})
    assert not isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    plt.close(fig)
    assert imread(png).shape == imread(tight).shape
    width = float(ET.parse(svg).getroot().get("width").removesuffix("pt"))
    assert abs(width - imread(tight).shape[1] * 72 / DPI) < 2
