"""QoS: request classes and DSCP, link emulation, the namespace testbed, experiments."""

import os

# gRPC's fork handlers off, in every process that uses the project's gRPC (qos.transport
# and everything above it import this package first; GRPC_ENABLE_FORK_SUPPORT is read
# when grpc is imported). With them on (grpcio's default), a process that forks while
# its gRPC threads are busy can abort in abseil's mutex code ("Mutex::Fer with pending
# CondVar queueing"), as a coordinator starting a local Ray beside its running server
# does. Nothing here forks a child that uses gRPC: children exec at once (subprocess,
# Ray) or come from a fork server that never loaded it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
