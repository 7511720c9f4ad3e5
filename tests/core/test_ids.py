"""Client-chosen identifiers: bounded, shown short, made from any file name, logged as tags."""

from __future__ import annotations

import pytest

from pathmaster import defaults
from pathmaster.ids import check_id, id_from_name, log_tag, shown
from pathmaster.records import InvalidInput


def test_check_id_says_the_limit_and_shows_a_prefix():
    assert check_id("ACC-2026:0001.a") == "ACC-2026:0001.a"
    assert check_id("herlev/mild/001.BMP", "cell id") == "herlev/mild/001.BMP"
    with pytest.raises(InvalidInput, match="at most 64 characters") as err:
        check_id("9" * 10**6)
    assert len(str(err.value)) < 200 and "(1000000 characters)" in str(err.value)
    with pytest.raises(InvalidInput, match="character '/'"):
        check_id("a/b")  # folders only in cell ids
    with pytest.raises(InvalidInput, match="empty"):
        check_id("", "cell id")
    assert shown("short") == "'short'"


def test_id_from_name_makes_valid_distinct_ids():
    assert id_from_name("cell 1 (copy).png") == "cell_1__copy_.png"
    assert id_from_name("ok-1.png") == "ok-1.png"
    long_a, long_b = id_from_name("x" * 300 + "a"), id_from_name("x" * 300 + "b")
    assert long_a != long_b and len(long_a) == defaults.MAX_CELL_ID_CHARS
    for made in (long_a, id_from_name("Zelle ä.tif"), id_from_name("")):
        assert check_id(made, "cell id") == made


def test_log_tag_is_stable_short_and_not_the_id():
    assert log_tag("ACC-1") == log_tag("ACC-1") != log_tag("ACC-2")
    assert log_tag("ACC-1").startswith("c-") and "ACC" not in log_tag("ACC-1") and len(log_tag("x")) == 12
