"""What the gateway's routes share: the coordinator's client (classes, sites, stats, images,
cases) with the accounts, audit log, staged files and metrics, and the request classes in a
pathologist's words."""

from __future__ import annotations

import time
from http import HTTPStatus

import grpc
from starlette.concurrency import run_in_threadpool

from pathmaster.vocabulary import BETHESDA_TERMS
from qos.classes import UnknownClass
from qos.transport import TLSFiles
from services.client import AsyncCases, CoordinatorClient, tls_hint, unknown_class_message
from services.shared import CASE_DEADLINE_S, DEFAULT_CLASS
from services.gateway import events
from services.gateway.accounts import Accounts, LoginThrottle, Session, may_send
from services.gateway.audit import AuditLog
from services.gateway.errors import HttpError, grpc_http_error
from services.gateway.metrics import UNKNOWN_CLASS, GatewayMetrics
from services.gateway.staging import StagedFiles, StagingLimits
from services.gateway.upload import MAX_FILE_BYTES, check_upload
from services.metrics import case_outcome

# The request classes in a pathologist's words; a coordinator's other classes show their
# own description. Bulk is never offered on the page (see ROLE_REFUSED_CLASSES).
CLASS_LABELS = {"urgent": "Intra-operative — fastest", "routine": "Diagnostic", "teaching": "Teaching"}
CLASS_HINTS = {"urgent": "A frozen section during surgery: answered before anything else.",
               "routine": "A case for diagnosis: answered in turn.",
               "teaching": "Teaching and review: answered when the network has room."}


def class_label(name: str) -> str:
    """The words the page uses for request class `name`."""
    return CLASS_LABELS.get(name, name.replace("-", " ").capitalize())


class Gateway:
    """What the request handlers share: the coordinator's client."""

    def __init__(self, coordinator_address: str, accounts: Accounts, audit: AuditLog,
                 case_deadline_s: float = CASE_DEADLINE_S, tls: TLSFiles | None = None,
                 https: bool = False, staging: StagingLimits = StagingLimits()):
        self.coordinator_address = coordinator_address
        self.case_deadline_s = case_deadline_s
        self.client = CoordinatorClient(coordinator_address, tls)
        self.cases = AsyncCases(self.client)  # cases stream on the event loop, no thread each
        self.accounts = accounts
        self.audit = audit
        self.throttle = LoginThrottle()
        self.https = https
        self.metrics = GatewayMetrics()
        self.staged = StagedFiles(staging)
        self.staged.start_sweeping()

    def close(self) -> None:
        self.staged.close()
        self.client.close()
        self.audit.close()

    def _failed(self, exc: grpc.RpcError, what: str) -> HttpError:
        return grpc_http_error(exc, what, tls_hint(exc, self.client.tls))

    def config(self, role: str) -> dict:
        """What the page needs to start: the coordinator's request classes, most favoured
        first, each with its label in words and whether `role` may send it (empty, with
        "classes_error" saying why, while the coordinator cannot be asked: the page still
        loads, and a case then reports the same failure), and the Bethesda terms in order of
        severity."""
        config = {"coordinator": self.coordinator_address, "max_file_bytes": MAX_FILE_BYTES,
                  "default_class": DEFAULT_CLASS, "classes": [],
                  "bethesda_terms": list(BETHESDA_TERMS)}  # least to most severe (pathmaster.vocabulary)
        try:
            classes = self.client.classes
        except grpc.RpcError as exc:
            failed = self._failed(exc, f"the request classes of the coordinator at {self.coordinator_address}")
            return config | {"classes_error": failed.message, "classes_words": failed.words}
        config["classes"] = [{"name": c.name, "dscp": c.dscp, "priority": c.priority,
                              "description": c.description, "label": class_label(c.name),
                              "hint": CLASS_HINTS.get(c.name, c.description),
                              "allowed": may_send(role, c.name)} for c in classes]
        allowed = [c.name for c in classes if may_send(role, c.name)]
        if DEFAULT_CLASS not in allowed and allowed:
            config["default_class"] = allowed[0]
        return config

    async def check_class_async(self, name: str) -> str:
        """`check_class`, on the event loop when the coordinator's classes are known (a
        lookup), else in a worker thread (it asks the coordinator)."""
        if self.client.learnt_classes() is None:
            return await run_in_threadpool(self.check_class, name)
        return self.check_class(name)

    def check_class(self, name: str) -> str:
        """`name` if the coordinator has that request class; HttpError 400 naming its
        classes if not. Unchecked while the coordinator cannot be asked (the call that
        follows reports why)."""
        try:
            self.client.request_class(name)
        except UnknownClass as exc:
            raise HttpError(HTTPStatus.BAD_REQUEST, unknown_class_message(exc, self.coordinator_address))
        except grpc.RpcError:
            pass
        return name

    def sites(self) -> dict:
        try:
            sites = self.client.sites()
        except grpc.RpcError as exc:
            raise self._failed(exc, f"listing the sites at {self.coordinator_address}")
        return {"sites": [{"site": s.site, "address": s.address, "serving": s.serving,
                           "algorithm": s.info.algorithm,
                           "database_cells": s.info.database_cells,
                           "database_origins": dict(s.info.database_origins),
                           "pixel_um": s.info.pixel_um or None} for s in sites]}

    def stats(self, request_class: str) -> dict:
        try:
            found = self.client.class_stats(request_class)
        except grpc.RpcError as exc:
            raise self._failed(exc, f"completion times of class {request_class!r}")
        found = [s for s in found if s.request_class == request_class]
        if not found:
            return {"request_class": request_class, "cases": 0, "recent_s": []}
        return events.class_stats_json(found[0])

    def image(self, site: str, cell_id: str) -> bytes:
        """A database cell's full image, fetched in the coordinator's least favoured class
        (the page asks for them after the case, behind any case's traffic)."""
        try:
            lowest = list(self.client.classes)[-1].name
        except grpc.RpcError:
            lowest = None  # the call below says why the coordinator cannot be asked
        try:
            return self.client.image(site, cell_id, lowest).image
        except grpc.RpcError as exc:
            raise self._failed(exc, f"image {cell_id!r} from site {site!r}")

    def example_files(self, site: str, cell_id: str) -> dict[str, bytes]:
        """A database cell as a case's files ("more like this"): its image and, when the
        site has one, its mask, named like-CELL.png and like-CELL-mask.png."""
        try:
            reply = self.client.image(site, cell_id)
        except grpc.RpcError as exc:
            raise self._failed(exc, f"image {cell_id!r} from site {site!r}")
        stem = f"like-{cell_id[:24]}"
        return {f"{stem}.png": reply.image} | ({f"{stem}-mask.png": reply.mask} if reply.mask else {})

    async def submit(self, request_class: str, files: dict[str, bytes], session: Session,
                     client: str | None, case_id: str = "", headers: dict | None = None,
                     concept_weights: dict[str, float] | None = None):
        """Yield the case's events as dicts: "accepted", then the coordinator's ("plan",
        "site"s, "summary"), or an "error". Closing the generator (the browser went away)
        cancels the coordinator's call, which frees the sites. Audited: who sent how many
        cells of which class, and the case id the coordinator gave it. headers: {file name:
        header} of staged files, checked when staged (not probed again). concept_weights:
        refine by concept (the sites re-rank their matches)."""
        # Headers only (~0.5 ms a file on a loaded host; none for staged files, checked
        # when they arrived): the sites decode.
        checked = check_upload(files, headers=headers)
        # A case with no usable cell is refused before anything is sent: not a case.
        self.audit.record("case" if checked.cells else "case-refused", session.name, session.role, client,
                          request_class=request_class, case_id=case_id, cells=len(checked.cells),
                          files_refused=len(checked.rejected))
        yield {"type": "accepted", "request_class": request_class,
               "cells": [c.cell_id for c in checked.cells],
               "pairing": checked.pairing.as_dict(),
               "rejected": [{"name": n, "problem": p} for n, p in checked.rejected]}
        if not checked.cells:
            yield {"type": "error", "status": "INVALID_ARGUMENT", "code": "nothing_sent",
                   "words": "No cell image in this case could be used: nothing was sent.",
                   "message": "no usable cell images in this case: nothing was sent"}
            return
        started, outcome = time.perf_counter(), "cancelled"  # unless it ends otherwise
        label = self.class_label(request_class)  # now: the classes were just learnt (check_class)
        case = self.cases.submit(checked.cells, request_class, deadline_s=self.case_deadline_s,
                                 case_id=case_id, concept_weights=concept_weights)
        try:
            async for event in case:
                reply = events.case_event_json(event)
                if reply["type"] == "summary":
                    outcome = case_outcome(reply["sites_ok"], reply["sites_failed"])
                    self.audit.record("case-done", session.name, session.role, client,
                                      case_id=reply["case_id"], request_class=request_class,
                                      sites_ok=reply["sites_ok"], sites_failed=reply["sites_failed"])
                yield reply
        except grpc.RpcError as exc:
            outcome = "failed"
            yield {"type": "error", "status": exc.code().name,
                   "words": events.coordinator_words(exc.code().name),
                   "message": f"the coordinator at {self.coordinator_address} did not run the "
                              f"case: {self.client.describe(exc)}"}
        finally:
            await case.aclose()  # cancels the coordinator's call if it is still going
            self.metrics.case_seconds.labels(label, outcome).observe(
                time.perf_counter() - started)

    def class_label(self, request_class: str) -> str:
        """The `class` label of a case: its class if the coordinator has it, else "unknown"
        (a label set users cannot grow). From the classes already learnt: never calls the
        coordinator (it runs on the event loop); "unknown" while they are not known."""
        table = self.client.learnt_classes()
        return request_class if table is not None and request_class in table else UNKNOWN_CLASS
