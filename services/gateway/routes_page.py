"""The page itself and what it reads: its static files, the coordinator's classes, sites,
recent times and database images, and the gateway's metrics."""

from __future__ import annotations

from http import HTTPStatus
from pathlib import Path

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import FileResponse
from starlette.staticfiles import NotModifiedResponse, StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pathmaster import defaults
from qos.transport import is_loopback
from services.gateway.accounts import Session
from services.gateway.errors import HttpError
from services.gateway.facade import Gateway
from services.gateway.requests import client_of
from services.gateway.routes_session import SESSION_COOKIE

STATIC_DIR = Path(__file__).parent / "static"
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
                ".webmanifest": "application/manifest+json"}  # the manifest: Chromium offers to install


class PageFiles(StaticFiles):
    """The page's files at /static (Starlette's StaticFiles: the path kept inside the folder,
    ETag and Last-Modified with 304, HEAD), only of the types above and typed by this table
    rather than by the machine's mime.types, each revalidated on every load ("no-cache") so a
    new release's page is seen at once."""

    def file_response(self, full_path, stat_result, scope, status_code: int = 200):
        suffix = Path(full_path).suffix
        if suffix not in STATIC_TYPES:
            raise HTTPException(HTTPStatus.NOT_FOUND)
        response = FileResponse(full_path, status_code=status_code, stat_result=stat_result,
                                media_type=STATIC_TYPES[suffix], headers={"Cache-Control": "no-cache"})
        if self.is_not_modified(response.headers, Headers(scope=scope)):
            return NotModifiedResponse(response.headers)
        return response


def page_router(gateway: Gateway, signed_in) -> APIRouter:
    """The page's routes (`signed_in`: the session dependency)."""
    router = APIRouter()

    @router.get("/metrics", include_in_schema=False)
    def metrics(request: Request):
        """Prometheus metrics: for callers on this host (a scraper beside the gateway) and
        signed-in admins; 403 for anyone else."""
        if not is_loopback(client_of(request) or ""):
            session = gateway.accounts.session(request.cookies.get(SESSION_COOKIE))
            if session is None or session.role != "admin":
                raise HttpError(HTTPStatus.FORBIDDEN, "The gateway's metrics are for its host and for "
                                                      "administrators; sign in as an admin to see them.")
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST,
                        headers={"Cache-Control": "no-store"})

    @router.get("/", include_in_schema=False)
    def page():
        return Response((STATIC_DIR / "index.html").read_bytes(), media_type=STATIC_TYPES[".html"],
                        headers={"Cache-Control": "no-store"})

    @router.get("/api/config", summary="The coordinator's request classes and the upload limits")
    def config(session: Session = Depends(signed_in)):
        return gateway.config(session.role)

    @router.get("/api/sites", summary="The coordinator's sites and whether each is serving")
    def sites(_session: Session = Depends(signed_in)):
        return gateway.sites()

    @router.get("/api/stats", summary="Recent completion times of one request class")
    def stats(request_class: str = Query("", alias="class", max_length=defaults.MAX_NAME_CHARS),
              _session: Session = Depends(signed_in)):
        return gateway.stats(gateway.check_class(request_class))

    @router.get("/api/image", summary="A database cell's full image (PNG)",
             response_class=Response, responses={200: {"content": {"image/png": {}}}})
    def image(request: Request, site: str = Query("", max_length=defaults.MAX_NAME_CHARS),
              cell_id: str = Query("", max_length=defaults.MAX_CELL_ID_CHARS),
              sha: str = Query("", pattern=r"^([0-9a-f]{64})?$"),
              session: Session = Depends(signed_in)):
        if not site or not cell_id:
            raise HttpError(HTTPStatus.BAD_REQUEST, "give both ?site= and ?cell_id=")
        gateway.audit.record("image", session.name, session.role, client_of(request),
                             site=site, cell_id=cell_id)
        # Named by its content hash, an image never changes: the browser keeps it.
        cache = "private, max-age=86400, immutable" if sha else "no-store"
        return Response(gateway.image(site, cell_id), media_type="image/png", headers={"Cache-Control": cache})

    return router
