"""Bounds on what one HTTP client can make the gateway hold: time to send a request's head,
time and bytes to send its body, and how deeply nested its JSON may be.

uvicorn bounds idle keep-alive connections (`timeout_keep_alive`) and the number of
connections (`limit_concurrency`) itself; it has no deadline for a request's head or body,
so a client that sends a few bytes and stops would keep its connection for ever.
`HeadDeadlineProtocol` closes a connection whose request head is not complete in time;
`BodyLimits` answers 413 to a body over the limit and 408 to one not complete in time.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

from services.gateway.security import refuse

MAX_REQUEST_BYTES = 64 * 1024 * 1024  # one HTTP request body at the gateway (a multipart case)
MAX_JSON_DEPTH = 8                 # how deeply a JSON request body may nest
GATEWAY_HEAD_TIMEOUT_S = 10.0  # a request's line and headers must arrive within this
GATEWAY_BODY_TIMEOUT_S = 120.0  # a request's body must be complete this long after its head
                                # (a 6-cell case is ~2 MB: over a minute only below ~0.3 Mbit/s)


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request head (request line and
    headers) has not arrived `head_timeout_s` after the connection opened or after the
    previous response ended. Set `head_timeout_s` on a subclass (see `with_head_timeout`)."""

    head_timeout_s: float = GATEWAY_HEAD_TIMEOUT_S

    def connection_made(self, transport) -> None:  # noqa: D102 - asyncio's protocol interface
        super().connection_made(transport)
        self._arm_head_deadline()

    def on_response_complete(self) -> None:  # noqa: D102
        super().on_response_complete()
        self._arm_head_deadline()

    def connection_lost(self, exc) -> None:  # noqa: D102
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        if self.transport.is_closing():
            return
        waiting_for = self.scope  # the head of the request after this one
        self._head_deadline = self.loop.call_later(self.head_timeout_s, self._head_late, waiting_for)

    def _disarm_head_deadline(self) -> None:
        handle = getattr(self, "_head_deadline", None)
        if handle is not None:
            handle.cancel()
            self._head_deadline = None

    def _head_late(self, waiting_for) -> None:
        # A new request's head has arrived when uvicorn made a new scope for it; a request
        # still being answered (a pipelined one, taken in before this deadline was armed)
        # is not cut off.
        answering = self.cycle is not None and not self.cycle.response_complete
        if self.scope is waiting_for and not answering and not self.transport.is_closing():
            self.transport.close()


def with_head_timeout(timeout_s: float) -> type[HeadDeadlineProtocol]:
    """A `HeadDeadlineProtocol` class whose head deadline is `timeout_s` seconds."""
    return type("HeadDeadline", (HeadDeadlineProtocol,), {"head_timeout_s": float(timeout_s)})


class BodyLimits:
    """ASGI middleware: a request body over `max_bytes` is answered 413 (at once when its
    Content-Length says so, else when the bytes read pass it); a body not complete
    `timeout_s` after the request's head is answered 408. Both close the connection, so
    the unread rest of the body is never taken for a request."""

    def __init__(self, app, max_bytes: int = MAX_REQUEST_BYTES,
                 timeout_s: float = GATEWAY_BODY_TIMEOUT_S):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and int(length) > self.max_bytes:  # h11 has checked it is a number
            return await refuse(send, 413, _too_large(int(length), self.max_bytes))
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        received = 0
        body_done = refused = started = False

        async def bounded_receive():
            nonlocal received, body_done, refused
            if refused:
                return {"type": "http.disconnect"}
            if body_done:  # e.g. a streaming reply listening for the client going away
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                refused = True
                if not started:
                    await refuse(send, 408, "the request's body did not arrive in time; "
                                             "check the connection and send it again")
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > self.max_bytes:
                    refused = True
                    if not started:
                        await refuse(send, 413, _too_large(received, self.max_bytes))
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message):
            nonlocal started
            if refused and not started:
                return  # the refusal has been sent: drop the app's own answer
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, bounded_receive, tracked_send)


def _too_large(size: int, limit: int) -> str:
    return (f"request of {size / 1e6:.1f} MB is over the gateway's {limit / 1e6:.0f} MB limit: "
            "send fewer or smaller files")


def json_depth(text: bytes | str) -> int:
    """How deeply arrays and objects nest in JSON `text` (0 for a scalar), counted without
    parsing it, so that a deeply nested document is refused before the parser recurses.
    Brackets inside strings are not counted."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def check_json_depth(text: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ValueError (naming the limit) when JSON `text` nests deeper than `max_depth`."""
    if json_depth(text) > max_depth:
        raise ValueError(f"the JSON nests deeper than {max_depth} levels")
