"""The machine lock: an experiment holds it alone; every process making namespaces holds it shared.

Each test holds the lock in a subprocess (which says "held" once it has it and lets go when
its stdin closes) on a lock file of its own, so the real /run/pathmaster lock is untouched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from qos import machine, netns
from tests.conftest import machine_busy_reason

_HOLD = """
import sys
from qos import machine
if sys.argv[2] == "experiment":
    with machine.experiment_lock("experiment holder-exp --out out/x", sys.argv[1], check_namespaces=False):
        print("held", flush=True)
        sys.stdin.readline()
else:
    machine.share(sys.argv[1], wait=0)
    print("held", flush=True)
    sys.stdin.readline()
"""


def let_go(proc: subprocess.Popen) -> None:
    """End a holder (it lets go of the lock when its stdin closes) and wait for it."""
    if proc.returncode is None:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.fixture
def holder(tmp_path):
    """Start a holder of `tmp_path / 'lock'`: holder(mode) -> its Popen, once it holds the lock."""
    started = []

    def start(mode: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path / "lock"), mode],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in started:
        let_go(proc)


def test_an_experiment_refuses_beside_another_and_names_it(tmp_path, holder):
    proc = holder("experiment")
    with pytest.raises(machine.MachineBusy) as err:
        with machine.experiment_lock("second", tmp_path / "lock", check_namespaces=False):
            pass
    assert err.value.code == "experiment_running"
    assert [(h["pid"], h["mode"], h["label"]) for h in err.value.holders] == \
        [(proc.pid, "exclusive", "experiment holder-exp --out out/x")]
    let_go(proc)
    with machine.experiment_lock("third", tmp_path / "lock", check_namespaces=False):  # free once it ends
        assert "third" in (tmp_path / "lock").read_text()


def test_an_experiment_refuses_beside_a_test_sessions_testbeds(tmp_path, holder):
    first, second = holder("shared"), holder("shared")  # two test workers' testbeds share it
    with pytest.raises(machine.MachineBusy) as err:
        with machine.experiment_lock("exp", tmp_path / "lock", check_namespaces=False):
            pass
    assert err.value.code == "testbed_running"
    assert sorted((h["pid"], h["mode"]) for h in err.value.holders) == \
        sorted([(first.pid, "shared"), (second.pid, "shared")])


def test_a_testbed_waits_a_bounded_time_for_an_experiment_then_is_refused(tmp_path, holder):
    proc = holder("experiment")
    t0 = time.monotonic()
    with pytest.raises(machine.MachineBusy) as err:
        machine.share(tmp_path / "lock", wait=0.5)
    assert time.monotonic() - t0 >= 0.5
    assert err.value.code == "experiment_running" and err.value.holders[0]["pid"] == proc.pid
    let_go(proc)
    try:
        machine.share(tmp_path / "lock", wait=0)  # free again: this process now shares it
        assert [h["pid"] for h in machine.holders(tmp_path / "lock")] == [os.getpid()]
    finally:
        machine.release(tmp_path / "lock")
    assert machine.holders(tmp_path / "lock") == []


def test_the_namespace_fixture_skips_naming_the_experiment(tmp_path, holder):
    proc = holder("experiment")
    reason = machine_busy_reason(0.0, tmp_path / "lock")
    assert reason.startswith("experiment_running")
    assert f"pid {proc.pid}" in reason and "holder-exp" in reason
    let_go(proc)
    try:
        assert machine_busy_reason(0.0, tmp_path / "lock") is None
    finally:
        machine.release(tmp_path / "lock")


def test_no_namespace_is_made_beside_an_experiment(tmp_path, holder, monkeypatch):
    holder("experiment")
    monkeypatch.setattr(machine, "LOCK_PATH", tmp_path / "lock")
    monkeypatch.setenv(machine.WAIT_ENV, "0")
    name = netns.namespace_name(netns.new_tag("lk"), "a")
    with pytest.raises(machine.MachineBusy) as err:
        netns.add(name)
    assert err.value.code == "experiment_running"
    assert not netns.exists(name)


def test_the_experiments_own_testbed_shares_its_hold(tmp_path):
    with machine.experiment_lock("exp", tmp_path / "lock", check_namespaces=False):
        machine.share(tmp_path / "lock", wait=0)  # the experiment building its testbed: no refusal
        assert [h["mode"] for h in machine.holders(tmp_path / "lock")] == ["exclusive"]
    assert machine.holders(tmp_path / "lock") == []


def test_the_experiment_lock_refuses_while_another_testbeds_namespaces_exist(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "other_testbeds", lambda own_prefix=None: ["pm-ab12-A1", "pm-ab12-core"])
    with pytest.raises(machine.MachineBusy) as err:
        with machine.experiment_lock("exp", tmp_path / "lock"):
            pass
    assert err.value.code == "testbed_running" and "pm-ab12-A1" in str(err.value)


def test_the_wait_is_bounded(monkeypatch):
    monkeypatch.setenv(machine.WAIT_ENV, "1e9")
    assert machine.wait_s() == machine.MAX_WAIT_S
    monkeypatch.setenv(machine.WAIT_ENV, "soon")
    with pytest.raises(machine.InvalidInput):
        machine.wait_s()
