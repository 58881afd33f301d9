"""Untrusted text and files: what raw data or config says reaches Markdown, HTML and CSV inert, and
no raw file is read, nor any output written, through a symbolic link."""

from __future__ import annotations

import base64
import csv
import json
import os
from pathlib import Path

import pandas as pd
import pytest
from hostile import (
    ENV_PAYLOADS,
    HOST,
    JOB_NAME,
    LINKED_REP,
    RETYPED_HOST,
    SECRET,
    LiveMarkup,
    build_hostile_run,
)
from markdown_it import MarkdownIt

from luksbench.analysis.ingest import ingest_run
from luksbench.analysis.tablefiles import CSV_NOTE, write_csv, write_tables
from luksbench.formats.layout import read_json_object, read_raw_file, replace_file
from luksbench.publish.render import CSP, figure_file, inert, render_html
from luksbench.publish.text import md_escape, md_escape_keeping_code, md_table

PAYLOADS = [
    *ENV_PAYLOADS.values(),
    "<script>alert(1)</script>",
    "![k](../../secret.txt)",
    '<img src="/etc/shadow">',
    "[x](javascript:alert(1))",
    "<javascript:alert(1)>",
    "https://evil.example/x www.evil.example a@evil.example",
    "x\n<script>alert(1)</script>\n# heading\n- item",
    "`a` | b | `c`",
    "{{ site.secret }} {% include x %}",
    "*em* _em_ __strong__ ~~del~~",
    "a\\<b>c\\`d",
    "1. ordered",
    "-leading",
    "&lt;script&gt;",
]
#: CommonMark with raw HTML on: the most permissive renderer a site may use
PERMISSIVE = MarkdownIt("commonmark").enable("table")


def _inert(markdown: str) -> LiveMarkup:
    page = LiveMarkup.of(PERMISSIVE.render(markdown))
    assert not page.found and not page.images, (markdown, page.found, page.images)
    return page


@pytest.mark.parametrize("value", PAYLOADS)
def test_escaped_text_is_inert_in_text_code_spans_and_tables(value):
    text = md_escape(value)
    for markdown in (
        f"Host {text} measured.",
        f"{text}",
        f"- `{text}`: host",
        md_table(["host", "CPU"], [[text, f"`{text}`"]]),
    ):
        html = PERMISSIVE.render(markdown)
        _inert(markdown)
        assert "<a " not in html and "<em>" not in html and "<strong>" not in html, html
        assert "{{" not in markdown and "{%" not in markdown  # no Liquid tag (Jekyll)


@pytest.mark.parametrize("value", PAYLOADS)
def test_escaped_text_reads_as_it_was_written(value):
    """Rendered, the escaped text is the value itself (line breaks as spaces), not markup."""
    from html.parser import HTMLParser

    class Text(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.text = ""

        def handle_data(self, data):
            self.text += data

    parser = Text()
    parser.feed(PERMISSIVE.render(f"x {md_escape(value)}"))
    assert parser.text.strip() == "x " + " ".join(value.split("\n")).strip()


@pytest.mark.parametrize(
    "name",
    ["my_host", "6.1.0-18-amd64", "Intel(R) Xeon(R) Processor @ 2.80GHz", "luks-no-read-workqueue"],
)
def test_ordinary_names_print_as_they_are(name):
    assert md_escape(name) == name


def test_a_table_cell_with_a_pipe_stays_one_cell():
    table = md_table(["a", "b"], [["x|y", "`p|q`"], ["one\ntwo", "z"]])
    html = PERMISSIVE.render(table)
    assert html.count("<td>") == 4, html
    assert "<td>x|y</td>" in html and "<code>p|q</code>" in html


def test_a_caption_keeps_its_code_spans_and_escapes_the_rest():
    assert md_escape_keeping_code("`luks` against `plain`") == "`luks` against `plain`"
    caption = md_escape_keeping_code("`<b>` and <script>x</script> `a|b`")
    _inert(caption)
    assert caption.startswith("`<b>`") and "`a|b`" not in caption


def test_the_template_finalize_writes_tags_and_liquid_as_entities():
    assert inert("<script>x</script> {% include a %} {{ b }}") == (
        "&#60;script>x&#60;/script> &#123;% include a %} &#123;{ b }}"
    )
    assert inert("a < b, p<0.05 is written") == "a < b, p<0.05 is written"
    assert inert(None) == ""


def _post(tmp_path: Path) -> tuple[Path, bytes]:
    """A post with its own figure and a link among its figures to a file outside."""
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    post = tmp_path / "paper" / "run"
    (post / "figures").mkdir(parents=True)
    png = b"\x89PNG\r\n\x1a\nfigure"
    (post / "figures" / "fig.png").write_bytes(png)
    (post / "figures" / "link.png").symlink_to(secret)
    (tmp_path / "figures-out.png").write_bytes(SECRET.encode())
    return post, png


def test_the_html_embeds_only_the_posts_own_figures_and_allows_no_script(tmp_path):
    post, png = _post(tmp_path)
    md = post / "index.md"
    md.write_text(
        '---\ntitle: "<script>alert(1)</script>"\nauthor: "<b>x</b>"\n---\n\n# T\n\n'
        "![ours](figures/fig.png)\n\n![link](figures/link.png)\n\n"
        f"![abs]({tmp_path / 'secret.txt'})\n\n![up](../../secret.txt)\n\n"
        "![out](figures/../../../figures-out.png)\n\n"
        '<img src="../../secret.txt"> <script>alert(2)</script> <svg onload=alert(3)>\n\n'
        "[js](javascript:alert(4)) [data](data:text/html,<script>x</script>) "
        "[web](https://example.org/)\n"
    )
    page = render_html(md).read_text()
    assert SECRET not in page
    live = LiveMarkup.of(page)
    assert [f for f in live.found if "href=https://example.org/" not in f] == [], live.found
    assert live.images == ["data:image/png;base64," + base64.b64encode(png).decode()]
    assert f'content="{CSP}"' in page and "script-src" not in CSP and "default-src 'none'" in CSP
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the title, as text
    for encoded in (base64.b64encode(SECRET.encode()), base64.b64encode(f"{SECRET}\n".encode())):
        assert encoded.decode()[:16] not in page


@pytest.mark.parametrize(
    ("src", "ok"),
    [
        ("figures/fig.png", True),
        ("figures/link.png", False),  # a link out
        ("figures/../figures/fig.png", False),
        ("/etc/hostname", False),
        ("../../secret.txt", False),
        ("figures/fig.txt", False),  # not an image type
        ("fig.png", False),  # not in figures/
    ],
)
def test_figure_file_accepts_only_the_posts_figures(tmp_path, src, ok):
    post, _ = _post(tmp_path)
    (post / "figures" / "fig.txt").write_text("x")
    assert (figure_file(post, src) is not None) == ok


def test_a_linked_figures_folder_is_not_embedded(tmp_path):
    post, _ = _post(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (post / "figures").rename(elsewhere)
    (post / "figures").symlink_to(elsewhere)
    assert figure_file(post, "figures/fig.png") is None


def _csv_cells(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return [cell for row in csv.reader(f) for cell in row]


def test_csv_cells_that_start_like_a_formula_open_as_text(tmp_path):
    df = pd.DataFrame(
        {
            "job": [JOB_NAME, '=HYPERLINK("x")', "+1", "@SUM(1)", "\tx", "\rx", "ok", None],
            "value": [-1.5, -2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
            "host": pd.Categorical(["-h"] * 8),
        }
    )
    df["job"] = df["job"].astype("string")
    write_csv(df, tmp_path / "t.csv")
    cells = _csv_cells(tmp_path / "t.csv")
    formulas = [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r")]
    assert formulas == ["-1.5", "-2"], formulas  # the negative numbers only
    assert "'" + JOB_NAME in cells and "'-h" in cells and "ok" in cells
    with (tmp_path / "t.csv").open() as f:
        assert ",-1.5," in f.read()  # a number, unquoted

    written = write_tables(tmp_path, {"fio": df})  # the parquet file keeps the value
    assert pd.read_parquet(written["fio"])["job"].iloc[0] == JOB_NAME
    assert "'" + JOB_NAME in _csv_cells(tmp_path / "fio.csv")
    assert CSV_NOTE in (tmp_path / "README.md").read_text()


def test_outputs_replace_a_link_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("README.md", "fio.csv", "fio.parquet", "x.md"):
        (out / name).symlink_to(victim)
    replace_file(out / "x.md", b"new")
    write_tables(out, {"fio": pd.DataFrame({"a": [1]})})
    assert victim.read_text() == "keep"
    for name in ("README.md", "fio.csv", "fio.parquet", "x.md"):
        assert not (out / name).is_symlink() and (out / name).is_file()
    assert (out / "x.md").read_bytes() == b"new"
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "fio.csv", "fio.parquet", "x.md"]


def test_a_raw_file_is_not_read_through_a_link(tmp_path):
    (tmp_path / "secret.txt").write_text(SECRET)
    (tmp_path / "env.json").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(OSError, match="symbolic link"):
        read_raw_file(tmp_path / "env.json")
    # a linked folder inside a host's fio/ folder: its documents are not read either
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "manifest.json").write_text(json.dumps({"x": SECRET}))
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "fio").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="symbolic link"):
        read_json_object(tmp_path / "host" / "fio" / "manifest.json")


@pytest.fixture(scope="module")
def hostile_tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile") / "wf"
    hostile = build_hostile_run(root)
    # a linked host folder and a linked stack folder, both holding results outside the run
    (hostile.outside / "host").mkdir()
    os.symlink(hostile.host_dir / "fio", hostile.outside / "host" / "fio")
    (hostile.raw_dir / "linkedhost").symlink_to(hostile.outside / "host")
    os.symlink(hostile.host_dir / "fio" / "luks", hostile.host_dir / "fio" / "luks2")
    links = [*hostile.links, "linkedhost", f"{HOST}/fio/luks2"]
    return hostile, links, ingest_run(hostile.raw_dir, workers=1)


def test_every_link_in_a_raw_run_is_a_problem_and_nothing_behind_it_is_read(hostile_tables):
    _, links, tables = hostile_tables
    problems = tables["problems"]
    excluded = set(problems.loc[problems["severity"] == "excluded", "file"])
    assert set(links) <= excluded, set(links) - excluded
    for name, table in tables.items():
        text = table.astype(str).to_csv()
        assert SECRET not in text, name
    fio = tables["fio"]
    assert set(fio["host"]) == {HOST, RETYPED_HOST} and set(fio["stack"]) == {"plain", "luks"}
    fio = fio[fio["host"] == HOST]
    rep3 = fio[(fio["stack"] == "luks") & (fio["workload"] == "read-4k-qd1")]["rep"]
    assert sorted(rep3.unique()) == [1, 2], LINKED_REP


def test_markup_from_a_raw_run_is_kept_in_the_tables_as_written(hostile_tables):
    """The tables keep what the raw run says (escaping is the publisher's job)."""
    _, _, tables = hostile_tables
    env = tables["env"].set_index("host").loc[HOST]
    assert env["hostname"] == ENV_PAYLOADS["hostname"]
    fio = tables["fio"]
    assert set(fio.loc[fio["host"] == HOST, "job"]) == {JOB_NAME}


def test_the_compare_markdown_escapes_both_runs_text(tmp_path):
    from luksbench.analysis.runcompare import RunData
    from luksbench.publish.comparepage import compare_markdown

    row = {"confidence": 0.95, "host_a": HOST, "host_b": "<b>b</b>", "metric": "bw_bytes"}
    row |= {"rw": "randread", "bs_bytes": 4096, "iodepth": 1, "pattern": "", "direction": "read"}
    row |= {"stack": "<script>alert(1)</script>", "a_mean": 1.0, "b_mean": 2.0}
    row |= {"change_pct": 1.0, "ci_low": 0.5, "ci_high": 1.5, "verdict": "<i>v</i>"}
    row |= {"outcome": "![x](/etc/shadow)", "n_a": 3, "n_b": 3, "job": JOB_NAME}
    table = pd.DataFrame([row])
    table.attrs["designs"] = {f"<a>={HOST}": {"design": "paired", "reason": "<img src=x>"}}
    empty = pd.DataFrame()
    a = RunData("<script>a</script>", "`/x`<svg onload=1>", empty, empty, empty)
    b = RunData("[b](javascript:alert(1))", "/y", empty, empty, empty)
    markdown = compare_markdown(table, a, b, ["kernel `<b>` vs <script>x</script>"])
    _inert(markdown)
    assert "<td>&lt;i&gt;v&lt;/i&gt;</td>" in PERMISSIVE.render(markdown)  # as text


def test_front_matter_values_hold_no_markup_and_read_back_as_written():
    import yaml

    from luksbench.publish.paper import front_matter_yaml

    fields = {"title": "<script>alert(1)</script> & \u2028x", "tags": ["<b>t</b>"]}
    fields["image"] = {"path": "<img src=x>"}
    text = front_matter_yaml(fields)
    assert not set("<>&\u2028") & set(text), text
    assert yaml.safe_load(text) == fields


def test_csv_written_by_pandas_to_standard_output_is_neutralised_too():
    from luksbench.analysis.tablefiles import csv_safe_frame

    df = pd.DataFrame({"host": ["=1+1", "ok", None], "effect_pct": [-1.5, 2.0, 3.0]})
    safe = csv_safe_frame(df)
    assert safe["host"].tolist()[:2] == ["'=1+1", "ok"] and safe["effect_pct"].iloc[0] == -1.5
    assert df["host"].iloc[0] == "=1+1"  # the table itself is left as it is


def test_inert_leaves_code_spans_readable_and_still_neutralises_tags_and_liquid():
    from luksbench.publish.render import inert

    text = "run `cryptsetup refresh --persistent <name>` then <script>x</script> `{{ y }}`"
    out = inert(text)
    assert "`cryptsetup refresh --persistent <name>`" in out  # Markdown prints a span as text
    assert "<script>" not in out and "&#60;script>" in out
    assert "{{" not in out  # Jekyll reads Liquid before Markdown, in code spans too
    assert "<b>" not in inert(r"\`<b>\`")  # an escaped backtick opens no span
