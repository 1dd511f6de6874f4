"""Remote backends: chat through any OpenAI-compatible endpoint (llama.cpp's llama-server, vLLM,
Ollama, LM Studio, another Colibri) instead of a model loaded here.

`RemoteBackend` has the face app.chat_session and the worker use for a local `Engine` — `generate()`
yielding engine `Step`s, `stats()` (a `StatsSnapshot` whose `remote` field says where the model
runs and what the endpoint reported), `set_param()`, `close()` — over the official `openai`
client, so the worker switches backends by holding one or the other.

Errors come out as `RemoteError` in plain words: unreachable, unauthorized, model not found. The
API key lives in the system keyring (service "colibri-remote", one entry per endpoint URL) and is sent
to that endpoint only; never in settings.json, never in a plain-text keyring, and COLIBRI_API_KEY is
the local server's key, never sent to an endpoint.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import threading
import time
import types
import typing
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import openai
import psutil

from engine import params as P
from engine.errors import ColibriError

log = logging.getLogger("colibri.remote")

KEYRING_SERVICE = "colibri-remote"
NO_KEY = "none"  # the client needs a string; endpoints without keys ignore it
# non-standard sampling fields, in the request body as each family names them: llama-server and
# Colibri read top_k, min_p, repeat_penalty; vLLM reads top_k, min_p, repetition_penalty
EXTRA = {"top_k": ("top_k",), "min_p": ("min_p",), "repeat_penalty": ("repeat_penalty", "repetition_penalty")}
STANDARD = ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty")
FINISH = {"stop": "stop", "length": "length"}  # anything else (content_filter, tool_calls) ends it as "stop"
BYTES_PER_TOKEN = 256  # a reply's text may take this many bytes per token asked for: an endpoint that sends
# more, or more pieces than max_tokens, is cut there (it would stream forever otherwise)


class RemoteError(ColibriError):
    """The endpoint could not be used; the message says why in plain words."""


def _response_format(text: str) -> dict:
    """A grammar that is a JSON schema, as OpenAI's response_format, which OpenAI-compatible
    endpoints read (a Lark grammar has no portable form: llama-server reads GBNF, vLLM its own)."""
    from engine.grammar import schema_of
    schema = schema_of(text)
    if schema is None:
        raise RemoteError("a remote model's reply can be held to a JSON schema only; this grammar is not one")
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}


# --- addresses and keys ----------------------------------------------------------------------
def normalize_url(url: str) -> str:
    """The API base URL: http(s)://host[:port]/path, with /v1 added when no path is given
    (llama-server, vLLM, Ollama and Colibri all serve the API under /v1)."""
    text = url.strip().rstrip("/")
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"{url!r} is not an http:// or https:// address (for example http://127.0.0.1:8080/v1)")
    if "@" in parts.netloc:  # it would be kept in the settings as it is: the key goes in the keyring
        raise RemoteError("a user name or password in the address is not kept; type the key in the API key field")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise RemoteError(f"{url!r}: the port is not a number from 1 to 65535") from None
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path or "/v1", "", ""))


def plain_http_to_another_machine(url: str) -> bool:
    """Whether a key sent to `url` crosses a network unencrypted (http, not this machine)."""
    parts = urllib.parse.urlsplit(normalize_url(url))
    if parts.scheme != "http" or parts.hostname == "localhost":
        return False
    try:
        return not ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return True  # a host name: anywhere


def _keyring():
    """The system keyring; RemoteError for one that keeps keys in a readable file (keyrings.alt's
    PlaintextKeyring, alone or in a chain)."""
    import keyring
    kr = keyring.get_keyring()
    if any("plaintext" in type(b).__name__.lower() for b in [kr, *getattr(kr, "backends", ())]):
        raise RemoteError(f"the keyring ({type(kr).__name__}) keeps keys in plain text, so the API key is not "
                          f"kept there; it is used for this session only")
    return keyring


def stored_key(url: str) -> str | None:
    """The endpoint's key from the system keyring; None when there is none or no keyring."""
    from keyring.errors import KeyringError
    try:
        return _keyring().get_password(KEYRING_SERVICE, normalize_url(url))
    except (RemoteError, KeyringError) as e:
        log.info("no key read from the keyring for %s: %s", url, e)
        return None


def store_key(url: str, key: str | None) -> None:
    """Keep (or, with an empty key, forget) the endpoint's key in the system keyring. RemoteError
    when there is no keyring: the caller keeps the key for this session only, never in a file."""
    from keyring.errors import KeyringError, PasswordDeleteError
    where, kr = normalize_url(url), _keyring()
    try:
        if key:
            kr.set_password(KEYRING_SERVICE, where, key)
        else:
            try:
                kr.delete_password(KEYRING_SERVICE, where)
            except PasswordDeleteError:
                pass  # there was none
    except KeyringError as e:
        raise RemoteError(f"the API key could not be kept in the system keyring ({e}); it is used for this "
                          f"session only") from None


def api_key(url: str, given: str | None = None) -> str | None:
    """The key to send: the one given, else the keyring's for this very endpoint."""
    return given or stored_key(url)


# --- errors in plain words -------------------------------------------------------------------
def _detail(e: BaseException) -> str:
    """The server's own message: OpenAI-shaped bodies carry it in error.message (Ollama's too)."""
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        if isinstance(inner.get("message"), str) and inner["message"]:
            return inner["message"][:500]
        if isinstance(body.get("error"), str):
            return body["error"][:500]
    return (getattr(e, "message", None) or str(e))[:500]


def explain(e: BaseException, url: str, model: str | None = None) -> RemoteError:
    """The openai client's exception as one sentence a user can act on."""
    detail = _detail(e)
    if isinstance(e, openai.APITimeoutError):
        return RemoteError(f"{url} did not answer in time: is the server overloaded, or the address wrong?")
    if isinstance(e, openai.APIConnectionError):
        cause = e.__cause__ or e
        return RemoteError(f"cannot reach {url}: {type(cause).__name__}: {str(cause) or 'connection failed'}. "
                           f"Is the server running, and is the address right?")
    if isinstance(e, (openai.AuthenticationError, openai.PermissionDeniedError)):
        return RemoteError(f"{url} refused the API key ({e.status_code} unauthorized): set the right key for "
                           f"this endpoint ({detail})")
    if isinstance(e, openai.NotFoundError):
        what = f"has no model {model!r}" if model else "has no such route (does the address end in /v1?)"
        return RemoteError(f"{url} {what}: {detail}")
    if isinstance(e, openai.RateLimitError):
        return RemoteError(f"{url} is busy (429): {detail}; try again in a moment")
    if isinstance(e, openai.APIStatusError):
        return RemoteError(f"{url} answered {e.status_code}: {detail}")
    if isinstance(e, openai.APIError):
        return RemoteError(f"{url}: {detail}")
    return RemoteError(f"{url}: {type(e).__name__}: {e}")


# --- what the endpoint serves ----------------------------------------------------------------
@dataclass(frozen=True)
class RemoteModel:
    id: str
    owned_by: str  # "llamacpp", "vllm", "library" (Ollama), "colibri", ...
    context_length: int | None  # when the endpoint says (vLLM max_model_len, llama-server meta.n_ctx_train)


def _model(card: Any) -> RemoteModel:
    extra = dict(card.model_extra or {})
    meta = extra.get("meta") if isinstance(extra.get("meta"), dict) else {}
    ctx = extra.get("max_model_len") or extra.get("context_length") or meta.get("n_ctx_train")
    return RemoteModel(card.id, str(getattr(card, "owned_by", "") or ""), int(ctx) if isinstance(ctx, int) else None)


def client_for(url: str, key: str | None, timeout: float = 600.0, connect_timeout: float = 5.0) -> openai.OpenAI:
    """The official client for the endpoint: no retries (the user sees the first error), a short
    connect timeout (an unreachable address fails in seconds) and a long read one (a long prefill)."""
    return openai.OpenAI(base_url=normalize_url(url), api_key=key or NO_KEY, max_retries=0,
                         timeout=openai.Timeout(timeout, connect=connect_timeout))


def list_models(url: str, key: str | None = None, timeout: float = 10.0) -> list[RemoteModel]:
    """The endpoint's /v1/models (key: api_key(url) when None), or RemoteError in plain words."""
    url = normalize_url(url)
    with client_for(url, api_key(url, key), timeout) as client:
        try:
            return [_model(m) for m in client.models.list()]
        except openai.OpenAIError as e:
            raise explain(e, url) from None


# --- the figures -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RemoteStats:
    """Where the model runs and what the endpoint reported (StatsSnapshot.remote)."""
    url: str
    model: str
    server: str  # the model card's owned_by
    requests: int
    errors: int
    last_error: str
    prompt_tokens: int  # the last reply's, from the endpoint's usage
    completion_tokens: int
    figures: str  # "endpoint timings" (llama-server's) or "measured here" (from the stream's arrival)

    def describe(self) -> str:
        return f"runs remotely: {self.model} at {self.url} ({self.server or 'OpenAI-compatible'})"


def _blank(cls: type, **values: Any) -> Any:
    """An instance of a frozen dataclass with every field not given set to its default, or to an
    empty value of its type (0, "", (), None, a blank nested record): a snapshot of figures a
    remote endpoint does not have."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in values or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        t = hints[f.name]
        origin = typing.get_origin(t)
        if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(t):
            values[f.name] = None
        elif dataclasses.is_dataclass(t):
            values[f.name] = _blank(t)
        else:
            values[f.name] = (origin or t)()
    return cls(**values)


# --- the backend -----------------------------------------------------------------------------
class _Think:
    """A reasoning endpoint's separate `reasoning_content` (llama-server, vLLM, Colibri) put back
    into the text as <think>…</think>, the way a local reasoning model writes it."""

    def __init__(self):
        self.inside = False

    def feed(self, delta: Any) -> str:
        reasoning = (delta.model_extra or {}).get("reasoning_content") or ""
        content = delta.content or ""
        out = ""
        if reasoning:
            out += ("" if self.inside else "<think>") + reasoning
            self.inside = True
        if content and self.inside:
            out += "</think>"
            self.inside = False
        return out + content

    def close(self) -> str:
        if not self.inside:
            return ""
        self.inside = False
        return "</think>"


def _count(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def _rate(v: Any) -> float:
    """A tokens/s figure an endpoint sent, or 0.0 for anything that is not one."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    return float(v) if ok else 0.0


class RemoteBackend:
    """A model served elsewhere, behind the local Engine's interface (see the module doc)."""
    remote = True

    def __init__(self, url: str, model: str | None = None, key: str | None = None, timeout: float = 600.0):
        self.url = normalize_url(url)
        self._key = api_key(self.url, key)
        self.client = client_for(self.url, self._key, timeout)
        try:
            served = [_model(m) for m in self.client.models.list()]
        except openai.OpenAIError as e:
            self.client.close()
            raise explain(e, self.url) from None
        if not served:
            self.client.close()
            raise RemoteError(f"{self.url} serves no model")
        chosen = served[0] if model is None else next((m for m in served if m.id == model), None)
        if chosen is None:
            self.client.close()
            raise RemoteError(f"{self.url} has no model {model!r}; it serves {', '.join(m.id for m in served)}")
        if chosen.owned_by == "llamacpp":  # its card has the training context; a slot may hold less
            chosen = dataclasses.replace(chosen, context_length=self._llama_server_context() or chosen.context_length)
        self.card, self.models = chosen, served
        self.model_id = chosen.id
        self.sampling = P.defaults("sampling")
        self._counts = {"requests": 0, "errors": 0}
        self._last: dict[str, Any] = {"prefill_tok_s": 0.0, "decode_tok_s": 0.0, "ttft_s": 0.0}
        self._usage = (0, 0, 0)  # prompt, completion, cached tokens of the last reply
        self._totals = {"prefilled": 0, "generated": 0, "reused": 0}
        self.last_error, self.figures = "", "measured here"

    def _llama_server_context(self) -> int | None:
        """llama-server's context per slot (its /props: what a reply may fill), when it answers."""
        root = self.url[:-3] if self.url.endswith("/v1") else self.url
        try:
            props = self.client.get(f"{root}/props", cast_to=object)
            n = props.get("default_generation_settings", {}).get("n_ctx") if isinstance(props, dict) else None
        except openai.OpenAIError as e:
            log.info("%s/props did not answer: %s", root, e)
            return None
        return int(n) if isinstance(n, int) and n > 0 else None

    @property
    def context_limit(self) -> int:
        return self.card.context_length or 0

    # --- the Engine's face -------------------------------------------------------------------
    def set_param(self, name: str, value: Any) -> None:
        """Sampling settings become this backend's defaults; engine settings (threads, caches…)
        belong to the remote server and apply to the next local model only."""
        value = P.check(name, value)
        if P.PARAMS[name].scope == "sampling":
            self.sampling[name] = value
        else:
            log.info("%s applies to a local model; %s runs on %s", name, self.model_id, self.url)

    def reset(self) -> None:
        """Nothing to forget here: the endpoint keeps (or not) its own prompt cache."""

    def warmup(self) -> float:
        return 0.0

    def mem_pool_defrag(self) -> int:
        return 0

    def prompt_ids(self, prompt: str | list[dict]) -> list[int]:
        raise RemoteError(f"{self.url} does not count tokens for Colibri (OpenAI's API has no tokenizer route)")

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RemoteBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, prompt: str | list[dict], stop: Sequence[str], sampling: dict[str, Any]) -> dict[str, Any]:
        values = self.sampling | {k: P.check(k, v) for k, v in sampling.items()}
        most = min(values["max_tokens"], self.context_limit or values["max_tokens"])  # no reply outgrows the context
        body: dict[str, Any] = {"model": self.model_id, "stream": True, "max_tokens": most,
                                "stream_options": {"include_usage": True}}
        body |= {k: values[k] for k in STANDARD if values.get(k) is not None}
        if stop:
            body["stop"] = list(stop)
        body["extra_body"] = {name: values[k] for k, names in EXTRA.items() for name in names
                              if values.get(k) is not None}
        body["messages" if isinstance(prompt, list) else "prompt"] = prompt
        if values.get("grammar") is not None:
            body["response_format"] = _response_format(values["grammar"])
        return body

    def generate(self, prompt: str | list[dict], stop: Sequence[str] = (), *, prompt_progress: bool = False,
                 cancel: threading.Event | None = None, template_vars: dict | None = None, resume: str = "",
                 **sampling: Any) -> Iterator[Step]:
        """Stream a reply from the endpoint: chat messages (its chat template) or raw text. `cancel`
        closes the connection at once, which frees the endpoint's slot; the last Step says
        "cancelled" then. Raises RemoteError (in plain words) for a request that fails. The API has
        no template switches nor a way to go on with a reply: `template_vars` and `resume` go unsaid."""
        body = self._request(prompt, stop, sampling)
        self._counts["requests"] += 1
        chat, t0 = "messages" in body, time.perf_counter()  # the first token's wait includes the headers'
        try:
            api = self.client.chat.completions if chat else self.client.completions
            stream = api.create(**body)
        except openai.OpenAIError as e:
            raise self._failed(e) from None
        return self._steps(stream, chat, cancel, t0, body["max_tokens"])

    def _failed(self, e: BaseException) -> ColibriError:
        """The error to raise; a prompt the endpoint's context cannot hold is the engine's own
        ContextOverflowError, on which app.chat_session cuts the chat as its context policy says."""
        from engine.api import ContextOverflowError
        self._counts["errors"] += 1
        err = explain(e, self.url, self.model_id)
        self.last_error = str(err)
        code, kind = getattr(e, "code", None), (getattr(e, "body", None) or {}).get("type") \
            if isinstance(getattr(e, "body", None), dict) else None
        if isinstance(e, openai.BadRequestError) and (code == "context_length_exceeded"
                                                       or kind == "exceed_context_size_error"):
            return ContextOverflowError(str(err))
        return err

    def _steps(self, stream: Any, chat: bool, cancel: threading.Event | None, t0: float,
               most: int) -> Iterator[Step]:
        from engine.api import Step
        t_first, generated, think, size, overrun = None, 0, _Think(), 0, False
        usage, finish, timings = None, None, None
        done = threading.Event()

        def cancelled() -> bool:
            return cancel is not None and cancel.is_set()

        def watch() -> None:  # closes the connection when Stop is pressed mid-read (a long prefill too)
            while not done.wait(0.05):
                if cancelled():
                    stream.close()
                    return
        watcher = threading.Thread(target=watch, name="colibri-remote-cancel", daemon=True)
        watcher.start()

        def step(piece: str, finish_reason: str | None) -> Step:
            now = time.perf_counter()
            ttft = (t_first or now) - t0
            rate = (generated - 1) / max(now - t_first, 1e-9) if t_first is not None and generated > 1 else 0.0
            if finish_reason is None:
                return Step(piece, None, generated, 0, 0, 0.0, rate, ttft, generated, self.context_limit)
            p, c, cached = self._usage
            last = self._last
            return Step(piece, None, c or generated, p, cached, last["prefill_tok_s"], last["decode_tok_s"],
                        last["ttft_s"], p + (c or generated), self.context_limit, finish_reason)
        try:
            try:
                for chunk in stream:
                    if cancelled() or overrun:
                        break  # between chunks; the watcher ends a read that waits
                    if chunk.usage is not None:
                        usage = chunk.usage
                    extra = chunk.model_extra or {}
                    timings = extra.get("timings") or timings  # llama-server's own figures
                    for choice in chunk.choices[:1]:
                        piece = think.feed(choice.delta) if chat else (choice.text or "")
                        if choice.finish_reason is not None:
                            finish = FINISH.get(choice.finish_reason, "stop")
                            piece += think.close()
                        if piece and choice.finish_reason is None and (
                                generated >= most or size + len(piece.encode()) > most * BYTES_PER_TOKEN):
                            log.warning("%s sent more than the %d tokens asked for: the reply is cut there",
                                        self.url, most)
                            finish, overrun = "length", True
                            break
                        if piece:
                            if t_first is None:
                                t_first = time.perf_counter()
                            generated, size = generated + 1, size + len(piece.encode())
                            yield step(piece, None)
            except Exception as e:  # noqa: BLE001 - closing the stream from the watcher ends the read too
                if not cancelled():
                    raise self._failed(e) from None
            stopped = cancelled()
            self._account(usage, timings, generated, t0, t_first)
            yield step("", "cancelled" if stopped and finish is None else finish or "stop")
        finally:
            done.set()
            stream.close()

    def _account(self, usage: Any, timings: Any, generated: int, t0: float, t_first: float | None) -> None:
        """The last reply's figures: the endpoint's usage and timings where it sends them, else
        what the stream's arrival times say."""
        p = c = cached = 0
        if usage is not None:  # the endpoint's word: counts that are not counts are left out
            p, c = _count(getattr(usage, "prompt_tokens", 0)), _count(getattr(usage, "completion_tokens", 0))
            cached = _count(getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", 0))
        now = time.perf_counter()
        ttft = (t_first or now) - t0
        n = c or generated
        decode = (n - 1) / max(now - t_first, 1e-9) if t_first is not None and n > 1 else 0.0
        prefill = (p - cached) / max(ttft, 1e-9) if p else 0.0
        self.figures = "measured here"
        if isinstance(timings, dict) and _rate(timings.get("predicted_per_second")):
            decode = _rate(timings["predicted_per_second"])
            prefill = _rate(timings.get("prompt_per_second")) or prefill
            cached = _count(timings.get("cache_n")) or cached
            self.figures = "endpoint timings"
        self._usage = (p, c, cached)
        self._last = {"prefill_tok_s": prefill, "decode_tok_s": decode, "ttft_s": ttft}
        self._totals["prefilled"] += max(p - cached, 0)
        self._totals["generated"] += n
        self._totals["reused"] += cached

    def stats(self) -> StatsSnapshot:
        """A StatsSnapshot: the endpoint's figures where it has them, empty ones for what only a
        local engine has (expert cache, memory pool); `remote` says where the model runs."""
        from engine.api import StatsSnapshot
        p, c, _ = self._usage
        info = RemoteStats(self.url, self.model_id, self.card.owned_by, self._counts["requests"],
                           self._counts["errors"], self.last_error, p, c, self.figures)
        host = urllib.parse.urlsplit(self.url).netloc
        return _blank(StatsSnapshot, model=self.model_id, architecture=f"remote at {host}",
                      context_used=p + c, context_limit=self.context_limit, kv_cache_kind="remote",
                      rss_bytes=psutil.Process().memory_info().rss, tokens_prefilled=self._totals["prefilled"],
                      tokens_generated=self._totals["generated"], tokens_reused=self._totals["reused"],
                      expert_cache_plan="the model runs remotely", params=dict(self.sampling), remote=info,
                      **self._last)


if typing.TYPE_CHECKING:
    from engine.api import StatsSnapshot, Step
