"""User-space DiffServ link emulator on NFQUEUE (this kernel has no prio, red or netem qdisc).

Modules, bottom up: `packet` (IPv4 header parsing), `disciplines` (FIFO, priority, class
WFQ, flow FQ, WRED, token-bucket shaper), `classify` (DSCP -> class), `link` (one link
direction on a virtual clock: rate + overhead, delay, jitter, loss, shaping, scheduling),
`stats` (per-class counters, JSON), `simulate` (drive a link offline), `config` (TOML),
`runner` (the NFQUEUE event loop, `python -m qos.emulator`), `launch` (start/stop it in a
namespace, with its iptables rules).
"""

from qos.emulator.config import ConfigError, config_from_dict, load_config
from qos.emulator.launch import EmulatorError, EmulatorProcess, interface_config, launch
from qos.emulator.link import EmulatedLink

__all__ = ["ConfigError", "EmulatorError", "EmulatorProcess", "EmulatedLink", "config_from_dict",
           "interface_config", "launch", "load_config"]
