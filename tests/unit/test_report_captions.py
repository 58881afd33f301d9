"""The Snakemake report's figure captions (report/figure.rst, filled from the run's figure index by
workflow/rules/common.smk's FigureIndex) are reStructuredText: a host or stack name from a raw
run reaches a figure's name and caption, so what it says is escaped and reads as the text it is,
with no markup, role, reference or directive of its own (``.. include::`` reads local files)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import jinja2
import pytest
from docutils import nodes
from docutils.core import publish_doctree

from luksbench.publish.text import rst_text

REPO = Path(__file__).resolve().parents[2]
HOSTILE = [
    "*bold* **strong** `literal` ``code`` _target_ |sub| [1]_ :math:`x` <http://evil.example>`_",
    "host\n\n.. include:: /etc/passwd\n\n.. raw:: html\n\n   <script>alert(1)</script>",
    'back\\slash \\*not\\* =HYPERLINK("x") trailing_ __anon__ name_ `a <b>`_',
    "tab\there\rcr\x00nul \u2028 line-sep -- list\n- item\n#. enum",
]


def _doctree(text: str) -> nodes.document:
    settings = {"report_level": 5, "halt_level": 5}  # no message printed; the tree is checked
    return publish_doctree(text, settings_overrides=settings)


def _plain(text: str) -> str:
    return " ".join("".join(" " if ord(c) < 32 or c.isspace() else c for c in text).split())


def _only_text(tree: nodes.document, allowed: tuple) -> list[str]:
    """Nodes of ``tree`` other than the document, paragraphs, ``allowed`` and text."""
    kinds = (nodes.document, nodes.paragraph, nodes.Text, *allowed)
    return [type(n).__name__ for n in tree.findall() if not isinstance(n, kinds)]


@pytest.mark.parametrize("value", HOSTILE)
def test_escaped_text_reads_as_itself_in_strong_emphasis(value):
    tree = _doctree(f"**{rst_text(value)}**\n")
    assert _only_text(tree, (nodes.strong,)) == []
    (strong,) = list(tree.findall(nodes.strong))
    assert re.sub(r"\s+", " ", strong.astext()) == _plain(value)


def _figure_index_class():
    """workflow/rules/common.smk's FigureIndex, as the workflow defines it."""
    source = (REPO / "workflow/rules/common.smk").read_text()
    start = source.index("class FigureIndex:")
    end = re.compile(r"^\S", re.M).search(source, start + 1).start()
    scope = {"rst_text": rst_text}
    exec(source[start:end], scope)
    return scope["FigureIndex"]


def test_the_report_caption_of_a_figure_named_after_hostile_names_is_inert(tmp_path):
    name = "throughput-*h*_`x`-read-bw_bytes"
    caption = "Cost per cell: `|luks|` against `plain_`\n\n.. include:: /etc/passwd"
    index = {"run": "r", "figures": [{"name": name, "family": "loss", "caption": caption}]}
    (tmp_path / "index.json").write_text(json.dumps(index))
    figure_index = _figure_index_class()(tmp_path)
    snakemake = SimpleNamespace(
        params=SimpleNamespace(figure_index=figure_index),
        wildcards=SimpleNamespace(name=name, run="r"),
    )
    template = jinja2.Template((REPO / "report/figure.rst").read_text())
    tree = _doctree(template.render(snakemake=snakemake))
    allowed = (nodes.strong, nodes.literal)
    assert _only_text(tree, allowed) == []
    (strong,) = list(tree.findall(nodes.strong))
    assert re.sub(r"\s+", " ", strong.astext()) == _plain(caption)
    literals = {n.astext() for n in tree.findall(nodes.literal)}
    assert literals <= {"r", "figures/r/", "openssl speed -evp"}, literals  # the template's own
    assert f"Figure {name} of run" in tree.astext().replace("\n", " ")
    assert "root:" not in tree.astext()
