"""QoS experiments: experiment files, the runner that drives the testbed, and reports.

spec (the file format) -> matrix (the runs, shuffled) -> runner (drives the testbed, one
run at a time) -> store (raw JSON + metadata) -> report/plots/stats/bound (from raw data).
"""
