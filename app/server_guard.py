"""Who may talk to colibri-serve, and for how long: the API key, the Host and Origin checks (a web
page of another site, or one reached by DNS rebinding, gets nothing), the connections one address
may hold, and how long a connection may take to send its next request head."""
from __future__ import annotations

import hmac
import ipaddress
from typing import Any
from urllib.parse import urlsplit

from uvicorn.protocols.http.h11_impl import H11Protocol

from app.server_requests import ApiError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")
OVER_LIMIT = "colibri.connections_over_limit"  # in a request's ASGI state: its address has too many open


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _loopback_origin(origin: str) -> bool:
    try:
        return is_loopback(urlsplit(origin).hostname or "")
    except ValueError:  # "http://[x" and the like
        return False


class Guard:
    """ASGI middleware in front of every route: the API key (Bearer) when one is set, and on a
    loopback-only server a Host check (a web page cannot reach it by DNS rebinding); a request a
    browser sends for a page of another site (its Origin) is refused whatever the key."""

    def __init__(self, app: Any, api_key: str | None, loopback_only: bool):
        self.app, self.api_key, self.loopback_only = app, api_key, loopback_only

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            limit = scope.get("state", {}).get(OVER_LIMIT)
            error = self._check(dict(scope["headers"])) if limit is None else ApiError(
                429, f"this address has {limit} connections open (the limit); close one or retry later",
                kind="rate_limit_error", code="too_many_connections", close=True)
            if error is not None:
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, headers: dict[bytes, bytes]) -> ApiError | None:
        origin = headers.get(b"origin")
        if origin is not None and not _loopback_origin(origin.decode("latin-1")):
            return ApiError(403, f"this server does not answer web pages of other sites (Origin "
                            f"{origin.decode('latin-1')[:100]!r})", code="forbidden_origin")
        if self.api_key is not None:
            given = headers.get(b"authorization", b"").decode("latin-1")
            token = given[7:].strip() if given[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(token.encode("utf-8", "replace"), self.api_key.encode()):
                return ApiError(401, "a valid API key is required: send the header "
                                "'Authorization: Bearer KEY'", code="invalid_api_key")
        elif self.loopback_only:
            host = headers.get(b"host", b"").decode("latin-1")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if not is_loopback(name):
                return ApiError(403, f"this server only answers requests addressed to localhost, not "
                                f"{host[:100]!r}", code="forbidden_host")
        return None


def protocol(head_timeout_s: float, per_client: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose next request head has not arrived within
    `head_timeout_s` of the previous reply (uvicorn waits for ever on a head begun and never
    finished, and counts that connection against its limit: a few hundred of them shut every
    client out), and answering 429 to a client address with `per_client` connections open."""
    open_by_address: dict[str, int] = {}

    class Protocol(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._address = self.client[0] if self.client else ""
            self._counted = open_by_address.get(self._address, 0) < per_client
            if self._counted:
                open_by_address[self._address] = open_by_address.get(self._address, 0) + 1
            else:  # its request is answered 429 (Guard), and the connection closed
                self.app_state = {**self.app_state, OVER_LIMIT: per_client}
            self._head_timer = self.loop.call_later(head_timeout_s, self._late_head, None)

        def on_response_complete(self) -> None:
            done = self.cycle
            super().on_response_complete()  # (a request sent meanwhile begins now: a new cycle)
            self._head_timer.cancel()  # the next request's head is due within head_timeout_s from now
            self._head_timer = self.loop.call_later(head_timeout_s, self._late_head, done)

        def _late_head(self, cycle: Any) -> None:
            if self.cycle is cycle and not self.transport.is_closing():  # no request began since
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_timer.cancel()
            if self._counted:
                left = open_by_address[self._address] - 1
                if left:
                    open_by_address[self._address] = left
                else:
                    del open_by_address[self._address]
                self._counted = False
            super().connection_lost(exc)
    return Protocol


def check_bind(host: str, api_key: str | None) -> None:
    if not is_loopback(host) and not api_key:
        raise ValueError(f"listening on {host} (not this machine only) needs an API key: pass --api_key KEY "
                         f"or set COLIBRI_API_KEY")
