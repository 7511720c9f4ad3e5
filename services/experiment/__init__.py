"""PathMaster as the QoS experiment's workload: everything that *runs* PathMaster in the testbed.

This sits above both `services` (the product) and `qos` (transport, testbed, emulator,
traffic, the experiment engine), so that `qos` never imports the product:

- `workload.py`: the transfer workload (sites that answer without analysing, and the master
  agent that times a case over per-class gRPC channels);
- `deployment.py`: the real product (Ray sites on X1/X2, coordinator on the master) in a testbed;
- `bench.py`: `TestbedBench`, the `qos.experiment.runner.Bench` that drives either of them
  against the testbed's router strategies and competing traffic;
- `commands.py`: `pathmaster experiment list|run|report`.
"""
