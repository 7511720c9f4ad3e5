"""The 2002 PathMaster QoS testbed in Linux network namespaces (Mininet style).

Modules, bottom up (the namespaces themselves are `qos.netns`, shared with the emulator's
launcher): `node` (Host, Router), `link` (veth Link, bridge Lan), `topology` (Topology,
PathMaster2002), `kernel` (htb/pfifo disciplines on DSCP), `config` (TOML), `testbed`
(the Testbed facade), `probe` (ICMP ping from a node), `deployment` (PathMaster's own
processes in the nodes), `commands` (`pathmaster testbed up|down|status`). README.md says where the queues are.
"""

from qos.testbed.config import ConfigError, TestbedConfig, load_config
from qos.testbed.testbed import Testbed, teardown

__all__ = ["ConfigError", "Testbed", "TestbedConfig", "load_config", "teardown"]
