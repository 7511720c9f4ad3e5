"""The entry points the fuzz suite calls, on a real loopback deployment: three sites on Ray,
a coordinator and a gateway (`FuzzStack`), and what each call should answer.

Every call returns an `Outcome`: its status (a gRPC code name, or "HTTP 400"), its time,
the statuses it may have, and what went wrong ("" when nothing did): a status outside the
expected ones, a reply slower than its deadline allows, or something a refused request
left stored (a case logged, a case taken by a site, a file staged).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc
from tests.fuzz.inputs import KNOWN_CLASSES, Picture, Sent

SLACK_S = 10.0      # a reply may come this long after its deadline (a loaded, shared machine)
REFUSAL_S = 10.0    # a refusal comes this fast, whatever the deadline
SHORT_S = 1.0       # a call's deadline under this may end it with DEADLINE_EXCEEDED, whatever it sent
SETTLE_S = 60.0     # how long the cases of a call that timed out may take to end
SITE_CELLS = 14
SITE_SEEDS = (("site-a", 21), ("site-b", 22), ("site-c", 23))  # (name, seed) of its own sites
INVALID, PRECONDITION, OK = "INVALID_ARGUMENT", "FAILED_PRECONDITION", "OK"
# A request that parses may be answered any of these; never INTERNAL, UNKNOWN, UNAVAILABLE.
ANY_ANSWER = frozenset({OK, INVALID, PRECONDITION, "NOT_FOUND", "RESOURCE_EXHAUSTED", "ALREADY_EXISTS"})
# The messages of every method the suite calls with raw bytes: (service, method) -> (request type, streams).
METHODS = {("Site", "Analyse"): (pb.AnalyseRequest, False), ("Site", "GetImage"): (pb.ImageRequest, False),
           ("Site", "Info"): (pb.SiteInfoRequest, False),
           ("Coordinator", "SubmitCase"): (pb.CaseRequest, True),
           ("Coordinator", "GetClassStats"): (pb.ClassStatsRequest, False),
           ("Coordinator", "GetImage"): (pb.ImageRequest, False),
           ("Coordinator", "ListSites"): (pb.SitesRequest, False),
           ("Coordinator", "Info"): (pb.CoordinatorInfoRequest, False)}


@dataclass
class Outcome:
    target: str
    status: str
    seconds: float
    expected: frozenset
    problem: str = ""
    sent: str = ""  # what was sent, in short (no bytes)


class FuzzStack:
    """A running deployment to fuzz: `start()`, then the targets below; `stop()`.

    deployment: a running LoopbackDeployment with a case log to fuzz (left running by
    `stop()`); None: `start()` starts one of its own, three small synthetic sites
    (SITE_CELLS cells, cached) logging cases to `root`/cases.jsonl. Either way a gateway
    in front of it, its users and staged files in memory, and a signed-in user `web`.
    """

    web_user = "dr-pat"

    def __init__(self, root: Path, deployment=None):
        self.root = Path(root)
        self.deployment = deployment
        self.own = deployment is None
        self.gateway = None

    def start(self) -> "FuzzStack":
        from services.demo import DemoSite, LoopbackDeployment, demo_databases
        from services.gateway import start_gateway
        from services.synthetic import cache_root
        from tests.clients.web import WebClient

        if self.own:
            databases = demo_databases([DemoSite(name, seed, "flat") for name, seed in SITE_SEEDS],
                                       cells=SITE_CELLS, cache=cache_root() / "test-fuzz")
            self.deployment = LoopbackDeployment(databases, metrics_port=None,
                                                 case_log=self.root / "cases.jsonl").start()
        self.case_log = Path(self.deployment.case_log)
        self.site_names = list(self.deployment.sites)
        coordinator = self.deployment.coordinator
        self.coordinator_channels = self._channels(coordinator.address, coordinator.class_ports)
        self.site_channels = {name: self._channels(site.address, site.class_ports)
                              for name, site in self.deployment.sites.items()}
        self.gateway = start_gateway(coordinator.address)
        self.web = WebClient(self.gateway, self.web_user)
        return self

    @staticmethod
    def _channels(address: str, class_ports: dict[str, int]) -> dict[str, grpc.Channel]:
        host = address.rpartition(":")[0]
        ports = {"control": address, **{name: f"{host}:{port}" for name, port in class_ports.items()}}
        return {name: grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 * 2**20)])
                for name, target in ports.items()}

    def stop(self) -> None:
        for channels in [getattr(self, "coordinator_channels", {}), *getattr(self, "site_channels", {}).values()]:
            for channel in channels.values():
                channel.close()
        if self.gateway is not None:
            self.gateway.stop()
        if self.own and self.deployment is not None:
            self.deployment.stop()

    # ------------------------------------------------------------ what is stored

    def settle(self) -> None:
        """Wait (at most SETTLE_S) until no case runs at the coordinator or a site: what a
        call that timed out started has ended, so it is not taken for the next call's."""
        coordinator = self.deployment.coordinator.servicer
        sites = [site.servicer.dispatcher for site in self.deployment.sites.values()]
        end = time.monotonic() + SETTLE_S
        while time.monotonic() < end:
            if coordinator.cases_running == 0 and all(d.waiting() == 0 and d.running() == 0 for d in sites):
                return
            time.sleep(0.05)  # polling a condition, bounded by SETTLE_S

    def stored(self) -> dict[str, int]:
        """What requests leave behind: cases logged, cases taken by the sites, files staged."""
        logged = self.case_log.read_bytes().count(b"\n") if self.case_log.exists() else 0
        taken = sum(len(site.servicer.cases_started) for site in self.deployment.sites.values())
        return {"cases logged": logged, "site cases": taken,
                "staged files": self.gateway.gateway.staged.usage(self.web_user)[0]}

    def healthy(self) -> bool:
        """Every site's and the coordinator's health says SERVING."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        for channels in (self.coordinator_channels, *self.site_channels.values()):
            reply = health_pb2_grpc.HealthStub(channels["control"]).Check(health_pb2.HealthCheckRequest(), timeout=10)
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                return False
        return True


# ------------------------------------------------------------------ judging a call


def judged(stack: FuzzStack, target: str, call, expected: set[str], timeout: float | None, sent: str) -> Outcome:
    """Run `call()` (returning a status), timed, and judge it against `expected`; whatever
    a refused call changed in `stack.stored()` is a problem. `sent`: the input, in short."""
    before = stack.stored()
    started = time.perf_counter()
    status = call()
    seconds = time.perf_counter() - started
    outcome = Outcome(target, status, seconds, frozenset(expected), sent=sent)
    if status in (OK, "DEADLINE_EXCEEDED") or status.startswith("HTTP 2"):
        stack.settle()
    problems = []
    if status not in expected:
        problems.append(f"status {status}, expected {' or '.join(sorted(expected))}")
    bound = (timeout or 30.0) + SLACK_S
    if seconds > bound:
        problems.append(f"replied in {seconds:.1f} s, over {bound:.1f} s")
    refused = status not in (OK, "DEADLINE_EXCEEDED") and not status.startswith("HTTP 2")
    if refused and seconds > REFUSAL_S:
        problems.append(f"refused after {seconds:.1f} s, over {REFUSAL_S:.0f} s")
    if refused:
        after = stack.stored()
        changed = {k: (before[k], after[k]) for k in before if after[k] != before[k]}
        if changed:
            problems.append(f"a refused request left {changed} stored")
    outcome.problem = "; ".join(problems)
    return outcome


def _grpc_status(run) -> str:
    try:
        run()
        return OK
    except grpc.RpcError as exc:
        return exc.code().name


def _expected(sent: Sent, port: str, timeout: float) -> set[str]:
    """What a well-formed or defective request should be answered on `port`: another known
    class on a class port FAILED_PRECONDITION (the port's check comes first), any defect
    INVALID_ARGUMENT, else OK; DEADLINE_EXCEEDED too where the call's deadline is short, or
    the request was accepted (its work may outlast the deadline)."""
    if port != "control" and sent.request_class in KNOWN_CLASSES and sent.request_class != port:
        expected = {PRECONDITION}
    else:
        expected = {INVALID} if sent.defects else {OK}
    if timeout < SHORT_S or OK in expected:
        expected.add("DEADLINE_EXCEEDED")
    return expected


# ------------------------------------------------------------------ the targets


def submit_case(stack: FuzzStack, sent: Sent, port: str, timeout: float) -> Outcome:
    """The coordinator's SubmitCase with a generated CaseRequest, its stream read to the end."""
    stub = pb_grpc.CoordinatorStub(stack.coordinator_channels[port])
    status = lambda: _grpc_status(lambda: list(stub.SubmitCase(sent.message, timeout=timeout)))  # noqa: E731
    return judged(stack, "coordinator SubmitCase", status, _expected(sent, port, timeout), timeout,
                  f"{sent!r} on {port}, timeout {timeout:.3g} s")


def site_analyse(stack: FuzzStack, sent: Sent, site: str, port: str, timeout: float) -> Outcome:
    """A site's Analyse with a generated AnalyseRequest (images mode)."""
    stub = pb_grpc.SiteStub(stack.site_channels[site][port])
    status = lambda: _grpc_status(lambda: stub.Analyse(sent.message, timeout=timeout))  # noqa: E731
    return judged(stack, "site Analyse", status, _expected(sent, port, timeout), timeout,
                  f"{sent!r} to {site} on {port}, timeout {timeout:.3g} s")


def raw_call(stack: FuzzStack, service: str, method: str, data: bytes, port: str, timeout: float,
             site: str) -> Outcome:
    """Any method of a site or the coordinator, sent `data` as its request bytes. Bytes that
    protobuf itself cannot parse as the method's message must be INVALID_ARGUMENT."""
    message, streams = METHODS[(service, method)]
    channels = stack.coordinator_channels if service == "Coordinator" else stack.site_channels[site]
    path = f"/pathmaster.v1.{service}/{method}"
    call = (channels[port].unary_stream if streams else channels[port].unary_unary)(path)
    try:
        message.FromString(data)
        expected = set(ANY_ANSWER) | {"DEADLINE_EXCEEDED"}
    except Exception:  # noqa: BLE001 - protobuf's DecodeError: the oracle is the library, not our code
        expected = {INVALID} | ({"DEADLINE_EXCEEDED"} if timeout < SHORT_S else set())

    def run():
        reply = call(data, timeout=timeout)
        if streams:
            list(reply)
    return judged(stack, f"{service.lower()} {method} bytes", lambda: _grpc_status(run), expected, timeout,
                  f"{len(data)} bytes {data[:24]!r} on {port}, timeout {timeout:.3g} s")


def _http(reply) -> str:
    return f"HTTP {reply[0]}"


def _could_be_a_cell(picture: Picture) -> bool:
    """Whether the content check passes the decoded picture (it refuses masks and fields)."""
    from pathmaster.image.io import decode_image
    from pathmaster.records import InvalidInput
    from pathmaster.analysis.uploads import check_cell_image

    try:
        check_cell_image(decode_image(picture.data, "cell"), "cell")
    except InvalidInput:
        return False
    return True


def gateway_upload(stack: FuzzStack, name: str, picture: Picture) -> Outcome:
    """The gateway's POST /api/upload of one file: staged (200) when its name is a plain
    image name and the file decodes to what could be a cell (not a mask or a field of view:
    ``pathmaster.analysis.uploads``), else 400."""
    from services.gateway.pairing import IMAGE_EXTENSIONS
    from tests.clients.web import multipart

    # as a browser's FormData writes a file name into the part's header (the HTML standard)
    name = name.replace("\n", "%0A").replace("\r", "%0D").replace('"', "%22")
    good_name = "/" not in name and "\\" not in name and Path(name).suffix.lower() in IMAGE_EXTENSIONS
    expected = {"HTTP 200"} if good_name and picture.decodes and _could_be_a_cell(picture) else {"HTTP 400"}
    body, kind = multipart({}, {name: picture.data}, field="file")
    outcome = judged(stack, "gateway upload", lambda: _http(stack.web.post("api/upload", body, kind)), expected,
                     None, f"{name!r}: {picture!r}")
    stack.gateway.gateway.staged.discard(stack.web_user)  # room for the next: staging has its limits
    return outcome


def gateway_json(stack: FuzzStack, path: str, body) -> Outcome:
    """The gateway's JSON routes (/api/pair, /api/case of staged files) with generated bodies:
    answered, or refused as the client's mistake (4xx), never a server error."""
    expected = {"HTTP 200", "HTTP 400", "HTTP 409", "HTTP 422"} if path == "api/pair" else \
        {"HTTP 400", "HTTP 403", "HTTP 409", "HTTP 422"}
    data = json.dumps(body).encode()
    return judged(stack, f"gateway {path}", lambda: _http(stack.web.post(path, data, "application/json")),
                  expected, None, data[:120].decode("utf-8", "replace"))


# ------------------------------------------------------------------ memory


def rss_mib(pid: int | None = None) -> float:
    """Resident memory of process `pid` (default this one), MiB, from /proc."""
    for line in Path(f"/proc/{pid or os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def descendants(pid: int | None = None) -> list[int]:
    """Every live process under `pid` (default this one): here, the local Ray's."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid or os.getpid()]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return found


def memory() -> dict[str, float]:
    """MiB resident: this process (coordinator, sites' servers, gateway) and its descendants (Ray)."""
    ray = 0.0
    for pid in descendants():
        try:
            ray += rss_mib(pid)
        except OSError:
            continue  # ended meanwhile
    return {"this process": rss_mib(), "Ray (its descendants)": ray}
