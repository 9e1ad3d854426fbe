"""Provides RequestGuard: what every HTTP request must pass before any route (Host, Origin, Content-Type)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from magnitude_tui.serve.errors import ErrorType, OpenAIError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})


@dataclass(frozen=True)
class GuardPolicy:
    """`hosts`: the names a request's Host header may carry (None: any, a server bound to every
    interface, which needs a key); `origins`: browser origins allowed to call (exact
    "scheme://host[:port]" strings; "*" for any)."""

    hosts: frozenset[str] | None
    origins: frozenset[str] = frozenset()


def bound_hosts(host: str, extra: tuple[str, ...] = ()) -> frozenset[str] | None:
    """The Host names a server bound to `host` answers: the bound name, every loopback name when
    it is loopback, and `extra` (--allow-host). A page on another site that rebinds its own name
    to 127.0.0.1 (DNS rebinding) still sends its own name, and is refused."""
    if host in WILDCARD_BINDS:
        return None
    names = {host.lower().strip("[]"), *(e.lower().strip("[]") for e in extra)}
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = host.lower() == "localhost"
    return frozenset(names | (LOOPBACK_NAMES if loopback else set()))


def host_name(header: str) -> str:
    """The name in a Host header, without its port ("[::1]:8080" -> "::1")."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def is_json(content_type: str | None) -> bool:
    media = (content_type or "").partition(";")[0].strip().lower()
    return media == "application/json"


def check(policy: GuardPolicy, method: str, headers: Headers) -> OpenAIError | None:
    """Why this request is refused before any route, or None."""
    if policy.hosts is not None and host_name(headers.get("host", "")) not in policy.hosts:
        return OpenAIError(400, "this server does not answer for that Host name (start it with "
                           "--allow-host NAME to add one)", ErrorType.INVALID_REQUEST, "host_not_allowed")
    origin = headers.get("origin")
    if origin is not None and origin not in policy.origins and "*" not in policy.origins:
        # A browser page on another site: without this, any page the user opens could run
        # generations on a keyless loopback server (a text/plain POST needs no CORS preflight).
        return OpenAIError(403, "requests from web pages are refused (start the server with "
                           "--allow-origin ORIGIN to allow one)", ErrorType.INVALID_REQUEST,
                           "origin_not_allowed")
    if method == "POST" and not is_json(headers.get("content-type")):
        return OpenAIError(415, "the request body must be JSON, sent with 'Content-Type: application/json'",
                           ErrorType.INVALID_REQUEST, "unsupported_media_type")
    return None


class RequestGuard:
    """ASGI middleware: a request that fails `check` is answered in the OpenAI shape (and reported
    to `on_refused` with the caller's address) without reaching the app."""

    def __init__(self, app, *, policy: GuardPolicy,
                 on_refused: Callable[[str, OpenAIError], None] | None = None) -> None:
        self.app = app
        self.policy = policy
        self.on_refused = on_refused

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        error = check(self.policy, scope["method"], Headers(scope=scope))
        if error is None:
            await self.app(scope, receive, send)
            return
        if self.on_refused is not None:
            client = scope.get("client")
            self.on_refused(f"api@{client[0]}" if client else "api", error)
        await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
