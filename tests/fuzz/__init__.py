"""The fuzz suite: Hypothesis-generated requests, images, ids, deadlines, classes and k,
and mutated protobuf bytes, against the coordinator's, the sites' and the gateway's entry
points on a real loopback deployment (inputs.py, targets.py, suite.py). Its quick profile
runs in the test suite (tests/services/test_fuzz.py); the long one is
``python -m tests.fuzz --long`` (__main__.py)."""
