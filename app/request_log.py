"""What colibri-serve answered, one record per request, for a live log beside the server (the GUI's
server panel): method, path, status, time taken and tokens. The records are plain frozen values
handed to a callback on the server's thread; the receiver decides how they cross to its own."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TOKENS = "colibri.tokens"  # in a request's ASGI state: (prompt, generated) tokens of its reply so far


@dataclass(frozen=True)
class RequestRecord:
    at: float  # time.time() when the request came in
    method: str
    path: str
    status: int  # 0: no answer was sent (the client went away first)
    seconds: float
    prompt_tokens: int | None = None  # None: the request made no reply (a model list, an error)
    generated_tokens: int | None = None


class RequestLog:
    """ASGI middleware, outermost: every request is recorded, those the guard refuses included."""

    def __init__(self, app: Any, sink: Callable[[RequestRecord], None]):
        self.app, self.sink = app, sink

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        at, start, status = time.time(), time.perf_counter(), 0
        state = scope.setdefault("state", {})

        async def sent(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, sent)
        finally:
            prompt, generated = state.get(TOKENS, (None, None))
            self.sink(RequestRecord(at, scope["method"], scope["path"], status, time.perf_counter() - start,
                                    prompt, generated))
