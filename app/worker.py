"""The engine's worker: one QObject per engine, living on its own QThread.

Requests come in as queued signals (its slots), results go out as signals. The bodies are plain
functions — `check_fit`, `open_engine`, `stream_reply`, `import_model` — that tests call
directly, without threads; a reply is app.chat_session's. Stop and cancel are `threading.Event`s
set from the GUI thread and read by the engine, so the GUI thread never touches it.
"""
from __future__ import annotations

import logging
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psutil
from PySide6.QtCore import QObject, QTimer, Signal, Slot

from app import model_library
from app.chat_session import (DEFAULT_POLICY, ChatSession, ContextFullError, Reply, prompt_progress,  # noqa: F401
                               reasoning_of, stream)
from app.model_library import ensure_default_model
from app.paths import models_dir
from app.server_jobs import EngineThread, Turns
from engine import params as P
from engine.errors import ColibriError, ConversionCancelled
from engine.cache_plan import plan_expert_cache
from engine.model_dir import open_model_dir

log = logging.getLogger("colibri.app")

FRAME_S = 1 / 60  # tokens are batched: at most one text signal per frame
PROGRESS_S = 0.05  # conversion progress: at most 20 signals a second
STATS_MS = 500  # the dashboard's fixed rate: one StatsSnapshot every half second while it watches
CONTEXT_POLICY = "_context_policy"  # a reply's option beside its sampling (generate): the chat's policy
TEMPLATE_VARS, RESUME = "_template_vars", "_resume"  # a reply's options, beside its sampling (generate)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


class ModelTooLargeError(ColibriError):
    """The pre-flight check says the model will not fit in the memory that is free."""

    def __init__(self, report: FitReport):
        super().__init__(report.explain())
        self.report = report


@dataclass(frozen=True)
class FitReport:
    model: str
    weights_bytes: int
    kv_cache_bytes: int
    expert_cache_bytes: int
    available_bytes: int

    @property
    def needed_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.expert_cache_bytes

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.available_bytes

    def explain(self) -> str:
        gb = _gb
        parts = [f"the model's weights {gb(self.weights_bytes)}",
                 f"the conversation memory (KV cache) {gb(self.kv_cache_bytes)}"]
        if self.expert_cache_bytes:
            parts.append(f"the expert cache {gb(self.expert_cache_bytes)}")
        return (f"{self.model} needs about {gb(self.needed_bytes)} of memory ({', '.join(parts)}), "
                f"but only {gb(self.available_bytes)} is free. Close other programs, lower the context "
                f"length, or store the KV cache as int8 in Settings.")


def _plan(model_path: str | Path, params: dict[str, Any], available: int | None):
    """The model and the engine's memory plan for it with these settings (check_fit, fit_text)."""
    model = open_model_dir(model_path)
    ctx = min(params.get("context_length") or P.PARAMS["context_length"].default, model.config.max_position_embeddings)
    return model, plan_expert_cache(model, params, ctx, available)


def check_fit(model_path: str | Path, params: dict[str, Any], available: int | None = None) -> FitReport:
    """Weights + KV cache + expert cache, as the engine will plan them, against the memory free now."""
    model, plan = _plan(model_path, params, available)
    return FitReport(model.path.name, plan.resident_bytes, plan.kv_bytes, plan.cache_bytes, plan.available)


def fit_text(model_path: str | Path, params: dict[str, Any], available: int | None = None) -> str:
    """One line for the settings dialog: what the model needs with these settings, and whether it fits."""
    model, plan = _plan(model_path, params, available)
    need, gb = plan.resident_bytes + plan.kv_bytes + plan.cache_bytes, _gb
    verdict = "fits" if need <= plan.available else "does not fit: lower the expert cache or the context"
    experts = f" · expert cache: {plan.reason}" if model.config.num_experts > 1 else ""
    return (f"{model.path.name} needs {gb(need)} with these settings (weights {gb(plan.resident_bytes)}, KV cache "
            f"{gb(plan.kv_bytes)}, experts {gb(plan.cache_bytes)}); {gb(plan.available)} is free: it {verdict}"
            f"{experts}")


def model_sampling(model_path: str | Path) -> dict[str, Any]:
    """The sampling a model recommends (kept by the converter); {} for one that says nothing."""
    gen = open_model_dir(model_path).meta.get("generation")
    return {k: v for k, v in gen.items() if k in P.PARAMS and P.PARAMS[k].scope == "sampling"} \
        if isinstance(gen, dict) else {}


def open_engine(model_path: str | Path, params: dict[str, Any], force: bool = False,
                stage: Callable[[str], None] = lambda s: None):
    """A warmed-up Engine, after the fit check (skipped with `force`)."""
    from engine.api import Engine
    stage("checking memory")
    report = check_fit(model_path, params)
    if not force and not report.fits:
        raise ModelTooLargeError(report)
    stage("opening the weights")
    engine = Engine(model_path, **{k: v for k, v in params.items() if P.PARAMS[k].scope == "engine"})
    stage("compiling kernels (the first time takes a while)")
    engine.warmup()
    return engine


def stream_reply(engine, messages: list[dict], sampling: dict[str, Any], stop: threading.Event,
                 emit: Callable[[str, Any], None], frame_s: float = FRAME_S,
                 clock: Callable[[], float] = time.perf_counter, template_vars: dict | None = None,
                 resume: str = "", policy: str = DEFAULT_POLICY, scheduler: Any = None) -> Reply:
    """A reply written by app.chat_session, its text emitted at most once per frame."""
    chat = ChatSession(engine, messages, policy, template_vars, scheduler)
    stream(chat.answer(stop, resume, **sampling), emit, frame_s, clock, chat.reply.text)
    return chat.reply


def throttled(emit: Callable[..., None]) -> Callable[..., None]:
    """`emit(fraction, ...)` at most once per PROGRESS_S, and always at the end."""
    last = [0.0]

    def send(fraction: float, *rest: Any) -> None:
        now = time.perf_counter()
        if now - last[0] >= PROGRESS_S or fraction >= 1.0:
            last[0] = now
            emit(fraction, *rest)
    return send


def _remote(engine) -> bool:
    return bool(getattr(engine, "remote", False))


def import_model(source: str | Path, progress: Callable[[float, str], None],
                 cancel: threading.Event) -> Path:
    """Convert a GGUF file or Hugging Face folder into the models folder (once)."""
    from engine.convert.convert import convert
    src, library = Path(source), models_dir()
    done = model_library.converted_from(library, src)
    if done is not None:
        return done
    target = library / model_library.library_name(library, src, src.stem if src.is_file() else src.name)
    convert(src, target, force=True, progress=lambda p: progress(p.fraction, p.tensor), cancel=cancel)
    model_library.record_source(target, src)
    return target


@dataclass(frozen=True)
class DefragResult:
    """What one mem_pool_defrag did: bytes the pool gave back and the process RSS around it."""
    returned_bytes: int
    rss_before: int
    rss_after: int

    @property
    def rss_change(self) -> int:
        return self.rss_after - self.rss_before


def defrag(engine) -> DefragResult:
    rss = psutil.Process().memory_info
    before = rss().rss
    returned = engine.mem_pool_defrag()
    return DefragResult(returned, before, rss().rss)


class EngineWorker(QObject):
    """Owns one Engine. Move it to a QThread; call its slots only through queued signals."""
    stage = Signal(str)  # what loading is doing now
    progress = Signal(float, str)  # conversion: fraction done, tensor name
    converted = Signal(str)  # the model folder a conversion produced
    loaded = Signal(object)  # StatsSnapshot of the new engine
    model_defaults = Signal(str, dict)  # model folder, its own sampling defaults (sent just before `loaded`)
    reasoning = Signal(str, bool, bool)  # model folder, it reasons, its template can switch thinking (before `loaded`)
    wont_fit = Signal(object, str)  # FitReport, model path (the GUI may ask to load anyway)
    text = Signal(int, str, object)  # request id, batched text, latest Step
    finished = Signal(int, object)  # request id, Reply
    counted = Signal(int, int)  # conversation id, tokens its prompt takes in the loaded model's context
    planned = Signal(str, int, object)  # "chat" or "draft", conversation id, ContextPlan of its next prompt
    attachment_counted = Signal(int, int)  # attachment key, tokens its text takes in a message
    fit_explained = Signal(str)  # fit_text of the settings being edited
    stats = Signal(object)  # StatsSnapshot
    defragged = Signal(object)  # DefragResult
    failed = Signal(str, str)  # what was being done, the specific error
    cancelled = Signal(str)  # a conversion was cancelled: what it was converting
    picked = Signal(str)  # the first candidate model folder that opens, or "" (pick)
    served = Signal(str, str)  # the local server's address ("" when it is off), why it is off ("" if asked)
    request_logged = Signal(object)  # app.request_log.RequestRecord: a request the server answered
    slowed = Signal(str)  # why decode is slow now (other programs take the CPU), "" once it is over
    remote_ready = Signal(object)  # StatsSnapshot (its .remote set): chat now goes to a remote endpoint

    def __init__(self):
        super().__init__()
        self.engine = None
        self.server = None  # app.server.ServerHandle while "Serve on localhost" is on
        self._serve_port, self._serve_key = 0, ""
        self.turns = Turns()  # replies on the conversation cache: one at a time (a SerialScheduler's jobs too)
        # every parallel kernel of this worker's engine runs on this one thread (a load's warm-up, a
        # reply, the server's batched steps while it serves): one OpenMP team, not the QThread's beside
        # the scheduler's (app.server_jobs.EngineThread says why)
        self.runner = EngineThread()
        self._stop = threading.Event()
        self._cancel = threading.Event()
        self.stats_timer: QTimer | None = None  # made on the worker's thread by watch_stats
        self._stats_ms, self._stats_at = 0, 0.0
        from app.slowdown import SlowdownWatch
        from engine.contention import OtherLoad
        self.others_load = OtherLoad()  # CPUs other programs use, sampled at most once a second while decoding
        self.watch = SlowdownWatch(self.others_load.cpus)
        self._others: float | None = None
        self._busiest: float | None = None  # the most CPUs other programs used during this reply
        self._load_at = 0.0

    # --- thread-safe controls (plain methods, callable from the GUI thread) -----------------
    def arm(self) -> None:
        """Clear stop and cancel *before* a request is queued, so an early Stop still counts."""
        self._stop.clear()
        self._cancel.clear()

    def request_stop(self) -> None:
        self._stop.set()

    def want_stats(self, interval_ms: int) -> None:
        """Thread-safe: snapshots every `interval_ms` between a reply's tokens from now on (0 stops)."""
        self._stats_ms = max(0, int(interval_ms))

    def request_cancel(self) -> None:
        self._cancel.set()

    def _fail(self, what: str, e: BaseException) -> None:
        log.error("%s failed: %s\n%s", what, e, traceback.format_exc())
        kind = "" if isinstance(e, ColibriError) else f"{type(e).__name__}: "
        self.failed.emit(what, f"{kind}{e}")

    # --- slots (run on the worker thread) ---------------------------------------------------
    @Slot(list)
    def pick(self, candidates: list) -> None:
        """Model folders are opened here, never on the GUI thread (a model has hundreds of files)."""
        from app.model_library import first_valid
        self.picked.emit(first_valid([str(c) for c in candidates]))

    @Slot(str, dict, bool)
    def load(self, path: str, params: dict, force: bool) -> None:
        try:
            if not force:  # before the loaded model is let go: a model that won't fit changes nothing
                self.stage.emit("checking memory")
                report = check_fit(path, params)
                if not report.fits:
                    self.wont_fit.emit(report, path)
                    return
            serving = self.server is not None
            self._stop_server()  # the server never outlives the engine it serves
            if self.engine is not None:
                self.engine.close()
                self.engine = None
            self.engine = self.runner.call(lambda: open_engine(path, params, True, self.stage.emit))
            self.model_defaults.emit(path, model_sampling(path))
            self.reasoning.emit(path, *reasoning_of(self.engine))
            self.loaded.emit(self.engine.stats())
            if serving:  # the switch stays on: the new model is served at the same address
                self.serve(True, self._serve_port, self._serve_key)
        except Exception as e:  # noqa: BLE001 - every failure becomes a dialog with its message
            self._fail(f"Loading {Path(path).name}", e)

    @Slot(str)
    def convert(self, source: str) -> None:
        """Convert `source` (a GGUF file or HF folder; "" = the default model) into the library."""
        progress = throttled(self.progress.emit)
        try:
            if source:
                path = import_model(source, progress, self._cancel)
            else:
                path = ensure_default_model(lambda p: progress(p.fraction, p.tensor), self._cancel.is_set)
            self.converted.emit(str(path))
        except ConversionCancelled:
            self.cancelled.emit(source)
        except Exception as e:  # noqa: BLE001
            self._fail(f"Converting {Path(source).name if source else 'the default model'}", e)

    @Slot(int, list, dict)
    def generate(self, request: int, messages: list, sampling: dict) -> None:
        """`sampling` may carry the reply's own options: TEMPLATE_VARS, RESUME and CONTEXT_POLICY."""
        sampling = dict(sampling)
        options = {"template_vars": sampling.pop(TEMPLATE_VARS, None), "resume": sampling.pop(RESUME, ""),
                   "policy": sampling.pop(CONTEXT_POLICY, DEFAULT_POLICY)}
        if self.engine is None:
            self.failed.emit("Generating a reply", "no model is loaded: pick one in the model list")
            self.finished.emit(request, Reply("", None, 0))
            return
        def emit(text: str, step: Any) -> None:
            self.text.emit(request, text, step)
            self._watch(step)
            if self._stats_ms and time.perf_counter() - self._stats_at >= self._stats_ms / 1000:
                self.poll_stats()  # the timer cannot tick while this thread generates
        self.watch.start_reply()
        self._sample_load()  # the reply's load is measured from here
        self._busiest = None
        try:
            if self.server is not None:  # serving: the reply joins the served requests' decode steps
                reply = stream_reply(self.engine, messages, sampling, self._stop, emit,
                                     scheduler=self.server.service.scheduler, **options)
            else:
                with self.turns.turn(self._stop) as mine:  # Turns: a SerialScheduler's job first, if any
                    reply = self.runner.call(lambda: stream_reply(self.engine, messages, sampling, self._stop, emit,
                                                                  **options)) if mine else Reply("", None, 0)
            self._sample_load()
            if reply.step is not None and self.watch.active is None and not _remote(self.engine):
                # a quiet reply teaches the model's speed
                self.watch.learn(str(self.engine.model.path), reply.step.decode_tok_s, reply.step.generated_tokens,
                                 self._busiest)
        except Exception as e:  # noqa: BLE001
            self._fail("Generating a reply", e)
            reply = Reply("", None, 0)
        self.finished.emit(request, reply)
        if self.engine is not None:
            self.stats.emit(self.engine.stats())

    def _sample_load(self) -> float | None:
        self._others, self._load_at = self.others_load(), time.perf_counter()
        if self._others is not None:
            self._busiest = max(self._busiest or 0.0, self._others)
        return self._others

    def _watch(self, step: Any) -> None:
        """Decode far below this model's speed while other programs take the CPU: said, and fewer threads."""
        if step is None or getattr(step, "kind", "token") != "token" or self.engine is None or _remote(self.engine):
            return
        now = time.perf_counter()
        rate = self.watch.rate(now, step.generated_tokens)
        if now - self._load_at < 1.0:
            return
        said = self.watch.react(self.engine.hw.governor, str(self.engine.model.path), rate, self._sample_load())
        if said is not None:
            self.slowed.emit(said)

    @Slot(str, str, str)
    def connect_remote(self, url: str, model: str, key: str) -> None:
        """Chat through an OpenAI-compatible endpoint ("" model: its first); the local model goes only
        once the endpoint answers, and the local server stops."""
        from app.remote import RemoteBackend
        try:
            backend = RemoteBackend(url, model or None, key or None)
        except Exception as e:  # noqa: BLE001 - unreachable, unauthorized, no such model: a dialog
            self._fail(f"Connecting to {url}", e)
            return
        if self.server is not None:
            self._stop_server()
            self.served.emit("", "")
        if self.engine is not None:
            self.engine.close()
        self.engine = backend
        self.remote_ready.emit(backend.stats())

    @Slot(int, list)
    @Slot(int, list, str, str)
    @Slot(int, list, str, str, dict)
    def count_context(self, conversation: int, messages: list, policy: str = DEFAULT_POLICY,
                      what: str = "chat", template_vars: dict | None = None) -> None:
        """How much of the context this conversation's next prompt takes under its policy: `counted` (the
        meter) and `planned` (what would be left out, or for a "draft" the warning before sending)."""
        if self.engine is None or _remote(self.engine):  # an endpoint counts in its replies
            return
        try:
            plan = ChatSession(self.engine, messages, policy, template_vars or None).plan()  # as a reply is written
        except Exception as e:  # noqa: BLE001 - a meter that cannot count says so, nothing else
            log.warning("counting the context of conversation %d: %s", conversation, e)
            return
        if what == "chat":
            self.counted.emit(conversation, plan.tokens)
        self.planned.emit(what, conversation, plan)

    @Slot(int, str)
    def count_attachment(self, key: int, text: str) -> None:
        """Tokens an attached file's text adds to a message (what its chip shows)."""
        if self.engine is None:
            return
        try:
            with_file = self.engine.prompt_ids([{"role": "user", "content": text}])
            empty = self.engine.prompt_ids([{"role": "user", "content": ""}])
        except Exception as e:  # noqa: BLE001
            log.warning("counting an attachment: %s", e)
            return
        self.attachment_counted.emit(key, max(0, len(with_file) - len(empty)))

    @Slot(str, dict, int)
    def explain_fit(self, model_path: str, params: dict, extra: int) -> None:
        """The settings dialog's "what fits" line; `extra`: memory the loaded model holds now."""
        from engine.sysmem import available_memory
        try:
            self.fit_explained.emit(fit_text(model_path, params, available_memory() + extra))
        except (ColibriError, OSError, ValueError) as e:
            self.fit_explained.emit(str(e))

    @Slot(str, object)
    def set_param(self, name: str, value: Any) -> None:
        try:
            if self.engine is not None:
                self.engine.set_param(name, value)
                self.stats.emit(self.engine.stats())
        except Exception as e:  # noqa: BLE001
            self._fail(f"Setting {name}", e)

    @Slot(int)
    def watch_stats(self, interval_ms: int) -> None:
        """A StatsSnapshot every `interval_ms` (0 stops): the named timer idle, between tokens busy."""
        if self.stats_timer is None:
            self.stats_timer = QTimer(self, objectName="stats_timer")
            self.stats_timer.timeout.connect(self.poll_stats)
        self._stats_ms = max(0, interval_ms)
        if self._stats_ms:
            self.stats_timer.start(self._stats_ms)
            self.poll_stats()
        else:
            self.stats_timer.stop()

    @Slot()
    def poll_stats(self) -> None:
        self._stats_at = time.perf_counter()
        if self.engine is not None:
            try:
                self.stats.emit(self.engine.stats())
            except Exception as e:  # noqa: BLE001 - said once, then the timer stops
                self.watch_stats(0)
                self._fail("Reading the engine's figures", e)

    @Slot()
    def defrag(self) -> None:
        if self.engine is None:
            self.failed.emit("Defragmenting the memory pool", "no model is loaded")
            return
        try:
            self.defragged.emit(defrag(self.engine))
            self.stats.emit(self.engine.stats())
        except Exception as e:  # noqa: BLE001
            self._fail("Defragmenting the memory pool", e)

    @Slot(bool, int, str)
    def serve(self, on: bool, port: int, key: str = "") -> None:
        """The GUI's "Serve on localhost": colibri-serve's API over this engine on 127.0.0.1, or with
        `key` (the API key clients must send) on every interface, for the local network. While it
        serves, the chat's replies decode in the server's steps beside the served requests."""
        self._stop_server()
        if not on:
            self.served.emit("", "")
            return
        if self.engine is None:
            self.served.emit("", "no model is loaded yet")
            return
        if _remote(self.engine):
            self.served.emit("", "the chat uses a remote endpoint, which is a server already: load a local model "
                                 "to serve it here")
            return
        try:
            from app import server
            from app.serve_access import LAN_HOST, lan_address
            host = LAN_HOST if key else "127.0.0.1"
            self.server = server.start(self.engine, host, port, api_key=key or None, turns=self.turns,
                                       runner=self.runner, on_request=self.request_logged.emit)
            self._serve_port, self._serve_key = port, key
            self.served.emit(self.server.url.replace(LAN_HOST, lan_address()), "")
        except (OSError, ValueError) as e:  # a port in use, most often
            self.served.emit("", f"the server could not start on {host}:{port}: {e}")

    def _stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    @Slot()
    def close(self) -> None:
        self._stop_server()
        if self.stats_timer is not None:
            self.stats_timer.stop()
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.runner.close()
