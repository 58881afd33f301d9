"""The report's copy of the paper (publish/render.py: report_page): same text and figures, within the size
a browser opens from the report's data: URI."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest
from PIL import Image

from luksbench.publish.render import report_page


def noisy_png(seed: int, size=(300, 200)) -> bytes:
    """A PNG that compresses badly (random colours): a figure heavier than any real one."""
    pixels = np.random.default_rng(seed).integers(0, 256, (*size[::-1], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def paper(n_figures: int) -> str:
    images = "".join(
        f'<p><img src="data:image/png;base64,{base64.b64encode(noisy_png(i)).decode()}" '
        f'alt="figure {i}"></p>\n'
        for i in range(n_figures)
    )
    return (
        f"<!doctype html><html><body>\n<h1>Title</h1>\n<p>The answer.</p>\n{images}</body></html>"
    )


def embedded(page: str) -> list[Image.Image]:
    found = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    return [Image.open(io.BytesIO(base64.b64decode(data))) for data in found]


def test_the_report_copy_fits_the_budget_with_every_figure_and_the_text():
    original = paper(4)
    assert len(original) > 900_000  # 4 x 180 kB of noise: far above the budget
    page = report_page(original, "small", budget=150_000)
    assert len(page.encode()) <= 150_000
    figures = embedded(page)
    assert len(figures) == 4 and all(f.width < 300 for f in figures)  # downscaled
    assert "<h1>Title</h1>" in page and "<p>The answer.</p>" in page
    assert 'alt="figure 3"' in page and "paper/small/index.html" in page


def test_a_page_that_fits_keeps_its_figures_at_full_size():
    page = report_page(paper(1), "small", budget=10_000_000)
    assert [f.size for f in embedded(page)] == [(300, 200)]


def test_a_page_that_cannot_fit_is_refused_naming_the_run():
    with pytest.raises(ValueError, match="run small does not fit 1000 bytes"):
        report_page(paper(1), "small", budget=1000)
