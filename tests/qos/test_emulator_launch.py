"""Starting and stopping the emulator in a namespace: rules in and out, nothing lost, nothing left.

A three-node line (client - router - server, `qos.testbed.line`); the emulator runs in the router.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from qos import netns
from qos.emulator import ConfigError, EmulatorError, launch
from qos.emulator.runner import nfqueue_unavailable_reason
from qos.testbed.line import line_topology

pytestmark = [pytest.mark.netns, pytest.mark.timing]


@pytest.fixture(scope="module")
def line(netns_ok):
    reason = nfqueue_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with line_topology(netns.new_tag("el"), "10.77.1.0/24", "10.77.2.0/24") as line:
        yield line.client, line.router, line.server, line.out_interface


def config(out_interface: str, **settings) -> dict:
    return {"seed": 1, "link": {"to_server": {"rate_kbit": 10_000, **settings,
                                              "forward": {"queue": 7, "out": out_interface}}}}


def nfqueue_rules(router) -> list[str]:
    return [r for r in router.cmd("iptables", "-S", "FORWARD").splitlines() if "NFQUEUE" in r]


RECEIVER = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 7100))
s.settimeout(float(sys.argv[1]))
got = []
try:
    while True:
        got.append(s.recvfrom(2048)[0].decode())
except socket.timeout:
    pass
print(" ".join(got))
"""


def test_bad_configuration_fails_before_anything_starts(line):
    client, router, server, out = line
    with pytest.raises(ConfigError, match="rate_kbit: .*number, got 'quick'"):
        launch(router.namespace, config(out, rate_kbit="quick"))
    assert nfqueue_rules(router) == []


def test_a_process_that_cannot_start_says_why(line, tmp_path):
    client, router, server, out = line
    # Two directions on one queue number is caught by the config check; a queue already
    # bound by another process is only found by the child.
    first = launch(router.namespace, config(out), workdir=tmp_path / "a")
    try:
        with pytest.raises(EmulatorError, match="exited with status"):
            launch(router.namespace, config(out), workdir=tmp_path / "b")
    finally:
        first.stop()
    assert nfqueue_rules(router) == []


def test_stop_removes_the_rules_and_releases_held_packets(line, tmp_path):
    client, router, server, out = line
    emu = launch(router.namespace, config(out, delay_ms=1500), workdir=tmp_path)
    assert len(nfqueue_rules(router)) == 1
    receiver = server.popen([sys.executable, "-c", RECEIVER, "3"], stdout=subprocess.PIPE, text=True)
    server.wait_listening(7100, protocol="udp")
    client.cmd(sys.executable, "-c",
               f"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
               f"[s.sendto(b'p%d' % i, ('{server.ip}', 7100)) for i in range(5)]")
    # The packets are now in the emulator's 1.5 s delay line, and its progress snapshot says so;
    # stopping must let them go.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (emu.stats_path.exists() and emu.held_packets() == 5):
        time.sleep(0.05)
    assert emu.held_packets() == 5 and emu.stats()["final"] is False
    stats = emu.stop()
    got = receiver.communicate(timeout=10)[0].split()
    assert got == [f"p{i}" for i in range(5)]
    assert nfqueue_rules(router) == []
    assert emu.poll() is not None
    forward = stats["directions"]["to_server.forward"]
    assert forward["classes"]["default"]["arrived_packets"] >= 5
    assert forward["kernel_queue"]["queue_dropped"] == 0
    assert stats["release_lateness_s"]["count"] >= 0
    assert json.loads((tmp_path / "emulator-stats.json").read_text())["seed"] == 1
    assert forward["held_packets"] == 0 and "samples" in forward


def test_a_temporary_workdir_goes_after_a_clean_stop(line):
    client, router, server, out = line
    emu = launch(router.namespace, config(out))
    scratch = emu.stats_path.parent
    assert scratch.is_dir()
    stats = emu.stop()
    assert not scratch.exists() and emu.stats() is stats and stats["final"]


def test_a_killed_emulator_leaves_no_rule_behind(line, tmp_path):
    client, router, server, out = line
    emu = launch(router.namespace, config(out), workdir=tmp_path)
    os.killpg(emu.pid, signal.SIGKILL)
    emu.wait(10)
    assert len(nfqueue_rules(router)) == 1     # the process could not clean up...
    with pytest.raises(EmulatorError, match="without its final statistics"):
        emu.stop()                              # ...so stop() does, and says what is missing
    assert nfqueue_rules(router) == []


def test_the_command_line_runs_for_a_duration_and_cleans_up(line, tmp_path):
    client, router, server, out = line
    path = tmp_path / "emulator.toml"
    path.write_text(f'seed = 3\n[link.l]\nrate_kbit = 5000\ndiscipline = "fq"\n'
                    f'[link.l.forward]\nqueue = 9\nout = "{out}"\n')
    done = router.run(sys.executable, "-m", "qos.emulator", "--config", str(path), "--duration", "1s",
                      "--stats", str(tmp_path / "s.json"), timeout=30)
    assert done.stdout.startswith("READY ")
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["seed"] == 3 and 1.0 <= stats["duration_s"] < 5
    assert stats["directions"]["l.forward"]["settings"]["discipline"] == "fq"
    assert nfqueue_rules(router) == []
    bad = router.run(sys.executable, "-m", "qos.emulator", "--config", str(tmp_path / "nope.toml"),
                     check=False)
    assert bad.returncode == 2 and "nope.toml: cannot read" in bad.stderr
