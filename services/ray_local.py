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

`ensure_ray` connects a server (a site, the coordinator, the demo) to Ray: this local one,
or a cluster it joins. The RAY_ flags below are how every actor of ours is declared.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

TOKEN_FILE = "ray-auth-token"  # under services.synthetic.cache_root()
RAY_START_ATTEMPTS = 3     # a local Ray that does not register in Ray's fixed 30 s (a very busy
                           # host) is torn down and started again, this many times in all
RAY_TASK_EVENTS = False    # Ray records every call to our actors (site workers, analysers, their
                           # pings) as task events kept in its GCS for its dashboard and state
                           # API, which we do not use: on, the GCS grew ~30 KB a case (bench_memory)
RAY_OUT_OF_ORDER = True    # our actors (site workers, analysers) run calls in the order they arrive,
                           # not Ray's per-caller sequence: a call cancelled while its image
                           # arguments are still being put in the object store leaves a gap in that
                           # sequence, which stalls the actor's next calls and then fails them
                           # (ActorUnavailableError "timed out waiting for seq_no"). Order is ours
                           # to keep: a site's dispatcher sends a worker one job at a time

log = logging.getLogger("pathmaster.ray")


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

    from services.synthetic import cache_root

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


def ensure_ray(address: str = "", num_cpus: int | None = None) -> None:
    """Connect this process to Ray once: a local instance by default, or `address`
    ("auto", "HOST:PORT", "ray://HOST:PORT") to join an existing cluster."""
    import ray

    if ray.is_initialized():
        return
    kwargs = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    if address:
        ray.init(address=address, **kwargs)
    else:  # a local instance: loopback only, token authentication, ends with this process
        from services.fate import descendants, remember_descendants, watch_me

        watch_me()  # even when SIGKILLed: its Ray processes are killed by a watchdog (services/fate.py)
        # Ray starts its workers at nice 15 by default. Our workers serve a user's case
        # while they wait, so any busy process on the host (a build, a backup) would starve
        # them to a crawl: they run at the service's own priority instead.
        prepare_local_ray()
        for attempt in range(1, RAY_START_ATTEMPTS + 1):
            before = set(descendants(os.getpid()))
            try:
                ray.init(num_cpus=num_cpus, _system_config={"worker_niceness": 0}, **kwargs)
                break
            except Exception as exc:  # Ray raises a bare Exception when its node does not register
                if "timed out during startup" not in str(exc) or attempt == RAY_START_ATTEMPTS:
                    raise
                log.warning("local Ray did not start (%s); starting it again (%d of %d)",
                            exc, attempt + 1, RAY_START_ATTEMPTS)
                ray.shutdown()
                for pid in set(descendants(os.getpid())) - before:  # the half-started node's processes
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
        remember_descendants()  # Ray's own processes, the agents included
