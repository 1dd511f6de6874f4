"""What a request to colibri-serve may hold: its body read within the limits, its fields checked
against OpenAI's API and the engine's parameter table, and every refusal as an OpenAI-shaped error
(engine text without this machine's folders)."""
from __future__ import annotations

import asyncio
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from engine import params as P
from engine.errors import ColibriError

ROLES = ("system", "developer", "user", "assistant", "tool")
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "frequency_penalty",
            "presence_penalty")  # each checked against the engine's parameter table
UNSUPPORTED = ("tools", "functions", "logprobs", "top_logprobs", "logit_bias", "suffix", "echo", "best_of")


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, and how long the server waits for it."""
    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int | None = None  # None: the context length less one (room for the reply)
    max_tokens: int | None = None  # None: the context length
    max_queue: int = 16  # requests waiting for the engine; more get 429
    max_stops: int = 16
    body_timeout_s: float = 30.0  # a body that has not fully arrived by then gets 408
    head_timeout_s: float = 10.0  # any request head of a connection not in by then: the connection closes
    keep_alive_s: int = 5
    max_connections: int = 512  # uvicorn's limit_concurrency: more get 503
    max_connections_per_client: int = 128  # open at once from one address; more get 429
    heartbeat_s: float = 10.0  # a stream waiting this long for a token sends a comment line
    slots: int = 8  # requests decoded together (continuous batching: one forward pass per step for all)
    prefix_cache_bytes: int = 64 << 20  # KV of recent prompts, reused by one key's requests sharing their start
    spare_idle_s: float = 30.0  # the KV caches kept for the next requests are freed after this long idle


class ApiError(Exception):
    """An error the client caused (or may retry), answered in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", close: bool = False):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        # 408/413/415 leave a body unread: the connection cannot carry another request; after a
        # refused key, Host or Origin it serves no further one
        self.close = close or status in (401, 403, 408, 413, 415)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), self.status, headers={"Connection": "close"} if self.close else None)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text} is too large")
    return v


async def read_json(request: Request, limits: Limits) -> dict:
    """The body as a JSON object, within the size and time limits (413, 408, 400 otherwise).
    Only an application/json body is read (415): a web page can send text/plain to this machine
    without the browser asking first (a CORS preflight), but not JSON."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ApiError(415, f"the request body must be application/json, not {media[:100] or 'untyped'!r}",
                       code="unsupported_media_type")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise ApiError(413, f"the request body is {int(declared)} bytes; the limit is "
                       f"{limits.max_body_bytes}", code="request_too_large")
    body = bytearray()

    async def receive() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limits.max_body_bytes:
                raise ApiError(413, f"the request body exceeds {limits.max_body_bytes} bytes",
                               code="request_too_large")
    try:
        await asyncio.wait_for(receive(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {limits.body_timeout_s:g} s",
                       code="request_timeout") from None
    except ClientDisconnect:  # nobody reads the answer: this only keeps it out of the error log
        raise ApiError(400, "the client closed the connection before its request body ended",
                       code="client_disconnected") from None
    try:
        data = json.loads(bytes(body), parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, NaN, 1e999, too deep
        raise ApiError(400, f"the request body is not valid JSON: {str(e)[:200]}",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(data).__name__}",
                       code="invalid_json")
    return data


def number(body: dict, name: str, kind: type) -> Any:
    """body[name] as an int or a float, None when absent; 400 for anything else (a bool, a string,
    2.5 for an integer, an integer too large for a float)."""
    v = body.get(name)
    if v is None:
        return None
    whole = isinstance(v, int) or (isinstance(v, float) and v.is_integer())
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not whole):
        raise ApiError(400, f"{name} must be {'an integer' if kind is int else 'a number'}, got {v!r}"[:300],
                       param=name, code="invalid_type")
    try:
        return kind(v)
    except OverflowError:
        raise ApiError(400, f"{name} is out of range", param=name, code="invalid_value") from None


def checked(name: str, value: Any) -> Any:
    """A value against the engine's parameter table: the range the engine itself enforces."""
    try:
        return P.check(name, value)
    except ValueError as e:
        raise ApiError(400, str(e), param=name, code="invalid_value") from None


def constraint(body: dict) -> str | None:
    """The grammar a request's reply must fit (engine.grammar), from OpenAI's `response_format`
    ({"type": "json_object"} or {"type": "json_schema", "json_schema": {"name", "schema", "strict"}})
    or llama.cpp's `grammar` field (here llguidance's Lark dialect); compiled once here, so that a
    schema keyword llguidance does not implement is a 400 naming it, before the request queues.
    Every schema is enforced whatever `strict` says (it is checked, and changes nothing)."""
    from engine import grammar
    fmt, text = body.get("response_format"), body.get("grammar")
    if text is not None:
        if fmt not in (None, {"type": "text"}):
            raise ApiError(400, "give response_format or grammar, not both", param="grammar", code="invalid_value")
        if not isinstance(text, str) or not text.strip():
            raise ApiError(400, "grammar must be a non-empty string (llguidance's Lark grammar)", param="grammar",
                           code="invalid_type")
        param = "grammar"
    elif fmt is None:
        return None
    else:
        param = "response_format"
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            text = grammar.json_object()
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) \
                    or not isinstance(spec.get("schema", {}), dict) or not isinstance(spec.get("strict", False), bool):
                raise ApiError(400, "response_format.json_schema must be an object with a name (string), a schema "
                               "(object) and strict (true or false)", param=param, code="invalid_value")
            text = grammar.json_schema(spec.get("schema", {}))
        else:
            raise ApiError(400, "response_format.type must be text, json_object or json_schema", param=param,
                           code="invalid_value")
    try:
        return grammar.check(text)
    except grammar.GrammarError as e:
        keys = grammar.unsupported_keywords(str(e))
        if keys:
            raise ApiError(400, f"the JSON schema uses {', '.join(keys)}, which this server cannot enforce "
                           f"(unsupported keyword{'s' if len(keys) > 1 else ''})", param=param,
                           code="unsupported") from None
        raise ApiError(400, public_text(str(e))[:1000], param=param, code="invalid_value") from None


def chat_messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "messages must be a non-empty list", param="messages", code="invalid_value")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ApiError(400, f"{where} must be an object whose role is one of {', '.join(ROLES)}",
                           param=where, code="invalid_value")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ApiError(400, f"{where}.content: only text parts are supported", param=where,
                               code="unsupported")
            content = "".join(p["text"] for p in content)
        elif content is None and m["role"] == "assistant":
            content = ""
        elif not isinstance(content, str):
            raise ApiError(400, f"{where}.content must be a string or a list of text parts", param=where,
                           code="invalid_value")
        out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    return out


ABSOLUTE_PATH = re.compile(r"(?:(?<![\w.~/\\])/|\b[A-Za-z]:[\\/]|\\\\)(?:[^\s'\"\\/]+[\\/])+")


def public_text(text: str) -> str:
    """Engine text for a client: each absolute path cut to its last part (the file's name tells
    what failed; the folders around it are this machine's business)."""
    return ABSOLUTE_PATH.sub("", text)


def error_for(e: BaseException) -> ApiError:
    if isinstance(e, ApiError):
        return e
    if isinstance(e, (ColibriError, ValueError)):
        code = "context_length_exceeded" if "context" in str(e) else "invalid_value"
        return ApiError(400, public_text(str(e)), code=code)
    return ApiError(500, public_text(f"the engine failed: {type(e).__name__}: {e}"), kind="server_error",
                    code="engine_error")
