"""Competing traffic for the testbed: bulk downloads, constant-rate UDP, Pareto bursts (seed 003).

    from qos import traffic
    with traffic.from_spec(testbed, {"kind": "downloads", "streams": 4}) as t:
        ...
    t.result.bps

Modules: `iperf` (iperf3 servers/clients and their JSON), `pareto` (the burst model and
its UDP sender/sink), `competing` (the generators); for measuring a link: `transfer` (a
fixed-size TCP transfer timed at the receiver) and `burst` (numbered UDP bursts per class,
their order of arrival and kernel receive times).
"""

from qos.traffic.competing import (KINDS, BulkDownloads, ConstantRateUDP, ParetoBursts, Traffic,
                                   TrafficResult, from_spec)

__all__ = ["KINDS", "BulkDownloads", "ConstantRateUDP", "ParetoBursts", "Traffic", "TrafficResult",
           "from_spec"]
