"""Competing traffic for the testbed: iperf3 helpers, bulk downloads, constant-rate UDP, Pareto bursts."""
