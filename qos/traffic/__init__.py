"""Competing traffic for the testbed: bulk downloads, constant-rate UDP, Pareto bursts (seed 003).

    from qos import traffic
    with traffic.from_spec(testbed, {"kind": "downloads", "streams": 4}) as t:
        ...
    t.result.bps

Modules: `iperf` (iperf3 servers/clients and their JSON), `pareto` (the burst model and
its UDP sender/sink), `competing` (the generators).
"""

from qos.traffic.competing import (KINDS, BulkDownloads, ConstantRateUDP, ParetoBursts, Traffic,
                                   TrafficResult, from_spec)

__all__ = ["KINDS", "BulkDownloads", "ConstantRateUDP", "ParetoBursts", "Traffic", "TrafficResult",
           "from_spec"]
