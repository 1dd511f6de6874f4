"""colibri-serve's library: an OpenAI-compatible HTTP API over one `Engine` (FastAPI + uvicorn).

Routes: GET /v1/models, GET /v1/models/{id}, POST /v1/chat/completions, POST /v1/completions,
streamed as server-sent events (`data: {...}` … `data: [DONE]`) or answered whole. Every error
is OpenAI-shaped: {"error": {"message", "type", "param", "code"}}.

Safety: it listens on 127.0.0.1 unless told otherwise, and any other address needs an API key
(checked on every route, Bearer). A web page of another site (its Origin) is refused, and bodies
must be JSON (a page can send text/plain without the browser asking first). Bodies, prompts,
max_tokens, the queue and the connections of one address are bounded; a body that never arrives
times out (408), a connection whose next request head does not arrive in time is closed, and so is
one refused (401/403). A client that goes away mid-reply frees the engine at the next token.
Engine errors reach clients without this machine's folders; cached prompt prefixes serve only
requests with the same key (cached_tokens would otherwise reveal another caller's prompt).

The GUI's "Serve on localhost" switch calls `start(engine)` and later `handle.stop()`. A request's
fields are checked in server_requests.py, who may connect in server_guard.py, and the engine's side
(the queue, continuous batching) is server_jobs.py.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.reasoning import ThinkSplitter, is_reasoning_model, starts_inside
from app.request_log import TOKENS, RequestLog, RequestRecord
from app.server_guard import Guard, check_bind, is_loopback, protocol
from app.server_jobs import BatchScheduler, EngineThread, Job, QueueFull, Turns
from app.server_requests import (SAMPLING, UNSUPPORTED, ApiError, Limits, chat_messages, checked, constraint,
                                 error_for, number, public_text, read_json)
from engine import params as P
from engine.api import Engine, Step
from engine.errors import ColibriError

log = logging.getLogger("colibri.server")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4242  # no peer's (LM Studio 1234, llama-server 8080, Ollama 11434): all run side by side
FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}



class Service:
    """Everything a route needs: the engine, its scheduler and the limits."""

    def __init__(self, engine: Engine, limits: Limits, api_key: str | None, loopback_only: bool,
                 turns: Turns | None = None, runner: EngineThread | None = None):
        self.engine, self.limits, self.api_key, self.loopback_only = engine, limits, api_key, loopback_only
        self.model_id = engine.model.path.name
        self.created = int(time.time())
        self.scheduler = BatchScheduler(engine, limits.max_queue, turns, limits.slots, limits.prefix_cache_bytes,
                                        runner, limits.spare_idle_s)
        codec = engine.codec
        self.reasoning = is_reasoning_model(codec.template_source,
                                            lambda t: codec.tok.token_to_id(t) is not None)
        ctx = engine.context_limit
        self.max_prompt = min(limits.max_prompt_tokens or ctx - 1, ctx - 1)
        self.max_tokens = min(limits.max_tokens or ctx, ctx)

    def check_model(self, body: dict) -> None:
        model = body.get("model")
        if model is None:
            return  # one model is served: a request that names none gets it
        if not isinstance(model, str):
            raise ApiError(400, "model must be a string", param="model", code="invalid_type")
        if model != self.model_id:
            raise ApiError(404, f"the model {model[:200]!r} does not exist; this server serves "
                           f"{self.model_id!r}", param="model", code="model_not_found")

    def sampling(self, body: dict) -> tuple[dict, tuple[str, ...]]:
        """Sampling settings and stop strings of a request, each checked (400 naming the field)."""
        for name in UNSUPPORTED:
            if body.get(name) not in (None, False, [], {}):
                raise ApiError(400, f"{name} is not supported by this server", param=name, code="unsupported")
        n = number(body, "n", int)
        if n not in (None, 1):
            raise ApiError(400, f"n must be 1 (one reply per request), got {n}", param="n",
                           code="unsupported")
        out: dict[str, Any] = {}
        if "repetition_penalty" in body and "repeat_penalty" not in body:  # vLLM's name for it
            body = {**body, "repeat_penalty": body["repetition_penalty"]}
        for name in SAMPLING:
            v = number(body, name, int if P.PARAMS[name].type is int else float)
            if v is not None:
                out[name] = checked(name, v)
        spec = body.get("speculative")  # off / auto / ngram (engine.speculative)
        if spec is not None:
            if not isinstance(spec, str):
                raise ApiError(400, f"speculative must be a string, got {spec!r}"[:300], param="speculative",
                               code="invalid_type")
            out["speculative"] = checked("speculative", spec)
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        mt = number(body, key, int)
        if mt is not None:
            if mt < 1:
                raise ApiError(400, f"{key} must be at least 1, got {mt}", param=key, code="invalid_value")
            if mt > self.max_tokens:
                raise ApiError(400, f"{key} is too large: {mt}; this server allows at most {self.max_tokens} "
                               f"tokens per reply", param=key, code="invalid_value")
            out["max_tokens"] = mt
        else:
            out["max_tokens"] = min(self.engine.sampling["max_tokens"], self.max_tokens)
        out["grammar"] = constraint(body)  # (None: free text, also when the engine has a default grammar)
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
        if not isinstance(stops, list) or not all(isinstance(s, str) and 0 < len(s) <= 256 for s in stops) \
                or len(stops) > self.limits.max_stops:
            raise ApiError(400, f"stop must be a string or a list of at most {self.limits.max_stops} "
                           f"non-empty strings of up to 256 characters", param="stop", code="invalid_value")
        return out, tuple(stops)

    def check_prompt(self, prompt: str | list[dict], param: str) -> int:
        """Prompt tokens as the engine will encode them (messages: through its chat template), or
        400 when they exceed the limit. Run off the event loop."""
        try:
            count = len(self.engine.prompt_ids(prompt))
        except (ValueError, TypeError) as e:  # e.g. a lone surrogate (\ud800): JSON allows it, UTF-8 not
            why = public_text(str(e))[:200]
            raise ApiError(400, f"the prompt cannot be tokenized: {type(e).__name__}: {why}",
                           param=param, code="invalid_value") from None
        if count > self.max_prompt:
            raise ApiError(400, f"the prompt is {count} tokens; this server accepts at most "
                           f"{self.max_prompt} (the context is {self.engine.context_limit})",
                           param=param, code="context_length_exceeded")
        return count


# --- answering -------------------------------------------------------------------------------
async def _watch_disconnect(request: Request, job: Job) -> None:
    """Cancel the job when the client closes its connection (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            if not job.done.is_set():
                log.info("client disconnected: request cancelled")
            job.cancel()
            return


async def _steps(job: Job, request: Request, heartbeat_s: float | None = None) -> AsyncIterator[Step | None]:
    """The job's steps as they come, and None after each `heartbeat_s` without one (the stream
    sends a comment then, so clients and proxies see a live connection through a long prefill
    or a wait in the queue); the job is cancelled however this ends early."""
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    getter: asyncio.Future | None = None
    try:
        while True:
            getter = getter or asyncio.ensure_future(job.events.get())
            done, _ = await asyncio.wait({getter}, timeout=heartbeat_s)
            if not done:
                yield None
                continue
            item, getter = getter.result(), None
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            request.scope.setdefault("state", {})[TOKENS] = (item.prompt_tokens, item.generated_tokens)
            yield item
    finally:
        job.cancel()  # harmless when the job has finished
        watcher.cancel()
        if getter is not None:
            getter.cancel()


def _usage(step: Step) -> dict:
    return {"prompt_tokens": step.prompt_tokens, "completion_tokens": step.generated_tokens,
            "total_tokens": step.prompt_tokens + step.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": step.cached_tokens}}


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


class Reply:
    """One reply's text as it streams: split into reasoning and content for reasoning models."""

    def __init__(self, splitter: ThinkSplitter | None):
        self.splitter = splitter
        self.last: Step | None = None

    def feed(self, step: Step) -> tuple[str, str]:
        self.last = step
        if self.splitter is None:
            return "", step.text
        r, c = self.splitter.push(step.text)
        if step.finish_reason is not None:
            fr, fc = self.splitter.flush()
            r, c = r + fr, c + fc
        return r, c

    @property
    def finish_reason(self) -> str:
        return FINISH.get(self.last.finish_reason or "stop", "stop") if self.last else "stop"


async def _submit(svc: Service, request: Request, prompt: str | list[dict], sampling: dict,
                  stops: tuple) -> Job:
    # a tenant per key presented: a request reuses (and sees in cached_tokens) only the prompt
    # prefixes of requests with the same key, never the window's chats nor another key's
    key = hashlib.sha256(request.headers.get("authorization", "").encode("utf-8", "replace")).hexdigest()
    job = Job(prompt, sampling, stops, asyncio.get_running_loop(), tenant="key:" + key[:16])
    try:
        svc.scheduler.submit(job)
    except QueueFull as e:
        raise ApiError(429, f"the server is busy: {e}; retry later", kind="rate_limit_error",
                       code="queue_full") from None
    return job


async def _collect(job: Job, request: Request, reply: Reply) -> tuple[str, str]:
    reasoning, content = "", ""
    async for step in _steps(job, request):
        if step is None:
            continue
        r, c = reply.feed(step)
        reasoning, content = reasoning + r, content + c
    if reply.last is None:
        raise ApiError(503, "the server is shutting down", kind="server_error", code="shutting_down")
    return reasoning, content


def _stream(job: Job, request: Request, reply: Reply, chunk: Callable[..., dict], include_usage: bool,
            heartbeat_s: float) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        first = chunk(None)
        if first:
            yield _sse(first)
        try:
            async for step in _steps(job, request, heartbeat_s):
                if step is None:
                    yield ": keep-alive\n\n"
                    continue
                piece = chunk(reply.feed(step))
                if piece:
                    yield _sse(piece)
            if reply.last is None:
                raise ApiError(503, "the server is shutting down", kind="server_error", code="shutting_down")
            yield _sse(chunk(reply.finish_reason))
            if include_usage:
                yield _sse({**chunk(reply.finish_reason), "choices": [], "usage": _usage(reply.last)})
        except Exception as e:  # noqa: BLE001 - headers are sent: the error travels as an event
            yield _sse(error_for(e).body())
        yield _sse("[DONE]")
    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _stream_options(body: dict) -> bool:
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options", code="invalid_type")
    return bool((opts or {}).get("include_usage"))


def _stream_flag(body: dict) -> bool:
    s = body.get("stream", False)
    if not isinstance(s, bool):
        raise ApiError(400, f"stream must be true or false, got {s!r}"[:200], param="stream",
                       code="invalid_type")
    return s


async def chat_completions(svc: Service, request: Request) -> Any:
    body = await read_json(request, svc.limits)
    svc.check_model(body)
    messages = chat_messages(body)
    sampling, stops = svc.sampling(body)
    stream, include_usage = _stream_flag(body), _stream_options(body)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ApiError(400, "chat_template_kwargs must be an object", param="chat_template_kwargs",
                       code="invalid_type")
    thinking = kwargs.get("enable_thinking")  # as vLLM and llama.cpp take it
    if thinking is not None and not isinstance(thinking, bool):
        raise ApiError(400, "chat_template_kwargs.enable_thinking must be true or false",
                       param="chat_template_kwargs", code="invalid_type")
    template_vars = sampling["template_vars"] = {"enable_thinking": thinking} if thinking is not None else None
    try:
        rendered = await asyncio.to_thread(svc.engine.apply_chat_template, messages, True, template_vars)
    except (ColibriError, ValueError) as e:
        raise ApiError(400, public_text(str(e)), param="messages", code="invalid_value") from None
    await asyncio.to_thread(svc.check_prompt, messages, "messages")
    reply = Reply(ThinkSplitter(starts_inside(rendered)) if svc.reasoning else None)
    # the engine encodes the messages itself: their text stays text, only the template makes tokens
    job = await _submit(svc, request, messages, sampling, stops)
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": svc.model_id}
    if stream:
        def chunk(part: tuple[str, str] | str | None) -> dict:
            if part is None:
                return {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "finish_reason": None}]}
            if isinstance(part, str):  # the finish reason
                return {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": part}]}
            delta = {k: v for k, v in (("reasoning_content", part[0]), ("content", part[1])) if v}
            return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} if delta else {}
        return _stream(job, request, reply, chunk, include_usage, svc.limits.heartbeat_s)
    reasoning, content = await _collect(job, request, reply)
    message = {"role": "assistant", "content": content}
    if svc.reasoning:
        message["reasoning_content"] = reasoning
    return {"id": cid, "object": "chat.completion", "created": created, "model": svc.model_id,
            "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason,
                         "logprobs": None}],
            "usage": _usage(reply.last)}


async def completions(svc: Service, request: Request) -> Any:
    body = await read_json(request, svc.limits)
    svc.check_model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "prompt must be a non-empty string (token arrays and batches are not supported)",
                       param="prompt", code="invalid_value")
    sampling, stops = svc.sampling(body)
    stream, include_usage = _stream_flag(body), _stream_options(body)
    await asyncio.to_thread(svc.check_prompt, prompt, "prompt")
    reply = Reply(None)
    job = await _submit(svc, request, prompt, sampling, stops)
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    head = {"id": cid, "object": "text_completion", "created": created, "model": svc.model_id}
    if stream:
        def chunk(part: tuple[str, str] | str | None) -> dict:
            if part is None:
                return {}
            if isinstance(part, str):
                return {**head, "choices": [{"index": 0, "text": "", "logprobs": None,
                                             "finish_reason": part}]}
            return {**head, "choices": [{"index": 0, "text": part[1], "logprobs": None,
                                         "finish_reason": None}]} if part[1] else {}
        return _stream(job, request, reply, chunk, include_usage, svc.limits.heartbeat_s)
    _, text = await _collect(job, request, reply)
    return {**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                 "finish_reason": reply.finish_reason}],
            "usage": _usage(reply.last)}


# --- the application -------------------------------------------------------------------------
def create_app(engine: Engine, limits: Limits = Limits(), api_key: str | None = None,
               loopback_only: bool = True, turns: Turns | None = None,
               runner: EngineThread | None = None,
               on_request: Callable[[RequestRecord], None] | None = None) -> tuple[FastAPI, Service]:
    """The ASGI application over one engine (its scheduler's worker thread starts now); `turns`:
    the line it shares with the engine's other users (the GUI's chat); `runner`: start's."""
    svc = Service(engine, limits, api_key, loopback_only, turns, runner)
    app = FastAPI(title="Colibri", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        message = f"{request.method} {request.url.path}: {e.detail}"
        return ApiError(e.status_code, message, code=code).response()

    @app.exception_handler(Exception)
    async def _crash(request: Request, e: Exception) -> JSONResponse:
        log.exception("request failed")
        return ApiError(500, f"internal error: {type(e).__name__}", kind="server_error",
                        code="internal_error").response()

    def model_card() -> dict:
        # context_length: what a remote Colibri (app/remote.py) shows as the context it may fill
        return {"id": svc.model_id, "object": "model", "created": svc.created, "owned_by": "colibri",
                "context_length": svc.engine.context_limit}

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict:
        svc.check_model({"model": model_id})
        return model_card()

    @app.post("/v1/chat/completions")
    async def _chat(request: Request) -> Any:
        return await chat_completions(svc, request)

    @app.post("/v1/completions")
    async def _complete(request: Request) -> Any:
        return await completions(svc, request)

    app.add_middleware(Guard, api_key=svc.api_key, loopback_only=svc.loopback_only)
    if on_request is not None:
        app.add_middleware(RequestLog, sink=on_request)
    return app, svc


# --- running it ------------------------------------------------------------------------------
class ServerHandle:
    """A running server: its address, and stop()."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, svc: Service, url: str):
        self._server, self._thread, self.service, self.url = server, thread, svc, url
        self.model_id = svc.model_id

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def status(self) -> dict:
        """For a GUI label: the address, the model, whether a reply is running, how many wait."""
        sched = self.service.scheduler
        return {"url": self.url, "model": self.model_id, "busy": sched.running is not None,
                "waiting": sched.waiting}

    def wait(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is running or queued, close the connections, end the thread. The engine stays open."""
        self.service.scheduler.close(timeout)
        self._server.should_exit = True
        self._thread.join(timeout)


def start(engine_or_factory: Engine | Callable[[], Engine], host: str = DEFAULT_HOST,
          port: int = DEFAULT_PORT, api_key: str | None = None, limits: Limits = Limits(),
          log_level: str = "warning", turns: Turns | None = None, runner: EngineThread | None = None,
          on_request: Callable[[RequestRecord], None] | None = None) -> ServerHandle:
    """Serve the engine in a background thread; returns once it listens (port 0: any free port).

    The address is checked before a factory loads anything; an address in use raises OSError here.
    `turns`: the line in front of the engine's conversation cache (the GUI passes its own); the
    BatchScheduler needs none (each request has its own KV cache), and the GUI's replies join it
    while it serves (app.worker.EngineWorker.generate). `runner`: the thread the scheduler's loop
    runs on (the GUI's EngineThread: one OpenMP team), else a thread of its own. `on_request`: called
    on the server's thread with each request's record (app.request_log) once it is answered.
    """
    api_key = api_key or os.environ.get("COLIBRI_API_KEY") or None
    check_bind(host, api_key)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
        engine = engine_or_factory if isinstance(engine_or_factory, Engine) else engine_or_factory()
        app, svc = create_app(engine, limits, api_key, loopback_only=is_loopback(host), turns=turns, runner=runner,
                              on_request=on_request)
    except BaseException:
        sock.close()
        raise
    config = uvicorn.Config(app, http=protocol(limits.head_timeout_s, limits.max_connections_per_client),
                            lifespan="off", log_config=None,
                            log_level=log_level, access_log=False, limit_concurrency=limits.max_connections,
                            timeout_keep_alive=limits.keep_alive_s, timeout_graceful_shutdown=2,
                            h11_max_incomplete_event_size=64 * 1024)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="colibri-serve",
                              daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            svc.scheduler.close()
            raise OSError(f"the server on {host}:{port} did not start (see the log)")
        time.sleep(0.01)
    bound = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if family == socket.AF_INET6 else host
    url = f"http://{shown}:{bound}/v1"
    log.info("serving %s at %s%s", svc.model_id, url, " (API key required)" if api_key else "")
    return ServerHandle(server, thread, svc, url)
