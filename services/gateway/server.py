"""The HTTP gateway: serves the pathologist's page and relays it to the coordinator.

Routes (all JSON unless said otherwise):

    GET  /                      the page (static/index.html; app.js and style.css beside it)
    GET  /api/config            the coordinator's request classes (its Info), file-size limit,
                                coordinator address
    GET  /api/sites             the coordinator's sites and whether each is serving
    GET  /api/stats?class=NAME  recent completion times for one request class
    POST /api/pair              {"names": [...]} -> how those files pair into cells
    POST /api/case              {"request_class": ..., "files": [{"name", "data" (base64)}]}
                                -> a chunked stream of newline-delimited JSON events:
                                   "accepted" (cells sent, files rejected), one "site" per
                                   site as it answers, then "summary" (or "error")
    GET  /api/image?site=S&cell_id=C   the full database image (image/png)

The standard library's ThreadingHTTPServer is enough: one pathologist's browser makes a
handful of requests, and each case's stream holds one thread while the sites work.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import grpc

from pathmaster.defaults import CASE_DEADLINE_S, MAX_FILE_BYTES, MAX_REQUEST_BYTES
from qos.classes import UnknownClass
from qos.transport import TLSFiles
from services.client import CoordinatorClient, tls_hint, unknown_class_message
from services.coordinator.validation import DEFAULT_CLASS  # what the coordinator takes for no class
from services.gateway import events
from services.gateway.pairing import pair_files
from services.gateway.upload import check_upload

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# MAX_REQUEST_BYTES: a 6-cell case with backgrounds and masks is ~2 MB, ~2.7 MB as base64.
# The page leaves oversize files out before it sends, so it only stops runaway API clients.


class HttpError(Exception):
    """An error to answer with `status` and a JSON {"error": message}."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def grpc_http_error(exc: grpc.RpcError, what: str, hint: str = "") -> HttpError:
    """Map a failed coordinator call to an HTTP error that says what failed and why
    (`hint`: what to check, appended)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    status = {grpc.StatusCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
              grpc.StatusCode.INVALID_ARGUMENT: HTTPStatus.BAD_REQUEST,
              grpc.StatusCode.DEADLINE_EXCEEDED: HTTPStatus.GATEWAY_TIMEOUT,
              }.get(code, HTTPStatus.BAD_GATEWAY)
    return HttpError(status, f"{what}: {code.name}: {detail}{hint}")


class Gateway:
    """What the request handlers share: the coordinator's client."""

    def __init__(self, coordinator_address: str, case_deadline_s: float = CASE_DEADLINE_S,
                 tls: TLSFiles | None = None):
        self.coordinator_address = coordinator_address
        self.case_deadline_s = case_deadline_s
        self.client = CoordinatorClient(coordinator_address, tls)

    def close(self) -> None:
        self.client.close()

    def _failed(self, exc: grpc.RpcError, what: str) -> HttpError:
        return grpc_http_error(exc, what, tls_hint(exc, self.client.tls))

    def config(self) -> dict:
        """What the page needs to start: the coordinator's request classes, most favoured
        first (empty, with "classes_error" saying why, while the coordinator cannot be
        asked: the page still loads, and a case then reports the same failure)."""
        config = {"coordinator": self.coordinator_address, "max_file_bytes": MAX_FILE_BYTES,
                  "default_class": DEFAULT_CLASS, "classes": []}
        try:
            classes = self.client.classes
        except grpc.RpcError as exc:
            return config | {"classes_error": self._failed(exc, "the request classes of the coordinator "
                                                               f"at {self.coordinator_address}").message}
        config["classes"] = [{"name": c.name, "dscp": c.dscp, "priority": c.priority,
                              "description": c.description} for c in classes]
        if DEFAULT_CLASS not in classes and classes.names():
            config["default_class"] = classes.names()[0]
        return config

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
                           "database_cells": s.info.database_cells} for s in sites]}

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
        try:
            return self.client.image(site, cell_id).image
        except grpc.RpcError as exc:
            raise self._failed(exc, f"image {cell_id!r} from site {site!r}")

    def submit(self, request_class: str, files: dict[str, bytes]):
        """Yield the case's events as dicts: "accepted", then "site"s, then "summary"/"error"."""
        checked = check_upload(files)
        yield {"type": "accepted", "request_class": request_class,
               "cells": [c.cell_id for c in checked.cells],
               "pairing": checked.pairing.as_dict(),
               "rejected": [{"name": n, "problem": p} for n, p in checked.rejected]}
        if not checked.cells:
            yield {"type": "error", "status": "INVALID_ARGUMENT",
                   "message": "no usable cell images in this case: nothing was sent"}
            return
        call = self.client.submit(checked.cells, request_class, deadline_s=self.case_deadline_s)
        try:
            for event in call:
                yield events.case_event_json(event)
        except grpc.RpcError as exc:
            yield {"type": "error", "status": exc.code().name,
                   "message": f"the coordinator at {self.coordinator_address} did not run the "
                              f"case: {self.client.describe(exc)}"}
        finally:
            call.cancel()  # the browser went away, or the stream is over: free the sites


class GatewayHandler(BaseHTTPRequestHandler):
    """One HTTP request. `server.gateway` holds the shared `Gateway`."""

    protocol_version = "HTTP/1.1"  # keep-alive, and chunked streams for cases
    server_version = "PathMasterGateway/1"

    @property
    def gateway(self) -> Gateway:
        return self.server.gateway

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        log.debug("%s %s", self.address_string(), format % args)

    # ------------------------------------------------------------------ dispatch
    def do_GET(self):
        self._dispatch({"/": self._page, "/api/config": self._config, "/api/sites": self._sites,
                        "/api/stats": self._stats, "/api/image": self._image})

    def do_POST(self):
        self._dispatch({"/api/pair": self._pair, "/api/case": self._case})

    def _dispatch(self, routes):
        url = urlsplit(self.path)
        self.query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        handler = routes.get(url.path)
        if handler is None and self.command == "GET" and url.path.startswith("/static/"):
            handler = self._static
        try:
            if handler is None:
                raise HttpError(HTTPStatus.NOT_FOUND, f"no such page: {url.path}")
            handler(url.path)
        except HttpError as exc:
            self._send_json({"error": exc.message}, exc.status)
        except (BrokenPipeError, ConnectionResetError):
            log.info("client %s went away", self.address_string())
            self.close_connection = True

    # ------------------------------------------------------------------ responses
    def _send(self, body: bytes, content_type: str, status=HTTPStatus.OK, cache=False):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=3600" if cache else "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, obj, status=HTTPStatus.OK):
        self._send(json.dumps(obj).encode("utf-8"), "application/json", status)

    def _read_json(self) -> dict:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise HttpError(HTTPStatus.LENGTH_REQUIRED, "the request needs a Content-Length")
        if length > MAX_REQUEST_BYTES:
            self.close_connection = True  # the unread body would be taken for a request
            raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                            f"request of {length / 1e6:.1f} MB is over the gateway's "
                            f"{MAX_REQUEST_BYTES / 1e6:.0f} MB limit: send fewer or smaller files")
        try:
            body = json.loads(self.rfile.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"the request body is not JSON: {exc}")
        if not isinstance(body, dict):
            raise HttpError(HTTPStatus.BAD_REQUEST, "the request body must be a JSON object")
        return body

    # ------------------------------------------------------------------ routes
    def _page(self, _path):
        self._send((STATIC_DIR / "index.html").read_bytes(), STATIC_TYPES[".html"])

    def _static(self, path):
        name = path.removeprefix("/static/")
        file = STATIC_DIR / name
        if "/" in name or file.suffix not in STATIC_TYPES or not file.is_file():
            raise HttpError(HTTPStatus.NOT_FOUND, f"no such file: {path}")
        self._send(file.read_bytes(), STATIC_TYPES[file.suffix])

    def _config(self, _path):
        self._send_json(self.gateway.config())

    def _sites(self, _path):
        self._send_json(self.gateway.sites())

    def _stats(self, _path):
        self._send_json(self.gateway.stats(self.gateway.check_class(self.query.get("class", ""))))

    def _image(self, _path):
        site, cell_id = self.query.get("site", ""), self.query.get("cell_id", "")
        if not site or not cell_id:
            raise HttpError(HTTPStatus.BAD_REQUEST, "give both ?site= and ?cell_id=")
        self._send(self.gateway.image(site, cell_id), "image/png", cache=True)

    def _pair(self, _path):
        names = self._read_json().get("names")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise HttpError(HTTPStatus.BAD_REQUEST, '"names" must be a list of file names')
        self._send_json(pair_files(names).as_dict())

    def _case(self, _path):
        body = self._read_json()
        request_class = self.gateway.check_class(body.get("request_class", ""))
        files = self._decode_files(body.get("files"))
        # Headers go out now; from here on errors travel as "error" events in the stream.
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        stream = self.gateway.submit(request_class, files)
        try:
            for event in stream:
                self._write_chunk(json.dumps(event).encode("utf-8") + b"\n")
        finally:
            stream.close()  # runs submit()'s `finally`, cancelling the call
        self.wfile.write(b"0\r\n\r\n")

    def _write_chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    # ------------------------------------------------------------------ input checks
    @staticmethod
    def _decode_files(files) -> dict[str, bytes]:
        if not isinstance(files, list) or not files:
            raise HttpError(HTTPStatus.BAD_REQUEST, '"files" must be a non-empty list of '
                                                    '{"name": ..., "data": base64}')
        out = {}
        for n, item in enumerate(files):
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str) or not name or "/" in name or "\\" in name:
                raise HttpError(HTTPStatus.BAD_REQUEST, f"file #{n + 1}: needs a plain file name")
            if name in out:
                raise HttpError(HTTPStatus.BAD_REQUEST, f"{name}: sent twice")
            try:
                out[name] = base64.b64decode(item.get("data") or "", validate=True)
            except (binascii.Error, TypeError):
                raise HttpError(HTTPStatus.BAD_REQUEST, f"{name}: data is not base64")
        return out


@dataclass
class GatewayHandle:
    """A running gateway: open `url` in a browser; `stop()` shuts it down."""

    url: str
    server: ThreadingHTTPServer
    thread: threading.Thread

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.server.gateway.close()
        self.thread.join(timeout=10)


def start_gateway(coordinator_address: str, host: str = "127.0.0.1", port: int = 0,
                  case_deadline_s: float = CASE_DEADLINE_S,
                  tls: TLSFiles | None = None) -> GatewayHandle:
    """Serve the page for the coordinator at `coordinator_address` ("host:port"), over
    TLS when `tls` is given (the page itself is plain HTTP, for a browser on this host).

    Listens on host:port (port 0 picks a free one) in a background thread and returns
    at once with a `GatewayHandle` (`.url`, `.stop()`).
    """
    server = ThreadingHTTPServer((host, port), GatewayHandler)
    server.daemon_threads = True
    server.gateway = Gateway(coordinator_address, case_deadline_s, tls)
    thread = threading.Thread(target=server.serve_forever, name="pathmaster-gateway",
                              daemon=True)
    thread.start()
    bound_host, bound_port = server.server_address[:2]
    return GatewayHandle(url=f"http://{bound_host}:{bound_port}/", server=server, thread=thread)
