"""The paper's figures: the figure index's entries grouped by family, linked from the Markdown
file, and the one summary figure the post opens with."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from luksbench.publish.catalog import FIGURE_FAMILIES, INDEX, read_hosts, read_index, read_skipped
from luksbench.publish.text import cpu_basis, md_escape_keeping_code, rw_rank


def figure_sections(figures_dir: Path, out_md: Path, net: bool = False) -> list[dict]:
    """The run's figures from the figure index, grouped by family (in FIGURE_FAMILIES order),
    linked relative to the Markdown file (none when no figures were drawn); each family also
    lists the figures the catalog did not draw, with why (``skipped``). ``net``: the CPU values
    are net of the idle baseline (:func:`~luksbench.publish.text.cpu_net`)."""
    indexed = (Path(figures_dir) / INDEX).exists()
    entries = read_index(figures_dir) if indexed else []
    not_drawn = read_skipped(figures_dir) if indexed else []
    hosts = read_hosts(figures_dir) if indexed else {}
    sections = []
    for kind, (heading, intro) in FIGURE_FAMILIES.items():
        found = sorted(  # the SCS post's order: read, write, randread, randwrite; bandwidth first
            (e for e in entries if e["family"] == kind),
            key=lambda e: (
                min(rw_rank(w) for w in e["name"].split("-")),
                e["name"].endswith("iops"),
                e["name"],
            ),
        )
        skipped = [
            {
                "caption": md_escape_keeping_code(e["caption"]),
                "reason": md_escape_keeping_code(e["reason"]),
            }
            for e in not_drawn
            if e["family"] == kind
        ]
        if not found and not skipped:
            continue
        figures = [
            {
                "caption": md_escape_keeping_code(e["caption"]),
                "png": quote(relative_link(Path(figures_dir) / e["files"][0], out_md)),
                "name": e["name"],
            }
            for e in found
        ]
        intro = intro.replace("{cpu_basis}", cpu_basis(net))
        for key, value in hosts.items():  # the fleet's host count and the per-host limit
            intro = intro.replace("{" + key + "}", f"{value:,}")
        sections.append(
            {"kind": kind, "heading": heading, "intro": intro, "figures": figures}
            | {"skipped": skipped}
        )
    return sections


def summary_figure(sections: list[dict]) -> dict | None:
    """The figure that answers at a glance, for the top of the post: the (first host's)
    bandwidth heatmap, else (a fleet) every host's bandwidth loss, else the headline comparison's
    cost chart (its data all withheld: none)."""
    drawn = {f["name"]: f for sec in sections for f in sec["figures"]}
    heatmaps = sorted(n for n in drawn if n.startswith("heatmap-") and n.endswith("-bw_bytes"))
    if heatmaps:
        note = (
            "Every cell's bandwidth loss with its interval and the decision it supports; "
            "latency, CPU and every other metric are in the tables and figures below"
        )
        return drawn[heatmaps[0]] | {"note": note}
    if "fleet-bw_bytes" in drawn:
        note = (
            "Every host's bandwidth loss per cell, coloured by its decision; the tables below "
            "have each host's interval"
        )
        return drawn["fleet-bw_bytes"] | {"note": note}
    if "loss" in drawn:
        return drawn["loss"] | {"note": "Every cell's interval against the decision regions"}
    return None


def relative_link(path: Path, out_md: Path) -> str:
    """``path`` as a link from the Markdown file ``out_md``."""
    return Path(os.path.relpath(path, Path(out_md).parent)).as_posix()
