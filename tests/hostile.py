"""A hostile raw run: the shipped sample turned into what an operator may be handed by another box,
a fleet or a colleague. Every string the paper, the HTML, the report or the CSVs print from it
carries markup or a spreadsheet formula, some raw files are symbolic links to files outside the
run that hold :data:`SECRET`, some results hold numbers that cannot be true (:data:`IMPOSSIBLE`)
and one host folder has a name YAML would retype (:data:`RETYPED_HOST`). Shared by the unit and
integration tests (not a test module)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
SAMPLE_HOST = REPO_DIR / "data/raw/sample/vm"
#: what every file a link points to holds; it must never reach an output
SECRET = "SECRET-MARKER-hostile-7c1e"
#: the host folder: a spreadsheet formula
HOST = '=HYPERLINK("evil.example","h")'
#: a second host folder whose every file is a link out of the run
LINKED_HOST = "linked"
#: a recorded fio result replaced by a link out of the run
LINKED_REP = "fio/luks/read-4k-qd1/rep3.json"
JOB_NAME = "=cmd|' /C calc'!A0"
#: a second, clean host whose folder name YAML reads as a number (the integer 7)
RETYPED_HOST = "007"
#: recorded results of the hostile host whose numbers cannot be true -> what their problem says
IMPOSSIBLE = {
    "fio/plain/randread-4k-qd1/rep1.json": "json+ histogram bin count -3",
    "fio/luks/randread-4k-qd1/rep2.json": "000 B/s, but io_bytes / runtime is",
}
#: env.json fields -> hostile values (the secret's absolute path is filled in)
ENV_PAYLOADS = {
    "hostname": '=HYPERLINK("http://evil.example/?x","<script>alert(1)</script>")',
    "cpu_model": '-2+3 <img src="{secret}" onerror="alert(2)"> ![k](../../secret.txt)',
    "kernel": "<svg onload=alert(3)>6.1.0 [click](javascript:alert(4))",
    "fio": "@SUM(1+1) fio-3.33 <a href='javascript:alert(5)'>x</a>",
    "cryptsetup": "cryptsetup 2.6.1 <iframe src=javascript:alert(6)></iframe>",
    "qemu": "qemu {{% include_relative ../../secret.txt %}} <b onmouseover=alert(7)>q</b>",
}
CRYPTSETUP_TEXT = (
    "Required kernel crypto interface not available. <script>alert(8)</script>\n"
    "# Tests are approximate using memory only (no storage IO).\n"
    "PBKDF2-<svg/onload=alert(9)>   1750544 iterations per second for 256-bit key\n"
    "PBKDF2-sha256    3116124 iterations per second for 256-bit key\n"
    '=HYPERLINK("x")<img/src=x/onerror=alert(10)>  512b  1000.0 MiB/s  1100.0 MiB/s\n'
)
#: config overrides: paper title, author and front matter from the config are text too
PAPER_CONFIG = {
    "paper": {
        "title": "<script>alert('title')</script> [x](javascript:alert(11)) =1+1",
        "author": "<img src=x onerror=alert(12)>",
        "front_matter": {"tags": ["<script>alert(13)</script>", "=2+2"]},
    }
}


@dataclass
class HostileRun:
    """Where :func:`build_hostile_run` put things."""

    root: Path
    run: str
    outside: Path  # files the links point to, outside the workflow folder
    secret_files: list[Path] = field(default_factory=list)
    #: paths inside the run folder that are symbolic links (each must be a problem)
    links: list[str] = field(default_factory=list)
    #: {path inside the run folder: what its problem says} of results with impossible numbers
    impossible: dict[str, str] = field(default_factory=dict)

    @property
    def raw_dir(self) -> Path:
        return self.root / "data/raw" / self.run

    @property
    def host_dir(self) -> Path:
        return self.raw_dir / HOST


def _link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def _hostile_env(host_dir: Path, secret: Path) -> None:
    path = host_dir / "env.json"
    env = json.loads(path.read_text())
    payload = {k: v.format(secret=secret) for k, v in ENV_PAYLOADS.items()}
    env["hostname"] = payload["hostname"]
    env["cpu"]["model"] = payload["cpu_model"]
    env["kernel"]["release"] = payload["kernel"]
    env["tools"]["fio"] = payload["fio"]
    env["tools"]["cryptsetup"] = payload["cryptsetup"]
    env["tools"]["qemu-storage-daemon"] = payload["qemu"]
    path.write_text(json.dumps(env, indent=1))


def _hostile_job_names(host_dir: Path) -> None:
    for rep in sorted((host_dir / "fio").glob("*/*/rep*.json")):
        if rep.name.endswith(".cpu.json"):
            continue
        doc = json.loads(rep.read_text())
        for job in doc["jobs"]:
            job["jobname"] = JOB_NAME
        rep.chmod(0o644)
        rep.write_text(json.dumps(doc))


def _impossible_numbers(host_dir: Path) -> None:
    """A negative json+ bin count in one result, bandwidth 1000x what ``io_bytes / runtime``
    gives in another (:data:`IMPOSSIBLE`)."""
    negative, fast = IMPOSSIBLE
    doc = json.loads((host_dir / negative).read_text())
    bins = doc["jobs"][0]["read"]["clat_ns"]["bins"]
    bins[next(iter(bins))] = -3
    (host_dir / negative).write_text(json.dumps(doc))
    doc = json.loads((host_dir / fast).read_text())
    doc["jobs"][0]["read"]["bw_bytes"] *= 1000
    doc["jobs"][0]["read"]["bw"] *= 1000
    (host_dir / fast).write_text(json.dumps(doc))


def build_hostile_run(root: Path, run: str = "hostile") -> HostileRun:
    """``root/data/raw/<run>/``: the sample with every hostile payload. ``root`` is the workflow
    folder (a copy); the files the links point to are in ``root``'s parent (``outside/``) and, for
    the Markdown image ``../../secret.txt`` of the paper folder, ``root/secret.txt``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    outside = root.parent / "outside"
    outside.mkdir(parents=True, exist_ok=True)
    hostile = HostileRun(root, run, outside)
    secret = outside / "secret.txt"
    secret.write_text(f"{SECRET}\n")
    (root / "secret.txt").write_text(f"{SECRET}\n")
    hostile.secret_files += [secret, root / "secret.txt"]
    shutil.copytree(SAMPLE_HOST, hostile.host_dir)
    for path in hostile.host_dir.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    _hostile_env(hostile.host_dir, secret)
    (hostile.host_dir / "cryptsetup-benchmark.txt").write_text(CRYPTSETUP_TEXT)
    _hostile_job_names(hostile.host_dir)
    _impossible_numbers(hostile.host_dir)
    hostile.impossible = {f"{HOST}/{path}": why for path, why in IMPOSSIBLE.items()}
    retyped = hostile.raw_dir / RETYPED_HOST
    shutil.copytree(SAMPLE_HOST, retyped)
    for path in retyped.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)

    # a recorded result swapped for a link to a valid fio result outside, carrying the secret
    rep = json.loads((hostile.host_dir / LINKED_REP).read_text())
    rep["jobs"][0]["jobname"] = SECRET
    (outside / "rep3.json").write_text(json.dumps(rep))
    _link(hostile.host_dir / LINKED_REP, outside / "rep3.json")
    hostile.links.append(f"{HOST}/{LINKED_REP}")

    # a host whose every file is a link out of the run
    env = json.loads((hostile.host_dir / "env.json").read_text())
    env["hostname"] = env["cpu"]["model"] = SECRET
    (outside / "env.json").write_text(json.dumps(env))
    manifest = (hostile.host_dir / "fio/manifest.json").read_text()
    (outside / "manifest.json").write_text(manifest)
    linked = hostile.raw_dir / LINKED_HOST
    for name, target in (
        ("env.json", outside / "env.json"),
        ("cryptsetup-benchmark.txt", secret),
        ("fio/manifest.json", outside / "manifest.json"),
    ):
        _link(linked / name, target)
        hostile.links.append(f"{LINKED_HOST}/{name}")
    return hostile


def plant_output_links(root: Path, run: str, victim: Path) -> list[Path]:
    """Links in the output folders (to ``victim``, outside) where the analysis writes files of its
    own: each must be replaced, ``victim`` left as it was."""
    victim.write_text("victim: must stay unchanged\n")
    planted = [
        root / "data/processed" / run / "README.md",
        root / "data/processed" / run / "env.csv",
        root / "data/processed" / run / "problems.csv",
    ]
    for path in planted:
        _link(path, victim)
    return planted


def files_outside(root: Path, outputs: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """{path: (size, mtime_ns)} of every file under ``root`` but outside ``outputs`` (folders and
    files relative to ``root``), links not followed: what an analysis must leave alone."""
    found = {}
    for folder, subdirs, files in os.walk(root):
        rel = Path(folder).relative_to(root).as_posix()
        if any(rel == o or rel.startswith(f"{o}/") for o in outputs):
            subdirs.clear()
            continue
        for name in files:
            path = Path(folder, name).relative_to(root).as_posix()
            if path not in outputs:
                st = os.lstat(os.path.join(folder, name))
                found[path] = (st.st_size, st.st_mtime_ns)
    return found


class LiveMarkup(HTMLParser):
    """What of an HTML page could act: script/iframe/object/embed elements, ``on*`` attributes,
    ``javascript:`` URLs, images that are not embedded data."""

    ACTIVE = frozenset(
        {"script", "iframe", "object", "embed", "svg", "math", "form", "base", "link"}
    )

    def __init__(self):
        super().__init__()
        self.found: list[str] = []
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in self.ACTIVE:
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            if name.lower().startswith("on"):
                self.found.append(f"<{tag} {name}>")
            if (value or "").strip().lower().startswith(("javascript:", "vbscript:")):
                self.found.append(f"<{tag} {name}={value}>")
            if name in ("href", "src", "srcset", "action") and tag != "img":
                self.found.append(f"<{tag} {name}={value}>")
        if tag == "img":
            self.images.append(dict(attrs).get("src") or "")

    @classmethod
    def of(cls, page: str) -> LiveMarkup:
        parser = cls()
        parser.feed(page)
        parser.close()
        return parser
