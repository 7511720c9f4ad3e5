"""The QoS transport: every request class travels on its own DSCP, both ways.

One import for its parts, each a module of its own:

- `qos.channels`: requests, one gRPC channel per (site, class, lane) marked with the
  class's DSCP (`ClassChannels`, `open_channel`), message size limits, addresses;
- `qos.server`: replies, one server port per class marking them (`MarkedServer`);
- `qos.tls`: TLS and mutual-TLS credentials from files, re-read when they change;
- `qos.authz`: who is calling and whether their role may (`SERVICE_CALLERS`), and the
  caller's identity for per-client limits;
- `qos.copies`: a server's memory of the sends it has taken (`CopyFilter`).
"""

from __future__ import annotations

from qos.authz import (OPEN_SERVICES, ROLE_NAMES, ROLE_URI, ROLES, SERVICE_CALLERS, RoleCheck, caller_identity,
                       client_identity, peer_role)
from qos.channels import (GENERATION_ARG, LANE_ARG, MAX_RECONNECT_BACKOFF_MS, STALE_PORT_CODES, ClassChannels,
                          connect_address, is_loopback, open_channel, size_options, split_address)
from qos.copies import MAX_SEND_ID_CHARS, CopyFilter
from qos.server import MarkedServer
from qos.tls import TLSFiles, check_key_pair, files_signature

__all__ = ["OPEN_SERVICES", "ROLE_NAMES", "ROLE_URI", "ROLES", "SERVICE_CALLERS", "RoleCheck", "caller_identity",
           "client_identity", "peer_role", "GENERATION_ARG", "LANE_ARG", "MAX_RECONNECT_BACKOFF_MS",
           "STALE_PORT_CODES", "ClassChannels", "connect_address", "is_loopback", "open_channel", "size_options",
           "split_address", "MAX_SEND_ID_CHARS", "CopyFilter", "MarkedServer", "TLSFiles", "check_key_pair",
           "files_signature"]
