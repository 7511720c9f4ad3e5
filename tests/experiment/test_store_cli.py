"""The store refuses to mix experiments; the commands fail with clear messages on bad input."""

import subprocess
import sys

import pytest

from pathmaster.records import InvalidInput
from qos.experiment.matrix import expand
from qos.experiment.report import write_report
from qos.experiment.spec import parse_spec
from qos.experiment.store import Store

SPEC = {
    "experiment": {"name": "t", "repetitions": 2},
    "strategies": {"fifo": {"discipline": "fifo"}},
    "links": [{"name": "a", "core_kbit": 1000}],
}


def test_store_refuses_another_configuration(tmp_path):
    exp = parse_spec(SPEC)
    Store(tmp_path).open_for(exp, expand(exp), allow_dirty=True, allow_code_change=True)
    other = parse_spec({**SPEC, "links": [{"name": "a", "core_kbit": 2000}]})
    with pytest.raises(InvalidInput, match="another configuration"):
        Store(tmp_path).open_for(other, expand(other), allow_dirty=True)
    again = Store(tmp_path).open_for(exp, expand(exp), allow_dirty=True, allow_code_change=True)
    assert len(again["resumed"]) == 1


def test_report_on_a_directory_without_runs_says_so(tmp_path):
    with pytest.raises(InvalidInput, match="metadata.json"):
        write_report(tmp_path)
    exp = parse_spec(SPEC)
    Store(tmp_path).open_for(exp, expand(exp), allow_dirty=True, allow_code_change=True)
    with pytest.raises(InvalidInput, match="no runs yet"):
        write_report(tmp_path)


def test_damaged_run_file_is_named(tmp_path):
    exp = parse_spec(SPEC)
    Store(tmp_path).open_for(exp, expand(exp), allow_dirty=True, allow_code_change=True)
    (tmp_path / "runs" / "fifo__c0__a__urgent__r00.json").write_text("{broken")
    with pytest.raises(InvalidInput, match="fifo__c0__a__urgent__r00.json"):
        write_report(tmp_path)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "pathmaster", "experiment", *args],
                          capture_output=True, text=True, timeout=60)


def test_cli_errors_name_the_problem(tmp_path):
    done = _cli("run", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and "nope.toml" in done.stderr and "pathmaster2002" in done.stderr


def test_cli_lists_builtins():
    done = _cli("list")
    assert done.returncode == 0
    for name in ("pathmaster2002", "wan-latency", "bursty", "smoke"):
        assert name in done.stdout
