"""PathMaster core: cytology cell images in, the most similar database cells out.

This package has no network code. The services (`services/`) and the QoS testbed
(`qos/`) build on it.
"""

__version__ = "0.1.0"
