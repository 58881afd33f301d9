"""The blog post's front matter: config ``paper.front_matter`` keys checked by the schema, and a
value that is not a date written quoted, so no field can add lines of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from luksbench.publish.paper import front_matter_yaml

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


@pytest.mark.parametrize("key", ["evil: injected", "two\nlines", "", "-dash-first"])
def test_a_front_matter_key_that_is_not_a_plain_name_is_refused(key):
    with pytest.raises(Exception, match="Error validating") as err:
        validate({"paper": {"front_matter": {key: "x"}}}, str(SCHEMA))
    assert "does not match" in str(err.value)


def test_plain_front_matter_keys_pass():
    validate({"paper": {"front_matter": {"layout": "post", "og_image": "x"}}}, str(SCHEMA))


def test_only_a_real_date_is_written_bare():
    text = front_matter_yaml({"date": "2024-02-13\nlayout: evil", "title": "t"})
    assert yaml.safe_load(text) == {"date": "2024-02-13\nlayout: evil", "title": "t"}
    assert front_matter_yaml({"date": "2024-02-13"}) == "date: 2024-02-13\n"
