"""Start the emulator inside a namespace and stop it cleanly: what the testbed calls.

    emu = launch("pm-t1-rA", {"link": {...}})          # a full emulator config (dict or file)
    emu = launch("pm-t1-rA", {"rate_kbit": 10_000, "strategy": "priority"}, interfaces=["rA-eth1"])
    ...traffic...
    stats = emu.stop()                                  # rules gone, packets released, stats read

`launch` returns once the process has bound its queues and inserted its iptables rules
(it waits for the READY line), so traffic started afterwards is always emulated. `stop`
sends SIGTERM; the process removes its rules and writes its statistics. If it had to be
killed, `stop` removes the rules itself, so nothing is left behind either way.

The `interfaces` form takes one flat table of settings for each interface's two
directions (packets leaving through it and packets arriving from it) and also accepts
the testbed's kernel-backend keys: rate_kbit, overhead_bytes, limit_packets (the same
names as the emulator's), and strategy = fifo | priority | shares (weights) | shaping
(shaped_class, shaped_rate_kbit), plus the emulator's own wred, fq, codel and class_codel
(weights; default IOS's precedence weights; a 1000-packet buffer unless limit_packets says)
and delay_ms/jitter_ms/loss. Strategies "ios-fifo", "ios-priority", "ios-wfq", "ios-cbwfq",
"ios-wred" and "ios-shaping" are the 2002 routers with Cisco IOS's defaults (`qos.emulator.ios`).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from qos.cisco import HOLD_QUEUE_PACKETS, WFQ_WEIGHTS
from qos.classes import DEFAULT_CLASSES

from pathmaster.records import ConfigError
from qos import netns
from qos.emulator import ios
from qos.emulator.config import config_from_dict, load_config
from qos.emulator.disciplines import BANDS
from qos.emulator.disciplines.codel import CODEL_LIMIT_PACKETS
from qos.network import SHAPER_BURST_BYTES

READY_PREFIX = "READY "


class EmulatorError(RuntimeError):
    """The emulator process did not come up; the message carries its own error output."""


def interface_config(interfaces: list[str], settings: dict, first_queue: int = 0) -> dict:
    """An emulator config emulating both directions of each interface in `interfaces`.

    `settings` is one flat table (emulator keys, or the testbed's kernel-backend keys, see the
    module docstring); interface i gets NFQUEUEs first_queue + 2i (out) and + 2i + 1 (in).
    """
    link = settings_from_strategy(settings)
    seed = link.pop("seed", None)
    links = {}
    for i, name in enumerate(interfaces):
        links[name] = {**link,
                       "forward": {"queue": first_queue + 2 * i, "out": name},
                       "reverse": {"queue": first_queue + 2 * i + 1, "in": name}}
    out = {"link": links}
    if seed is not None:
        out["seed"] = seed
    return out


def settings_from_strategy(spec: dict) -> dict:
    """Translate the testbed's kernel-backend discipline table into emulator link settings."""
    spec = dict(spec)
    if str(spec.get("strategy", "")).startswith(ios.PREFIX):  # the 2002 routers, IOS's own defaults
        name = spec.pop("strategy")[len(ios.PREFIX):]
        try:
            out = ios.ios_link_settings(name, spec.pop("shaped_class", "bulk"), spec.pop("shaped_rate_kbit", None),
                                        shaped_base=spec.pop("shaped_base", "cbwfq"),
                                        shaped_burst_bytes=spec.pop("shaped_burst_bytes", None))
            spec.pop("shaped_at", None)  # where on the network: the testbed's choice (Testbed._configure_hubs)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        out.update(spec)  # rate, overhead and any explicit override
        return out
    out = {key: spec.pop(key) for key in ("rate_kbit", "overhead_bytes", "limit_packets") if key in spec}
    strategy = spec.pop("strategy", None)
    weights = spec.pop("weights", None)
    default = spec.pop("default", None)
    if strategy in ("codel", "class_codel"):  # emulator only (no codel qdisc in this kernel)
        # CoDel manages a large buffer by delay (Linux codel: 1000 packets); a 40-packet hold
        # queue would tail-drop before its 100 ms interval could pass.
        out.setdefault("limit_packets", CODEL_LIMIT_PACKETS)
        out["discipline"] = strategy
        if strategy == "class_codel":
            out["class_codel"] = {"weights": weights or dict(WFQ_WEIGHTS)}
        elif weights:
            raise ConfigError("strategy 'codel' is one queue: it takes no weights (class_codel does)")
        out.update(spec)
        return out
    # The testbed's kernel backend defaults to a Cisco interface's 40-packet hold queue; so
    # does the emulator behind the same table, so both backends run the same experiment.
    out.setdefault("limit_packets", HOLD_QUEUE_PACKETS)
    if strategy in (None, "fifo", "priority", "wred", "fq"):
        if strategy:
            out["discipline"] = strategy
        if strategy == "priority" and default is not None:
            # The testbed names the class that takes unmarked packets; the emulator its band.
            order = DEFAULT_CLASSES.names()
            out["priority"] = {"default": BANDS[min(order.index(default), len(BANDS) - 1)]}
    elif strategy in ("shares", "shaping", "wfq"):
        out["discipline"] = "wfq"
        if weights:
            out["wfq"] = {"weights": weights}
        if strategy == "shaping":
            try:
                shaped, rate = spec.pop("shaped_class"), spec.pop("shaped_rate_kbit")
            except KeyError as e:
                raise ConfigError(f"strategy 'shaping' needs {e.args[0]}") from None
            out["shape"] = {shaped: {"rate_kbit": rate,
                                     "burst_bytes": int(spec.pop("shaped_burst_bytes", SHAPER_BURST_BYTES))}}
    else:
        raise ConfigError(f"unknown strategy {strategy!r}; the emulator knows fifo, priority, shares, "
                          "shaping, wred, fq, codel, class_codel")
    out.update(spec)  # the emulator's own keys (delay, jitter, loss, wred, seed, ...)
    return out


class EmulatorProcess:
    """A running emulator in a namespace. Quacks like `subprocess.Popen` (pid, poll, wait)."""

    def __init__(self, namespace: str, proc: subprocess.Popen, config: dict, config_path: Path,
                 stats_path: Path, log_path: Path, scratch: Path | None = None):
        self.namespace = namespace
        self.proc = proc
        self.config = config
        self.config_path = config_path
        self.stats_path = stats_path
        self.log_path = log_path
        self.scratch = scratch  # a temporary directory of ours, removed after a clean stop
        self._final: dict | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def stats(self) -> dict:
        """What the process last wrote: while it runs, a progress snapshot at most 0.5 s old
        (counters, packets held; `"final": false`); after `stop`, the full record."""
        if self._final is not None:
            return self._final
        return json.loads(self.stats_path.read_text())

    def held_packets(self) -> int:
        """Packets inside the emulated links (queues, shapers, delay lines), as of the last snapshot."""
        return sum(d["held_packets"] for d in self.stats()["directions"].values())

    def stop(self, timeout: float = 10.0) -> dict:
        """Stop the process (TERM, then KILL), make sure its rules are gone; return its final statistics."""
        netns.stop_process(self.proc, timeout)
        leftover = remove_rules(self.namespace, self.config)
        if leftover:
            print(f"emulator in {self.namespace} left {leftover} iptables rule(s); removed",
                  file=sys.stderr)
        try:
            stats = self.stats()
        except (OSError, ValueError) as e:
            stats = {"error": str(e)}
        if not stats.get("final"):
            raise EmulatorError(f"emulator in {self.namespace} ended without its final statistics "
                                f"(exit status {self.proc.returncode}); its log: "
                                f"{self.log_path.read_text()[-2000:].strip()}")
        self._final = stats
        if self.scratch is not None:
            # The caller asked to keep nothing (no workdir): the statistics are returned, the rest goes.
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
        return stats

    def __enter__(self) -> "EmulatorProcess":
        return self

    def __exit__(self, *exc) -> None:
        if self.poll() is None:
            self.stop()


def remove_rules(namespace: str, config: dict) -> int:
    """Delete the NFQUEUE rules of `config` in `namespace`; return how many were still there."""
    from qos.emulator.runner import iptables_rule

    checked = config_from_dict(config)
    removed = 0
    for d in checked.directions:
        while netns.run(namespace, ["iptables", "-w", "5", "-D", d.chain, *iptables_rule(d.match, d.queue)],
                        check=False).returncode == 0:
            removed += 1
    return removed


def launch(namespace: str, config: dict | str | Path, *, interfaces: list[str] | None = None,
           stats_path: str | Path | None = None, workdir: str | Path | None = None,
           ready_timeout: float = 20.0) -> EmulatorProcess:
    """Start `python -m qos.emulator` inside `namespace`; return when its packets are being emulated.

    config: an emulator config (dict, or a TOML/JSON file); with `interfaces`, one flat table
        of link settings applied to both directions of each of those interfaces.
    stats_path: the run's statistics JSON (default: in `workdir`).
    workdir: where the config copy, log and statistics go (default: a temporary directory,
        removed by a clean `stop`, which returns the statistics; kept when something failed).
    Raises ConfigError for a bad configuration (before starting anything) and EmulatorError
    when the process does not report READY within `ready_timeout` s.
    """
    if isinstance(config, (str, Path)):
        data = _read_config_file(Path(config))
    else:
        data = interface_config(interfaces, config) if interfaces else dict(config)
    config_from_dict(data, f"emulator config for {namespace}")  # fail here, not in the child
    scratch = None if workdir else Path(tempfile.mkdtemp(prefix=f"emu-{namespace}-"))
    workdir = Path(workdir) if workdir else scratch
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "emulator.json"
    config_path.write_text(json.dumps(data, indent=1))
    stats_path = Path(stats_path) if stats_path else workdir / "emulator-stats.json"
    log_path = workdir / "emulator.log"
    with open(log_path, "wb") as log:
        proc = netns.popen(namespace, [sys.executable, "-m", "qos.emulator", "--config", str(config_path),
                                       "--stats", str(stats_path)],
                           stdout=subprocess.PIPE, stderr=log, cwd=str(workdir), env=_child_env())
    emu = EmulatorProcess(namespace, proc, data, config_path, stats_path, log_path, scratch)
    try:
        _wait_ready(emu, ready_timeout)
    except BaseException:
        netns.stop_process(proc)
        remove_rules(namespace, data)
        raise
    return emu


def _read_config_file(path: Path) -> dict:
    load_config(path)  # its errors name the file
    with open(path, "rb") as f:
        data = json.load(f) if path.suffix == ".json" else tomllib.load(f)
    if "classes" in data:  # keep a relative class table findable from the copy
        data["classes"] = str((path.parent / data["classes"]).resolve())
    return data


def _child_env() -> dict:
    # The child must import this very package, wherever the caller runs from.
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _wait_ready(emu: EmulatorProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    stdout = emu.proc.stdout
    while time.monotonic() < deadline:
        readable, _, _ = select.select([stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not readable:
            break
        line = stdout.readline().decode(errors="replace")
        if line.startswith(READY_PREFIX):
            return
        if not line:  # the process ended before it was ready
            emu.proc.wait(5)
            raise EmulatorError(f"emulator in {emu.namespace} exited with status {emu.proc.returncode} "
                                f"before it was ready: {emu.log_path.read_text()[-2000:].strip()}")
    raise EmulatorError(f"emulator in {emu.namespace} not ready after {timeout} s; "
                        f"its log: {emu.log_path.read_text()[-2000:].strip()}")
