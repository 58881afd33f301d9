"""The paper as the Snakemake report shows it: ``snakemake --report report.html`` embeds every
result as one ``data:`` URI, and Chromium does not open a ``data:`` URI longer than 2 MiB
(``url::kMaxURLChars``) in the report's frame: the self-contained paper (figures at print
resolution, about 3 MB) stays a blank page there. The report's copy has the same text with its
figures downscaled and palette-coded until the whole page fits :data:`BUDGET_BYTES`; the
figures at full resolution are the report's own figure entries and ``paper/<run>/``.

Run as ``python -m luksbench.publish.reportpage PAPER_HTML OUT_HTML``.
"""

from __future__ import annotations

import base64
import io
import re
import sys
from pathlib import Path

#: the report page's size at most: its data: URI (4/3 of it, base64) stays well inside 2 MiB
BUDGET_BYTES = 1_200_000
#: the figures' scales tried in turn, largest first (1.0: print resolution, palette-coded only)
SCALES = (1.0, 0.85, 0.7, 0.6, 0.5, 0.4, 0.3)
_IMAGE = re.compile(r'(<img src=")data:image/png;base64,([A-Za-z0-9+/=]+)(")')
NOTE = (
    '<p class="report-note"><em>In this report the figures are downscaled to fit the page a '
    "browser opens from the report; each figure at full resolution is the report's figure entry "
    "of the same name, and the paper with them is <code>paper/{run}/index.html</code>.</em></p>\n"
)


def _png_at(data: bytes, scale: float) -> bytes:
    """A PNG ``data`` scaled by ``scale`` and reduced to a 256-colour palette (a figure's flat
    colours survive it; the file shrinks to about a third)."""
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB")
    if scale < 1:
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.quantize(256).save(out, "PNG", optimize=True)
    return out.getvalue()


def _with_images(page: str, images: list[bytes]) -> str:
    """``page`` with its embedded PNG figures replaced, in order, by ``images``."""
    replacement = iter(images)

    def swap(match: re.Match) -> str:
        data = base64.b64encode(next(replacement)).decode("ascii")
        return f"{match.group(1)}data:image/png;base64,{data}{match.group(3)}"

    return _IMAGE.sub(swap, page)


def report_page(page: str, run: str, budget: int = BUDGET_BYTES) -> str:
    """The report's copy of the paper HTML ``page``: the figures at the largest of
    :data:`SCALES` at which the page fits ``budget`` bytes; ValueError if none does."""
    originals = [base64.b64decode(m.group(2)) for m in _IMAGE.finditer(page)]
    page = re.sub(r"(<body[^>]*>\n?)", lambda m: m.group(1) + NOTE.format(run=run), page, count=1)
    for scale in SCALES:
        candidate = _with_images(page, [_png_at(data, scale) for data in originals])
        if len(candidate.encode()) <= budget:
            return candidate
    raise ValueError(
        f"the paper of run {run} does not fit {budget} bytes for the report even with its "
        f"{len(originals)} figures at {SCALES[-1]:g} of their size"
    )


def write_report_page(paper_html: Path, out_html: Path, budget: int = BUDGET_BYTES) -> Path:
    """:func:`report_page` of ``paper/<run>/index.html`` written to ``out_html``."""
    paper_html, out_html = Path(paper_html), Path(out_html)
    page = report_page(paper_html.read_text(), paper_html.parent.name, budget)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text(page)
    return out_html


if __name__ == "__main__":
    written = write_report_page(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"wrote {written} ({written.stat().st_size} bytes)")
