"""How the gateway answers errors: `HttpError` (a status, a message for scripts, words for
the page), a failed coordinator call mapped to one, and the JSON reply of either."""

from __future__ import annotations

from http import HTTPStatus

import grpc
from fastapi.responses import JSONResponse

from services.gateway import events


class HttpError(Exception):
    """An error to answer with `status` and a JSON {"error": message}; `words`: what the
    page shows a person instead, when the message is for scripts and logs."""

    def __init__(self, status: HTTPStatus, message: str, words: str | None = None,
                 extra: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.words = words
        self.extra = extra or {}  # more fields of the JSON reply


def grpc_http_error(exc: grpc.RpcError, what: str, hint: str = "") -> HttpError:
    """Map a failed coordinator call to an HTTP error that says what failed and why
    (`hint`: what to check, appended)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    status = {grpc.StatusCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
              grpc.StatusCode.INVALID_ARGUMENT: HTTPStatus.BAD_REQUEST,
              grpc.StatusCode.DEADLINE_EXCEEDED: HTTPStatus.GATEWAY_TIMEOUT,
              }.get(code, HTTPStatus.BAD_GATEWAY)
    return HttpError(status, f"{what}: {code.name}: {detail}{hint}", events.coordinator_words(code.name))


def error_response(status: int, message: str, words: str | None = None,
                   extra: dict | None = None) -> JSONResponse:
    body = {"error": message} | ({"words": words} if words else {}) | (extra or {})
    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})
