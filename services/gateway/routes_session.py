"""Signing in and out: a password (throttled), a one-time link, the session and its CSRF
token; every sign-in and sign-out audited."""

from __future__ import annotations

from http import HTTPStatus

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from services.gateway.accounts import Session
from services.gateway.errors import HttpError
from services.gateway.facade import Gateway
from services.gateway.requests import LoginRequest, client_of, read_json

SESSION_COOKIE = "pathmaster_session"


def session_router(gateway: Gateway, signed_in) -> APIRouter:
    """The routes of signing in and out (`signed_in`: the session dependency)."""
    router = APIRouter()

    def session_json(session: Session) -> dict:
        return {"user": session.name, "role": session.role, "csrf": session.csrf,
                "expires": session.expires}

    def with_cookie(response: Response, token: str) -> Response:
        response.set_cookie(SESSION_COOKIE, token, max_age=int(gateway.accounts.session_s), path="/",
                            httponly=True, samesite="strict", secure=gateway.https)
        return response

    @router.post("/api/login", summary="Sign in with a name and password (sets the session cookie)",
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": LoginRequest.model_json_schema()}}}})
    async def login(request: Request):
        body = await read_json(request, LoginRequest)
        keys = (f"name:{body.name}", f"from:{client_of(request)}")
        if gateway.throttle.blocked(*keys):
            gateway.metrics.login_failures.labels("throttled").inc()
            gateway.audit.record("sign-in-throttled", body.name, None, client_of(request))
            raise HttpError(HTTPStatus.TOO_MANY_REQUESTS, "Too many failed sign-ins; wait a minute "
                                                          "and try again.")
        if not await run_in_threadpool(gateway.accounts.check_password, body.name, body.password):
            gateway.throttle.failed(*keys)
            gateway.metrics.login_failures.labels("password").inc()
            gateway.audit.record("sign-in-refused", body.name, None, client_of(request))
            raise HttpError(HTTPStatus.UNAUTHORIZED, "That name and password do not match.")
        token, session = await run_in_threadpool(gateway.accounts.start_session, body.name)
        gateway.audit.record("sign-in", session.name, session.role, client_of(request), how="password")
        return with_cookie(JSONResponse(session_json(session)), token)

    @router.get("/login/once", include_in_schema=False)
    def login_once(request: Request, token: str = Query("", max_length=128)):
        name = gateway.accounts.redeem_link(token)
        if name is None:
            gateway.metrics.login_failures.labels("link").inc()
            gateway.audit.record("sign-in-refused", None, None, client_of(request), how="link")
            return HTMLResponse("<!doctype html><title>PathMaster</title><p>This sign-in link has "
                                "been used or has expired. Ask for a new one, or "
                                "<a href=\"/\">sign in with your password</a>.</p>", status_code=400)
        token, session = gateway.accounts.start_session(name)
        gateway.audit.record("sign-in", session.name, session.role, client_of(request), how="link")
        return with_cookie(RedirectResponse("/", status_code=303), token)

    @router.get("/api/session", summary="Who is signed in, and the session's CSRF token")
    def session_info(session: Session = Depends(signed_in)):
        return session_json(session)

    @router.post("/api/logout", summary="Sign out")
    def logout(request: Request, session: Session = Depends(signed_in)):
        gateway.accounts.end_session(request.cookies.get(SESSION_COOKIE))
        gateway.staged.discard(session.name)  # the page's files go with the user
        gateway.audit.record("sign-out", session.name, session.role, client_of(request))
        response = JSONResponse({"signed_out": True})
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                               secure=gateway.https)
        return response

    return router
