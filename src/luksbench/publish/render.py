"""Rendering the paper: the Jinja2 template (``templates/paper.md.j2``) filled with
:func:`luksbench.publish.paper.paper_context` into ``index.md`` with front matter, and the
Markdown turned into one self-contained ``index.html`` (figures embedded)."""

from __future__ import annotations

import base64
import html as html_lib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

import jinja2
from markdown_it import MarkdownIt

from luksbench.formats.layout import read_raw_file, replace_file
from luksbench.publish.catalog import INDEX
from luksbench.publish.paper import paper_context
from luksbench.publish.text import md_table

TEMPLATE = "paper.md.j2"


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("luksbench.publish", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        finalize=inert,
    )
    environment.globals["md_table"] = md_table
    return environment


_TAG_OR_LIQUID = re.compile(r"<(?=[A-Za-z/!?])|\{(?=[{%])")
_LIQUID = re.compile(r"\{(?=[{%])")
# a code span the code wrote (an escaped backtick from data opens none): Markdown shows its
# content as text, so a "<" there is harmless and an entity would print as "&#60;"
_CODE_SPAN = re.compile(r"(?<!\\)(`[^`\n]+?(?<!\\)`)")


def _entity(match: re.Match) -> str:
    return f"&#{ord(match.group(0))};"


def inert(value) -> str:
    """Every value the template prints, last line of defence: the context escapes the run's text
    (:func:`~luksbench.publish.text.md_escape`), and whatever still opens an HTML tag or a Liquid
    tag (Jekyll) is written as an entity; inside a code span only a Liquid tag (Jekyll reads
    those before Markdown)."""
    parts = _CODE_SPAN.split("" if value is None else str(value))
    return "".join(
        (_LIQUID if k % 2 else _TAG_OR_LIQUID).sub(_entity, part) for k, part in enumerate(parts)
    )


def render_paper(processed_dir: Path, figures_dir: Path, out_md: Path, run: str, **options) -> Path:
    """Render the post of ``run`` into ``out_md`` (normally ``paper/<run>/index.md``), the figures
    copied beside it (``figures/``, linked relative: the folder is the post); ``options`` are
    :func:`~luksbench.publish.paper.paper_context`'s. Returns ``out_md``."""
    out_md = Path(out_md)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    post_figures = out_md.parent / "figures"
    if Path(figures_dir).is_dir() and Path(figures_dir).resolve() != post_figures.resolve():
        _replace_post_figures(Path(figures_dir), post_figures)
    context = paper_context(processed_dir, post_figures, out_md, run, **options)
    text = _environment().get_template(TEMPLATE).render(**context)
    replace_file(out_md, text.encode())
    return out_md


def _replace_post_figures(figures_dir: Path, post_figures: Path) -> None:
    """Copy the run's figures to ``post_figures``, replacing only a folder luksbench wrote there
    (it holds the figure index): a site's own ``figures/`` folder, or one that holds or is held by
    ``figures_dir``, is refused rather than deleted."""
    source, target = figures_dir.resolve(), post_figures.resolve()
    if source.is_relative_to(target) or target.is_relative_to(source):
        raise ValueError(f"figures {source} and the post's {target} hold one another")
    if post_figures.exists():
        if not (post_figures / INDEX).is_file():
            raise ValueError(
                f"{post_figures} exists and was not written by luksbench (no {INDEX}): "
                "move it, or point paper_dir at a folder of its own"
            )
        shutil.rmtree(post_figures)
    # a symbolic link among the figures is not copied (it may point anywhere)
    links = lambda folder, names: [n for n in names if Path(folder, n).is_symlink()]  # noqa: E731
    shutil.copytree(figures_dir, post_figures, ignore=links)


def split_front_matter(text: str) -> tuple[dict, str]:
    """(front matter as {key: value}, body) of a Markdown file starting with ``---``."""
    if not text.startswith("---\n"):
        return {}, text
    head, _, body = text[4:].partition("\n---\n")
    meta, key = {}, None
    for line in head.splitlines():
        if line.startswith("  - ") and key:  # an item of the list under the key above
            meta[key] = [*(meta[key] or []), _scalar(line[4:])]
            continue
        key, sep, value = line.partition(":")
        key = key.strip() if sep else None
        if key:
            meta[key] = _scalar(value.strip())
    return meta, body


def _scalar(value: str):
    try:
        return json.loads(value) if value.startswith('"') else value
    except json.JSONDecodeError:
        return value


def _text(value) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;
margin:2rem auto;padding:0 1rem;line-height:1.5;color:#222}
h1{font-size:1.9rem;margin-bottom:.2rem}.byline{color:#666;margin-top:0}
h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
table{border-collapse:collapse;margin:1rem 0;font-size:.88rem;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.25rem .5rem;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
img{max-width:100%;height:auto;border:1px solid #eee}
code{background:#f5f5f5;padding:0 .2rem;border-radius:3px}
blockquote{border-left:4px solid #c0392b;margin:1rem 0;padding:.2rem 1rem;background:#fdf2e9}
"""


#: what the HTML may do: show its own styles and embedded images, nothing else (no script, no
#: request, no form, no frame)
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
#: the images a post embeds: its own figures, by suffix
IMAGE_TYPES = {
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
}
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def _markdown() -> MarkdownIt:
    """CommonMark + tables with raw HTML off (written as text); links only to web pages, mail
    addresses and paths without a scheme (no javascript:, data:, file: ...)."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    md.validateLink = lambda url: (
        not _SCHEME.match(url.strip())
        or url.strip().lower().startswith(("http://", "https://", "mailto:"))
    )
    return md


def figure_file(md_dir: Path, src: str) -> Path | None:
    """The post's own figure that image ``src`` names: a file of a known image type under
    ``<md_dir>/figures/``, reached without "..", an absolute path or a symbolic link; else None."""
    parts = PurePosixPath(unquote(src)).parts
    if len(parts) < 2 or parts[0] != "figures" or any(p in ("..", ".", "/") for p in parts):
        return None
    path = Path(md_dir)
    for part in parts:
        path = path / part
        if path.is_symlink():
            return None
    figures = (Path(md_dir) / "figures").resolve()
    if path.suffix.lower() not in IMAGE_TYPES or not path.resolve().is_relative_to(figures):
        return None
    return path


def render_html(md_path: Path, html_path: Path | None = None) -> Path:
    """Markdown -> one self-contained HTML file (CommonMark + tables): the post's own figures
    (``figures/`` beside it) embedded as data URIs, any other image left out (its text kept), raw
    HTML written as text, a Content-Security-Policy that allows no script; the front matter as
    title and byline."""
    md_path = Path(md_path)
    html_path = Path(html_path) if html_path else md_path.with_suffix(".html")
    meta, body_md = split_front_matter(md_path.read_text())
    title = meta.get("title") or next(
        (line[2:].strip() for line in body_md.splitlines() if line.startswith("# ")), md_path.stem
    )
    body = _markdown().render(body_md)

    def embed(match: re.Match) -> str:
        src, alt = html_lib.unescape(match.group(1)), match.group(2)
        path = figure_file(md_path.parent, src)
        if path is None:
            return f'<span class="not-embedded">[image not embedded: {alt}]</span>'
        try:
            data = base64.b64encode(read_raw_file(path)).decode("ascii")
        except OSError as exc:
            raise FileNotFoundError(f"{md_path}: image {src} not readable ({exc})") from exc
        return f'<img src="data:{IMAGE_TYPES[path.suffix.lower()]};base64,{data}" alt="{alt}" />'

    body = re.sub(r'<img src="([^"]*)" alt="([^"]*)"[^>]*>', embed, body)
    byline = " · ".join(html_lib.escape(_text(meta[k])) for k in ("author", "date") if meta.get(k))
    if byline:
        body = re.sub(r"(</h1>)", rf'\1\n<p class="byline">{byline}</p>', body, count=1)
    page = (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>\n"
        f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">\n"
        "<meta name='referrer' content='no-referrer'>\n"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>\n"
        f"<title>{html_lib.escape(str(title))}</title>\n"
        + "".join(
            f"<meta name='{k}' content='{html_lib.escape(_text(v))}'>\n"
            for k, v in meta.items()
            if k in ("author", "date", "generator", "run")
        )
        + f"<style>{_CSS}</style></head>\n<body>\n{body}</body></html>\n"
    )
    replace_file(html_path, page.encode())
    return html_path


PDF_TOOLS = ("pandoc", "weasyprint")  # also the names of their Debian packages


def render_pdf(md_path: Path, pdf_path: Path | None = None) -> Path:
    """The post as PDF: pandoc, with weasyprint turning its HTML into PDF. The figure links are
    resolved from the post's folder. FileNotFoundError saying how to get a missing tool."""
    md_path = Path(md_path).resolve()
    pdf_path = Path(pdf_path).resolve() if pdf_path else md_path.with_suffix(".pdf")
    if missing := [tool for tool in PDF_TOOLS if shutil.which(tool) is None]:
        raise FileNotFoundError(
            f"the PDF needs {' and '.join(missing)}, not found on PATH: install it "
            f"(Debian/Ubuntu: `sudo apt-get install {' '.join(missing)}`; `bash scripts/setup.sh` does "
            "it) or use index.html, which prints to PDF from any browser"
        )
    argv = ["pandoc", md_path.name, "--pdf-engine=weasyprint", "-o", str(pdf_path)]
    proc = subprocess.run(argv, cwd=md_path.parent, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"pandoc exited {proc.returncode} on {md_path}: {proc.stderr.strip()}")
    return pdf_path


# --------------------------------------------------------------------------- the report's copy
# `snakemake --report report.html` embeds every result as one data: URI, and Chromium does not
# open a data: URI longer than 2 MiB (url::kMaxURLChars) in the report's frame: the paper with its
# figures at print resolution (about 3 MB) stays a blank page there. The report's copy has the same
# text with its figures downscaled and palette-coded until the whole page fits BUDGET_BYTES; the
# figures at full resolution are the report's own figure entries and paper/<run>/.

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
