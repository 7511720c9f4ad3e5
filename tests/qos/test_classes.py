"""The request-class table: BRIEF §5 defaults, configurable from TOML, clear errors."""

import pytest

from qos.classes import DEFAULT_CLASSES, ClassTable, UnknownClass, load_classes


def test_default_table_follows_rfc_4594_8622():
    assert {c.name: c.dscp for c in DEFAULT_CLASSES} == {
        "urgent": 34, "routine": 18, "teaching": 10, "bulk": 1,
    }
    # Iteration order is the order of favour: urgent first, bulk last.
    assert DEFAULT_CLASSES.names() == ["urgent", "routine", "teaching", "bulk"]
    assert DEFAULT_CLASSES["urgent"].tos == 34 << 2
    assert DEFAULT_CLASSES.by_dscp(10).name == "teaching"
    assert DEFAULT_CLASSES.by_dscp(46) is None


def test_unknown_class_names_the_known_ones():
    with pytest.raises(UnknownClass) as err:
        DEFAULT_CLASSES["express"]
    assert "express" in str(err.value) and "urgent" in str(err.value)


def test_table_loads_from_toml(tmp_path):
    path = tmp_path / "classes.toml"
    path.write_text('[classes.urgent]\ndscp = 46\npriority = 0\n[classes.bulk]\ndscp = 8\npriority = 1\n')
    table = load_classes(path)
    assert table["urgent"].dscp == 46 and table["bulk"].dscp == 8
    assert "routine" not in table


def test_dscp_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="outside 0-63"):
        ClassTable({"x": {"dscp": 64}})
