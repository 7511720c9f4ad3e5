"""What the `pathmaster` commands of the services share: the TLS flags for calling a
coordinator (query, batch, gateway) and stopping cleanly on SIGINT or SIGTERM (demo, serve,
gateway).

Not a command module itself (it registers nothing), so every command module may import it;
it imports neither gRPC nor a server, since registering the flags must stay cheap.
"""

from __future__ import annotations

import argparse
import signal
import socket
from pathlib import Path


# ------------------------------------------------------------------ TLS to the coordinator


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --tls-ca, --tls-cert and --tls-key (connecting to the coordinator) to `parser`."""
    group = parser.add_argument_group("TLS to the coordinator (certificates: deploy/make-certs.sh)")
    group.add_argument("--tls-ca", type=Path, metavar="PEM",
                       help="CA certificate that signed the coordinator's: connect with TLS")
    group.add_argument("--tls-cert", type=Path, metavar="PEM",
                       help="client certificate, for a coordinator that demands one (mutual TLS): a client "
                            "certificate, or the gateway's for `gateway`")
    group.add_argument("--tls-key", type=Path, metavar="PEM", help="the client certificate's private key")


def tls_from_args(args: argparse.Namespace):
    """The qos.transport.TLSFiles that `add_tls_arguments`' flags ask for; None: no TLS.

    Every file is read now, so a wrong path fails before anything is sent. Raises ValueError
    naming the flag or file at fault.
    """
    from qos.transport import TLSFiles

    if not (args.tls_ca or args.tls_cert or args.tls_key):
        return None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together: give both for mutual TLS")
    tls = TLSFiles(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)
    tls.channel_credentials()
    return tls


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SignalStop:
    """Set by SIGINT or SIGTERM from its creation on (a signal after it is never lost).

    Handlers of its own rather than KeyboardInterrupt: a process started in the background
    by a script inherits SIGINT ignored, and Python then never raises it. `wait()` reads
    the signal's number from the signal module's wakeup fd, which the interpreter's C
    handler writes whichever thread the kernel delivers the signal to: a main thread
    blocked on a lock is woken only by a signal delivered to it, and a Python handler that
    took a lock (as `threading.Event.set` does) would wait for ever on one the interrupted
    main thread was holding. The Python handler does nothing.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._wakeup, write = socket.socketpair()
        write.setblocking(False)
        self._write = write  # kept open while this object lives
        signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        for sig in STOP_SIGNALS:
            signal.signal(sig, _noted_on_wakeup_fd)

    def wait(self) -> int:
        """Block until a signal came; the exit status shells give a process that the first
        signal stopped (SIGINT 130, SIGTERM 143)."""
        while self.signum is None:
            signum = self._wakeup.recv(1)[0]  # any signal with a Python handler is written there
            if signum in STOP_SIGNALS:
                self.signum = signum
        return 128 + self.signum


def _noted_on_wakeup_fd(_signum, _frame) -> None:
    """SignalStop's Python handler: the signal is on the wakeup fd already."""
