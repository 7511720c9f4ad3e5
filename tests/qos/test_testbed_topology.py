"""The PathMaster 2002 topology, its configuration, and `pathmaster testbed up|down|status`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pathmaster.cli import main
from qos import netns
from qos.testbed import ConfigError, Testbed, load_config, teardown
from qos.testbed.probe import checksum, ping
from qos.testbed.testbed import state_path
from qos.traffic.iperf import IperfServer, run_client

HOSTS = [f"{s}{k}" for s in "ABC" for k in (1, 2, 3)]
LAN_RATE = 20_000_000


def pathmaster(*args: str) -> subprocess.CompletedProcess:
    """`pathmaster testbed ARGS` as a separate process (the installed entry point)."""
    return subprocess.run([sys.executable, "-m", "pathmaster", "testbed", *args],
                          capture_output=True, text=True, timeout=120)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """`pathmaster testbed ARGS` in this process: (exit status, stdout, stderr)."""
    code = main(["testbed", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_config_errors_name_the_file_and_setting(tmp_path: Path):
    cases = {
        'tag = "Bad-Tag"': "tag",
        'subnets = ["A", "b"]': "subnets",
        'master = "D1"': "master 'D1'",
        'address_range = "8.8.0.0/16"': "private",
        'colour = "red"': "colour: unknown key",
        "lan_rate_kbit = -5": "lan_rate_kbit",
        "lan_rate_bps = 5": "lan_rate_bps: old spelling; use lan_rate_kbit",
        '[bottleneck]\nbackend = "ns3"': "backend must be one of kernel, emulator",
        '[bottleneck]\nrate_kbit = -1': "rate_kbit",
        '[bottleneck]\nrate_bps = 10_000_000': r"rate_bps: old spelling; use rate_kbit = 10000 \(kbit/s\)",
        "tag = ": "not valid TOML",
        '[bottleneck]\nrate_bsp = 1': r"\[bottleneck\] rate_bsp: unknown key",
        '[bottleneck.discipline]\nstrategy = "shaping"\nshaped_class = "bulk"\nshaped_rate_bps = 1': "use shaped_rate_kbit",
        '[bottleneck.subnet.D]\nbackend = "kernel"': "no subnet 'D'",
        '[bottleneck.discipline]\nstrategy = "wred"': "unknown kernel strategy 'wred'",
    }
    for text, message in cases.items():
        path = tmp_path / "bed.toml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=message) as err:
            load_config(path)
        assert str(path) in str(err.value)
    with pytest.raises(ConfigError, match="no such testbed configuration file"):
        load_config(tmp_path / "missing.toml")


def test_default_config_is_the_study_testbed():
    config = load_config()
    assert config.subnets == ("A", "B", "C") and config.master == "A1"
    assert config.bottleneck.rate_kbit == 10_000
    assert config.with_tag("x1").tag == "x1"


def test_a_subnet_can_override_the_bottleneck(tmp_path: Path):
    path = tmp_path / "bed.toml"
    path.write_text('[bottleneck.subnet.B]\nbackend = "emulator"\nrate_kbit = 2_000\n')
    config = load_config(path)
    assert config.link_settings("B")["backend"] == "emulator"
    assert config.link_settings("B")["rate_kbit"] == 2_000
    assert config.link_settings("A")["backend"] == "kernel"
    assert config.link_settings("A")["rate_kbit"] == 10_000
    path.write_text('[bottleneck.subnet.B]\nbackend = "tc"\n')
    with pytest.raises(ConfigError, match=r"\[bottleneck.subnet.B\] backend"):
        load_config(path)


def test_icmp_checksum_matches_rfc1071_example():
    # RFC 1071 section 3: the words 0001 f203 f4f5 f6f7 sum to ddf2, checksum 220d.
    assert checksum(bytes.fromhex("0001f203f4f5f6f7")) == 0x220D


@pytest.mark.netns
@pytest.mark.timing
def test_up_builds_figure_4_and_every_host_reaches_every_other(netns_ok):
    config = load_config().with_tag(netns.new_tag("f")).model_copy(update={"lan_rate_kbit": LAN_RATE / 1000})
    with Testbed(config) as tb:
        assert sorted(n.removeprefix(netns.tag_prefix(tb.tag)) for n in
                      netns.list_namespaces(netns.tag_prefix(tb.tag))) == sorted(
            HOSTS + ["rA", "rB", "rC", "core"])
        assert tb.ip("A1") == "10.42.1.1" and tb.ip("C3") == "10.42.3.3"
        # No interface of ours in the root namespace.
        root = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert "rA-eth" not in root and "A1-eth0" not in root
        # A1 reaches B3 through rA, core and rB (3 hops: TTL 64 - 3 on the reply).
        route = tb.host("A1").cmd("ip", "route", "get", tb.ip("B3"))
        assert "via 10.42.1.254" in route
        replies = ping(tb.host("A1"), [tb.ip(h) for h in HOSTS if h != "A1"], count=1)
        assert all(rtts[0] is not None for rtts in replies.values()), replies
        replies = ping(tb.host("C3"), [tb.ip("B2")], count=1)
        assert replies[tb.ip("B2")][0] is not None
        status = tb.status()
        assert status["up"] and status["namespaces_missing"] == []
        assert set(status["root_qdiscs"].values()) == {"htb"}
        assert len(status["root_qdiscs"]) == 6  # both ends of three router-core links
        # The LAN links run at lan_rate_kbit: the kernel holds A2's link to it, and a flow
        # A2 -> A1 (inside subnet A) gets no more. The lower bound only tells it from a
        # slower rate (the 10 Mbit/s bottleneck): a stall of a loaded machine costs a
        # 2-second flow a few percent, never the kernel's setting.
        classes = tb.host("A2").cmd("tc", "class", "show", "dev", "A2-eth0")
        rate = f"{LAN_RATE // 1_000_000}Mbit"
        assert re.search(rf"class htb 1:1 root rate {rate} ceil {rate}", classes), classes
        with IperfServer(tb.host("A1"), 5201):
            lan = run_client(tb.host("A2"), tb.ip("A1"), port=5201, seconds=2, omit=0.5)
        assert 0.8 * LAN_RATE <= lan.frame_bps() <= 1.03 * LAN_RATE, f"{lan.frame_bps() / 1e6:.1f} Mbit/s"
    assert netns.list_namespaces(netns.tag_prefix(config.tag)) == []


@pytest.mark.netns
@pytest.mark.timing
def test_cli_is_idempotent_and_down_cleans_up_after_a_crash(netns_ok, tmp_path: Path, capsys):
    tag = netns.new_tag("c")
    try:
        first = pathmaster("up", "--tag", tag)  # the installed command, in a process that then exits
        assert first.returncode == 0, first.stderr
        code, _, err = cli(capsys, "up", "--tag", tag)
        assert code == 0, err
        code, out, _ = cli(capsys, "status", "--tag", tag)
        status = json.loads(out)
        assert status["up"] and status["namespaces_present"] == 13

        # A "crash": processes left running inside, and the state file lost.
        orphan = subprocess.Popen(["ip", "netns", "exec", f"pm-{tag}-B3", "sleep", "300"])
        state_path(tag).unlink()
        code, out, err = cli(capsys, "down", "--tag", tag)
        assert code == 0, err
        assert "removed 13 namespaces" in out
        assert orphan.wait(10) != 0
        assert netns.list_namespaces(netns.tag_prefix(tag)) == []
        assert cli(capsys, "down", "--tag", tag)[0] == 0
        status = json.loads(cli(capsys, "status", "--tag", tag)[1])
        assert not status["up"] and status["namespaces_present"] == 0

        code, _, err = cli(capsys, "up", "--config", str(tmp_path / "nope.toml"))
        assert code == 2 and "no such testbed configuration file" in err
    finally:
        teardown(tag)
