"""The VM test box's image variants (tests/vm/harness.py): the ``ceph`` image has its own cache
key covering its package list, the default guest's key does not depend on it, and a boot takes
the image, memory and scratch disk size its cases ask for."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "vm" / "harness.py"
CEPH_CASE = HARNESS.parent / "ceph-plans" / "osd-dmcrypt.json"


@pytest.fixture
def harness():
    spec = importlib.util.spec_from_file_location("vmbox_harness_variants", HARNESS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ceph_key_covers_its_packages_and_base_key_ignores_them(harness, monkeypatch):
    base, ceph = harness.image_key("base"), harness.image_key("ceph")
    assert base.startswith("base-") and ceph.startswith("ceph-")
    assert set(harness.CEPH_PACKAGES) == {"ceph-mon", "ceph-osd", "ceph-common"}
    more = {**harness.VARIANT_PACKAGES, "ceph": (*harness.CEPH_PACKAGES, "ceph-mgr")}
    monkeypatch.setattr(harness, "VARIANT_PACKAGES", more)
    assert harness.image_key("ceph") != ceph, "a package list change must rebuild the image"
    assert harness.image_key("base") == base
    with pytest.raises(harness.VMBoxError, match="image variant must be one of"):
        harness.image_key("cephx")


def test_a_boot_takes_the_image_and_resources_its_cases_ask_for(harness, tmp_path):
    default = sorted(harness.PLANS_DIR.glob("*.json"))
    assert harness.image_variant(default) == "base"
    assert harness.case_resources(default, 2048, 256) == (2048, 256)
    assert harness.image_variant([CEPH_CASE]) == "ceph"
    mem, disk = harness.case_resources([CEPH_CASE], 2048, 256)
    assert mem >= harness.CEPH_MEM_MIB >= 4096 and disk == 1024
    with pytest.raises(harness.VMBoxError, match="need their own boots"):
        harness.image_variant([CEPH_CASE, default[0]])
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"image": "gentoo", "plan": {}}))
    with pytest.raises(harness.VMBoxError, match="case image 'gentoo'"):
        harness.image_variant([odd])
