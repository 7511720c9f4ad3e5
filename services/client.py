"""A small Python client of the coordinator (used by `pathmaster query`, benchmarks, tests).

    with CoordinatorClient("127.0.0.1:50051") as client:
        for event in client.submit(cells_from_files(["c1.png", "c1-mask.png"]), "urgent"):
            ...   # pb.CaseEvent: a site_result per site as it answers, then the summary
        client.class_stats("urgent")

A case travels with its class's DSCP both ways: the client asks the coordinator once
(Info, on the control port) which port serves each class, then sends each case on a
channel marked with the class's DSCP to that class's port, whose socket marks the
streamed replies too (qos/transport.py). A coordinator that advertises no class ports
(an older one) gets every case on its control port: requests still marked, replies not.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path, PurePath

import grpc

from pathmaster.ids import id_from_name
from pathmaster.records import InvalidInput
from qos.classes import DEFAULT_CLASSES, ClassTable
from qos.transport import STALE_PORT_CODES, ClassChannels, TLSFiles
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

log = logging.getLogger("pathmaster.client")

# Extra time the client allows past the case deadline for the coordinator's last events.
REPLY_MARGIN_S = 5.0
QUICK_CALL_S = 10.0
INFO_TIMEOUT_S = 5.0   # asking for the class ports; a coordinator that is down fails at once
COORDINATOR = "coordinator"  # the one target of this client's ClassChannels


def cells_from_files(paths) -> list[pb.CellImage]:
    """Read cell files into CellImages, pairing NAME.EXT with NAME-background.EXT and
    NAME-mask.EXT (the gateway's rule). Raises InvalidInput naming a file that cannot be
    read or does not pair."""
    from services.gateway.pairing import pair_files

    pairing = pair_files(str(p) for p in paths)
    if pairing.problems:
        name, problem = pairing.problems[0]
        raise InvalidInput(problem, name)
    cells = []
    for files in pairing.cells:
        parts = {role: _read(getattr(files, role)) for role in ("image", "background", "mask")
                 if getattr(files, role)}
        cells.append(pb.CellImage(cell_id=id_from_name(PurePath(files.image).name), **parts))
    return cells


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise InvalidInput("file not found", path) from None
    except OSError as exc:
        raise InvalidInput(f"cannot read: {exc.strerror}", path) from None


class CoordinatorClient:
    """Calls to one coordinator at `address` ("host:port"), TLS when `tls` is given.

    Thread-safe: the batch and the gateway share one client between many cases.
    """

    def __init__(self, address: str, tls: TLSFiles | None = None, classes: ClassTable = DEFAULT_CLASSES):
        self.address = address
        self.classes = classes
        self.tls = tls
        self._channels = ClassChannels({COORDINATOR: address}, classes, tls)
        self._class_ports: dict[str, int] | None = None  # None: not asked yet (or to ask again)
        self._ports_lock = threading.Lock()

    def _stub(self, request_class: str | None = None) -> pb_grpc.CoordinatorStub:
        return pb_grpc.CoordinatorStub(self._channels.channel(COORDINATOR, request_class))

    def class_address(self, request_class: str) -> str:
        """Where this client sends `request_class`'s cases (the control address until the
        coordinator's class ports are known, or when it has none)."""
        return self._channels.address(COORDINATOR, request_class)

    def learn_class_ports(self) -> dict[str, int]:
        """Ask the coordinator (once) which port serves each class, and use them from now
        on; returns them ({} from an older coordinator, which has none). When the
        coordinator cannot be asked now (down, TLS refused), cases go to the control port,
        where the same failure is reported, and the next case asks again."""
        with self._ports_lock:
            ports = self._class_ports
            if ports is None:
                try:
                    info = self._stub().Info(pb.CoordinatorInfoRequest(), timeout=INFO_TIMEOUT_S)
                    ports = dict(info.class_ports)
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                        return {}
                    log.info("coordinator %s has no class ports: its replies are unmarked", self.address)
                    ports = {}
                self._channels.set_class_ports(COORDINATOR, ports)
                self._class_ports = ports
            return dict(ports)

    def _forget_class_ports(self, call) -> None:
        """A case that failed on a class port as a stale port map does (STALE_PORT_CODES)
        makes the next case ask again: the coordinator may have restarted on other ports.
        (Runs on a gRPC thread: no lock.)"""
        if call.code() in STALE_PORT_CODES:
            self._class_ports = None

    def submit(self, cells: list[pb.CellImage], request_class: str = "routine", *, k: int = 5,
               deadline_s: float = 60.0, sites: list[str] | None = None, case_id: str = ""):
        """Submit a case; returns the gRPC stream of pb.CaseEvent (iterate it; `.cancel()`
        cancels the case). Raises grpc.RpcError when iterated if the case is refused.
        The case goes to its class's port (marked both ways); an unknown class goes to
        the control port unmarked, and the coordinator refuses it by name."""
        request = pb.CaseRequest(case_id=case_id, request_class=request_class, cells=cells,
                                 sites=sites or [], k=k, deadline_s=deadline_s)
        known = request_class in self.classes
        if known:
            self.learn_class_ports()
        on_class_port = known and self.class_address(request_class) != self.address
        stub = self._stub(request_class if known else None)
        call = stub.SubmitCase(request, timeout=deadline_s + REPLY_MARGIN_S)
        if on_class_port:
            call.add_done_callback(self._forget_class_ports)
        return call

    def class_stats(self, request_class: str = "") -> list[pb.ClassStats]:
        """Per-class completion-time statistics (every class when empty)."""
        reply = self._stub().GetClassStats(pb.ClassStatsRequest(request_class=request_class),
                                           timeout=QUICK_CALL_S)
        return list(reply.classes)

    def sites(self) -> list[pb.SiteStatus]:
        return list(self._stub().ListSites(pb.SitesRequest(), timeout=QUICK_CALL_S).sites)

    def image(self, site: str, cell_id: str) -> pb.ImageReply:
        """The full image (PNG), diagnosis and mask of a database cell at `site`."""
        return self._stub().GetImage(pb.ImageRequest(site=site, cell_id=cell_id), timeout=QUICK_CALL_S)

    def describe(self, error: grpc.RpcError) -> str:
        """`describe_error`, plus which TLS setting to check when the failure looks like a
        TLS mismatch between this client and the coordinator; for a coordinator that
        cannot be reached at all, "UNAVAILABLE: " and `unreachable` instead of gRPC's text."""
        if is_unreachable(error):
            log.debug("coordinator %s: %s", self.address, describe_error(error))
            return f"{error.code().name}: {unreachable(self.address)}"
        return describe_error(error) + tls_hint(error, self.tls)

    def close(self) -> None:
        self._channels.close()

    def __enter__(self) -> "CoordinatorClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def describe_error(error: grpc.RpcError) -> str:
    """"STATUS: details" of a failed call, for people."""
    return f"{error.code().name}: {error.details()}"


# What gRPC says when nothing accepts the connection (refused, no route, unknown host).
UNREACHABLE_DETAILS = ("failed to connect to all addresses", "connection refused",
                       "dns resolution failed", "no route to host", "name or service not known")


def is_unreachable(error: grpc.RpcError) -> bool:
    """True when a call failed because the coordinator could not be connected to at all."""
    details = (error.details() or "").lower()
    return error.code() == grpc.StatusCode.UNAVAILABLE and any(d in details for d in UNREACHABLE_DETAILS)


def unreachable(address: str) -> str:
    """What to tell a person whose coordinator at `address` cannot be reached."""
    return (f"The coordinator at {address} is not reachable; is it running? "
            "(start one with `pathmaster demo` or `pathmaster serve coordinator`)")


def tls_hint(error: grpc.RpcError, tls: TLSFiles | None) -> str:
    """" (what to check)" when a call to the coordinator failed the way a TLS mismatch
    fails, else "". gRPC only says "Socket closed" when a plaintext client meets a TLS
    server, and "handshake failed" when the certificates do not fit."""
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return ""
    details = error.details() or ""
    if tls is None and "Socket closed" in details:
        return (" (the coordinator closed the connection: if it serves TLS, connect with "
                "--tls-ca, and --tls-cert/--tls-key when it demands a client certificate)")
    if tls is not None and "handshake" in details.lower():
        return (" (the TLS handshake failed: does the coordinator serve TLS, did --tls-ca "
                "sign its certificate, does it demand a client certificate "
                "(--tls-cert/--tls-key)?)")
    return ""
