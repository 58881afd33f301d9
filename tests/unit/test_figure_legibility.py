"""Figures readable at page width: the heatmap's marks look the same on pale and dark cells, and
the loss chart wraps its panels into rows instead of one strip of every metric."""

from __future__ import annotations

import matplotlib.colors
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from luksbench.publish import figures


@pytest.fixture(scope="module")
def loss_table(processed_sample):
    return pd.read_parquet(processed_sample / "loss.parquet")


def test_heatmap_marks_are_black_on_a_light_box_on_every_cell(loss_table):
    fig = figures.loss_heatmap(loss_table, "bw_bytes")
    marks = [t for ax in fig.axes for t in ax.texts if "\n" in t.get_text()]
    # the sample has cells near the top of the colour scale (dark) and near 0 (pale)
    assert any("material" in t.get_text() for t in marks)
    assert any("undecided" in t.get_text() for t in marks)
    for t in marks:
        assert max(matplotlib.colors.to_rgb(t.get_color())) < 0.3, t.get_text()  # dark text
        box = t.get_bbox_patch()
        assert box is not None and matplotlib.colors.to_hex(box.get_facecolor()) == "#ffffff"
    plt.close(fig)


def test_loss_chart_wraps_panels_into_rows(loss_table):
    metrics = list(dict.fromkeys(loss_table["metric"]))
    assert len(metrics) > figures.LOSS_PANELS_PER_ROW
    fig = figures.loss_figure(loss_table)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(shown) == len(metrics)
    columns = {round(ax.get_position().x0, 3) for ax in shown}
    assert len(columns) == figures.LOSS_PANELS_PER_ROW
    width, height = fig.get_size_inches()
    # each panel at least 4 inches wide, the whole no wider than tall by more than 2:1
    assert width / figures.LOSS_PANELS_PER_ROW >= 4 and width / height <= 2
    plt.close(fig)
