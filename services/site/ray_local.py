"""A local Ray that listens only where it must, with Ray's token authentication on.

Ray (2.60) turns a node IP of 127.0.0.1 into the host's routable address
(`ray._private.services.resolve_ip_for_localhost`), and its GCS, raylet and every
worker then listen on all interfaces (`[::]`), the runtime-env agent on that routable
address: anyone who reaches the host can run code in the demo's Ray. Only when Ray's
"cluster" mode is off (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, its switch for laptops,
which works on Linux too) does the node IP stay on loopback, and Ray's C++ servers then
bind 127.0.0.1 only. We turn that mode off for this process (Ray's
constant was read at import) and for every process Ray starts (the environment):
`prepare_local_ray`.

Token authentication (Ray >= 2.52): `RAY_AUTH_MODE=token`, with a token file of our own,
mode 0600 (Ray's default `~/.ray/auth_token` is written world-readable). A deployment
that joins a cluster (`ray_address`) must run it with `RAY_AUTH_MODE=token` and the
cluster's token (`RAY_AUTH_TOKEN_PATH`), and the cluster's nodes with
`ray start --node-ip-address=PRIVATE_IP` on a private network: see deploy/site.example.toml.
"""

from __future__ import annotations

import os
from pathlib import Path

TOKEN_FILE = "ray-auth-token"  # under services.site.synthetic.cache_root()


def private_token_file(folder: Path) -> Path:
    """`folder`/ray-auth-token, made once with a random token, mode 0600 (atomic: several
    processes may start Ray at the same time; they all get the one token)."""
    from pathmaster.ids import private_secret

    path = folder / TOKEN_FILE
    private_secret(path)
    return path


def prepare_local_ray() -> None:
    """Prepare this process to start a local Ray on loopback with token authentication
    (call it just before `ray.init` without an address).

    Sets RAY_AUTH_MODE=token (unless the environment already chose a mode) and, when no
    token is given, RAY_AUTH_TOKEN_PATH to a private 0600 token file; turns off Ray's
    routable-address lookup so that Ray's node IP is 127.0.0.1 and it listens there only.
    (With a routable node IP, Ray 2.60 still listens on every interface: a multi-node
    cluster needs a private network or a firewall, see deploy/site.example.toml.)
    """
    import ray._private.ray_constants as ray_constants

    from services.site.synthetic import cache_root

    chosen = "RAY_AUTH_MODE" in os.environ
    token_mode = os.environ.setdefault("RAY_AUTH_MODE", "token").lower() == "token"
    if token_mode and not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(private_token_file(cache_root()))
    if not chosen:
        from ray._raylet import Config

        Config.initialize("")  # this process read RAY_AUTH_MODE at import: read it again, as Ray does
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # for the processes Ray starts
    ray_constants.ENABLE_RAY_CLUSTER = False                # for this one (read at import)


def cluster_environment(base: dict | None = None) -> dict:
    """The environment for a process that starts or joins a multi-node Ray (`ray start`):
    `base` (default os.environ) without the loopback-only switch `prepare_local_ray` may
    have left in this process's environment (with it, `ray start` refuses to make a
    cluster)."""
    env = dict(os.environ if base is None else base)
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    return env
