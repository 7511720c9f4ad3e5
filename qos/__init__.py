"""QoS: request classes and DSCP, link emulation, the namespace testbed, experiments."""
