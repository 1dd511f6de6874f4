"""The engine's one public face: `Engine`, the `Step` records it yields and `StatsSnapshot`.

CLI, GUI and server use only this module. Nothing here imports Qt.

    eng = Engine("~/models/smollm2", threads=2)
    for step in eng.generate([{"role": "user", "content": "Hi!"}], temperature=0):
        print(step.text, end="")
"""
from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np
import psutil

from engine import kernels
from engine import params as P
from engine.errors import ModelFormatError
from engine.scheduler import ScheduleSnapshot, attach
from engine.hardware import EnergyReading, HardwareMonitor, HardwareSnapshot
from engine.kernels import isa_run
from engine.mempool import MemoryPool, PoolStats, return_freed_heap, unmap_compiler_pages
from engine.model_dir import open_model_dir
from engine.sysmem import MemoryBudget
from engine.throttle import ThrottleEvent
from engine.reply import ContextOverflowError, Reply, Step, check_ids
from engine.speculative import Speculator, SpecTotals, refusal
from engine.tokenizer import TextCodec
from engine.weight_types import CacheStats
from engine.weights import ModelWeights

if TYPE_CHECKING:
    from engine.experts import ExpertCache
    from engine.expert_store import ExpertStore
    from engine.kvcache import KVCache


def _load_kernels(simd: str, simd_path: str) -> None:
    """engine.kernels.setup() with the first Engine's choices, then the modules that compile with
    numba, bound here: they need the setup first (engine.kernels says why), so importing this module
    sets nothing up and a command's --simd is never overridden by an import."""
    global numba, plan_expert_cache, replan, ExpertStore, ExpertCache, INT_MAX_T, KVCache, Transformer, Sampler
    kernels.setup(simd, simd_path)
    import numba
    from engine.cache_plan import plan_expert_cache, replan
    from engine.expert_store import ExpertStore
    from engine.experts import ExpertCache
    from engine.kernels.matmul import INT_MAX_T
    from engine.kvcache import KVCache
    from engine.models import Transformer
    from engine.sampling import Sampler


log = logging.getLogger("colibri.engine")


def _level(name: str) -> str:
    return "WARNING" if name == "WARN" else name


class _Interrupted(Exception):
    """Raised between prefill layers when a reply is stopped (never leaves engine.api)."""


class _Run(Reply):
    """generate()'s reply, on the conversation cache: it takes the engine's lock for each
    computation only, and owns the cache until another call uses it (`engine._turn`)."""

    meter: Any = None  # the reply's energy, from its prefill on
    closed = False
    t_step = 0.0  # the current decode step's start, and the expert bytes read before it (speculation)
    b_step = 0

    @property
    def cache(self) -> KVCache:  # type: ignore[override]
        return self.e.cache

    def _owner(self) -> bool:
        return self.e._turn is self

    def cancelled(self) -> bool:
        return self.e._cancel.is_set() or super().cancelled()

    def prefill(self, progress: bool):
        """Generator: the prompt into the cache in chunks (Step(kind="prompt") after each when
        `progress`); returns the last logits, or None when stopped or superseded."""
        e = self.e
        self.t0 = self.t_first = time.perf_counter()  # (made by generate(), this reply starts when first asked)
        with e._lock:
            e._cancel.clear()
            e._turn = self
            self.meter = e.hw.energy_meter()
            self.meter.start()
            reuse = 0
            for a, b in zip(e.tokens, self.ids):
                if a != b:
                    break
                reuse += 1
            # one token must run to get logits; a recurrent cache may keep nothing (KVCache.truncate)
            self.reused = self.filled = e.cache.truncate(min(reuse, len(self.ids) - 1))
            e.tokens = self.ids[:self.reused]
        logits = None
        while self.filled < len(self.ids):
            with e._lock:
                if not self._owner() or self.cancelled():
                    return None
                part = self.next_chunk()
                try:
                    logits = e.prefill(part, e.cache, self.filled, before_layer=self._check_stop)
                except _Interrupted:
                    return None
                self.filled += len(part)
                e.tokens = self.ids[:self.filled]
            if progress and self.filled < len(self.ids):
                yield self.step(kind="prompt")
        with e._lock:
            if self._owner():
                e.cache.snapshot()  # rings/recurrent states: the next turn may rewind to here
        self.prompt_read()
        e.count(reused=self.reused)
        return logits

    def _check_stop(self, layer: int) -> None:
        if self.cancelled():
            raise _Interrupted

    def stream(self, progress: bool) -> Iterator[Step]:
        """The reply loop: the prompt into the cache, then a step at a time until the reply finishes;
        "cancelled" when stopped, or superseded by another call on the conversation cache. A step
        decodes the pending token, or, speculating (engine.speculative), verifies it with tokens
        drafted after it: one row of logits per position, sampled in order while the drafts hold."""
        e = self.e
        try:
            logits = yield from self.prefill(progress)
            spec = e.spec if e.spec.wanted(self.options["speculative"], self.sampler,
                                           self.options["seed"] is not None) else None
            drafted: list[int] = []
            while logits is not None:  # (None: stopped or superseded before the prompt was in)
                accepted = 0
                for i, row in enumerate(logits.reshape(-1, logits.shape[-1])):
                    d = drafted[i] if i < len(drafted) else None
                    yield self.feed(row, d)
                    if self.finish is not None or d is None or self.token != d:
                        break
                    accepted += 1
                    with e._lock:  # the drafted token's keys and values are in the cache already: kept
                        if not self._owner():
                            break
                        e.cache.length += 1
                        e.tokens.append(d)
                if self.t_step:  # (not the prompt's row) plain steps too: auto's evidence in later conversations
                    e.spec.observe(len(drafted), accepted, time.perf_counter() - self.t_step, self._expert_bytes() -
                                 self.b_step)
                if self.finish is not None:
                    return
                with e._lock:
                    logits, drafted = self.next_logits(spec) if self._owner() else (None, [])
            yield self.end("cancelled")
        finally:
            self.close()

    def next_logits(self, spec: Speculator | None) -> tuple[np.ndarray, list[int]]:
        """The pending token through the model (under the lock, the cache owned): alone, or with
        the tokens drafted after it (then one row of logits per position). Returns (logits, drafts)."""
        e = self.e
        self.t_step, self.b_step = time.perf_counter(), self._expert_bytes()
        room = e.cache.capacity - e.cache.length - 2
        draft = spec.draft(self.history, room, self.options["draft_max"]) if spec is not None else []
        logits = e.verify([self.token, *draft], e.cache) if draft else e.decode([self.token], [e.cache])
        e.tokens.append(self.token)
        return logits, draft

    def _expert_bytes(self) -> int:
        """Expert bytes read from disk so far (a RAM cap's cost of wider steps)."""
        return sum(c.bytes_loaded for c in self.e.weights.experts.counters)

    def step(self, piece: str = "", tok: int | None = None, kind: str = "token") -> Step:
        out = super().step(piece, tok, kind)
        if self.finish is not None:
            self.close()
        return out

    def close(self) -> None:
        """Account for the reply once: at its last step, or when the caller drops the generator."""
        if self.closed or self.meter is None:
            return
        self.closed = True
        e = self.e
        e._last = {"prefill_tok_s": self.prefill_tok_s, "decode_tok_s": self.decode_tok_s, "ttft_s": self.ttft}
        e.count(generated=self.generated)
        e._energy = self.meter.stop(self.generated)
        if self._owner():
            e.weights.experts.check_prefetch()


@dataclass(frozen=True)
class StatsSnapshot:
    """Every figure about the engine at one moment, as plain values."""
    model: str
    architecture: str
    num_layers: int
    num_experts: int
    top_k: int
    weights_bytes: int
    threads: int
    context_used: int
    context_limit: int
    kv_cache_kind: str
    kv_cache_bytes: int
    rss_bytes: int
    prefill_tok_s: float
    decode_tok_s: float
    ttft_s: float
    tokens_prefilled: int
    tokens_generated: int
    tokens_reused: int
    expert_cache_hit_rate: float
    prefetch_accuracy: float | None
    expert_cache: CacheStats
    expert_cache_plan: str
    mem_pool: PoolStats
    configured_threads: int  # asked for; `threads` is what the thermal governor allows now
    hardware: HardwareSnapshot  # load, RSS, temperatures, power and limits; reasons for what is missing
    throttle_events: tuple[ThrottleEvent, ...]
    energy: EnergyReading | None  # the last reply (prefill + decode); None before the first
    joules_per_token: float | None  # the last reply: CPU package + GPU joules / generated tokens
    schedule: ScheduleSnapshot  # per layer: CPU or GPU and why; GPU fallbacks
    params: dict[str, Any] = field(default_factory=dict)
    memory_budget: MemoryBudget | None = None  # auto sizing: the room measured and how it was split
    memory_warning: str | None = None  # plain words when the expert budget is below one token's experts
    remote: Any = None  # app.remote.RemoteStats when the model runs on a remote endpoint (else None)
    simd_path: str = ""  # the byte dot-product path and how it was chosen: "vnni (measured)" (engine.kernels.isa)
    kernels: dict[str, str] = field(default_factory=dict)  # format -> what runs for x @ W.T ("blocks32 (vnni)")
    route: str = ""  # the decoder loop's route at the last step: "fused", "layered (why)", "fused rows (4 sequences)"
    speculative: dict[str, Any] = field(default_factory=dict)  # mode, state (and why off), drafted, accepted,
    # acceptance, tok/s of verify and of plain steps, net_gain, expert bytes per token of each (engine.speculative)


class Engine:
    def __init__(self, model_path: str | os.PathLike, **params: Any):
        path = Path(model_path).expanduser()
        if path.is_file() and path.suffix.lower() == ".gguf":
            raise ModelFormatError(f"{path}: a GGUF file; convert it first with colibri-convert "
                                   f"(colibri-cli --model FILE.gguf does this for you)")
        given = P.validate(params)
        self.params = P.defaults("engine") | {k: v for k, v in given.items() if P.PARAMS[k].scope == "engine"}
        self.sampling = P.defaults("sampling") | {k: v for k, v in given.items() if P.PARAMS[k].scope == "sampling"}
        _load_kernels(self.params["simd"], self.params["simd_path"])  # (a command may have set them up already)
        # sensors and the thermal governor first: bad throttle marks fail before the model loads
        self.hw = HardwareMonitor(self.configured_threads, self.params["throttle_high_c"],
                                  self.params["throttle_low_c"])
        self.hw.governor.tuning = self.params["thread_tuning"]
        self._energy: EnergyReading | None = None
        self.model = open_model_dir(path)
        self.cfg = self.model.config
        self.codec = TextCodec.from_model(self.model)
        self.pool = MemoryPool()
        self.cache_plan = plan_expert_cache(self.model, self.params, self.context_limit, refuse=True)
        self._planned_at = time.monotonic()
        repack = self.params["gpu_layers"] == 0  # a GPU reads the stored layout (experts repacked on disk:
        # engine.scheduler uploads them unpacked)
        store = ExpertStore(self.model)
        self.weights = ModelWeights(self.model, self.pool, store, self._expert_cache(store, repack), repack)
        self.net = Transformer(self.cfg, self.weights)  # what the architecture is: engine.arch
        self.net.exact = not self.params["int8_activations"]
        self.scheduler = attach(self)  # gpu_layers > 0 and a GPU: matmuls are offered to it
        self._lock = threading.RLock()  # one computation at a time; never held across a yield
        self._turn: object | None = None  # the generate() run that owns the conversation cache
        self._cancel = threading.Event()
        self.tokens: list[int] = []  # the conversation held in the KV cache
        self._totals = {"prefilled": 0, "generated": 0, "reused": 0}
        self._counting = threading.Lock()
        self._last = {"prefill_tok_s": 0.0, "decode_tok_s": 0.0, "ttft_s": 0.0}
        self.spec_totals = SpecTotals()
        self._new_cache()
        if "log_level" in given:  # else the program's logging setup decides (the commands configure it)
            logging.getLogger("colibri").setLevel(_level(self.params["log_level"]))
        self.hw.apply_limits(self.params)  # never raises: a refusal is logged and shown in stats()
        if self.params["affinity"]:
            self.hw.apply_affinity(True)
        if self.params["simd"] != kernels.SIMD_REQUESTED:
            log.warning("simd %s takes effect at the next start (this process compiled for %s)",
                        self.params["simd"], kernels.SIMD)
        if self.params["simd_path"] not in ("auto", isa_run.in_effect().split()[0]):
            log.warning("simd_path %s takes effect at the next start (this process runs %s)",
                        self.params["simd_path"], isa_run.in_effect())
        log.info("loaded %s: %s, %d layers, %d expert(s), context %d, kv %s, %d threads; expert cache: %s",
                 path.name, self.cfg.architecture, self.cfg.num_layers, self.cfg.num_experts, self.context_limit,
                 self.params["kv_cache_quantize"], self.threads, self.cache_plan.reason)
        if self.cache_plan.warning:
            log.warning("%s", self.cache_plan.warning)

    # --- parameters ------------------------------------------------------------------------
    @property
    def configured_threads(self) -> int:
        """The thread count asked for (default: physical cores), capped by numba's pool."""
        wanted = self.params["threads"] or P.physical_cores()
        return max(1, min(wanted, numba.config.NUMBA_NUM_THREADS))

    @property
    def threads(self) -> int:
        """The thread count in use now: configured_threads unless the CPU is too hot."""
        return self.hw.governor.threads

    @property
    def context_limit(self) -> int:
        return min(self.params["context_length"], self.cfg.max_position_embeddings)

    def _new_cache(self) -> None:
        c = self.cfg
        if getattr(self, "cache", None) is not None:
            self.cache.free()
        self.cache = KVCache(c.num_layers, self.context_limit, c.num_kv_heads, c.head_dim,
                             self.params["kv_cache_quantize"], self.pool)
        self.tokens = []
        self._turn = None  # a suspended generate() finds its cache gone and ends
        self.spec = Speculator(refusal(self.net), self.spec_totals)  # a new conversation's drafting

    def _expert_cache(self, store: ExpertStore, repack: bool) -> ExpertCache:
        """An empty expert cache sized by the current plan; `repack`: resident q4 experts go into
        the CPU kernels' 8-row groups."""
        c, plan = self.cfg, self.cache_plan
        return ExpertCache(store, self.pool, c.num_layers, c.num_experts, plan.cache_bytes,
                           self.params["prefetch_window"], c.top_k, repack, plan.per_layer,
                           self.params["expert_cache_policy"])

    def set_param(self, name: str, value: Any) -> None:
        """Change one parameter; engine settings that size the cache rebuild it (the conversation
        cache is dropped, the next turn prefills again)."""
        v = P.check(name, value)
        p = P.PARAMS[name]
        if p.scope == "sampling":
            self.sampling[name] = v
            return
        if name in ("throttle_high_c", "throttle_low_c"):  # low < high is checked before anything changes
            marks = {**self.params, name: v}
            self.hw.governor.set_limits(marks["throttle_high_c"], marks["throttle_low_c"])
        with self._lock:
            self.params[name] = v
            if name == "gpu_layers":
                self.scheduler.close()
                self.scheduler = attach(self)
            if name == "threads":
                self.hw.governor.configure(self.configured_threads)
            if name == "int8_activations":
                self.net.exact = not v
            if name == "thread_tuning":
                self.hw.governor.tuning = v
            if name in ("power_limit", "gpu_power_limit"):
                self.hw.apply_limits(self.params)
            if name == "affinity" or (name == "threads" and self.params["affinity"]):
                self.hw.apply_affinity(self.params["affinity"])
            if name in ("expert_cache_size", "expert_cache_bytes", "prefetch_window"):
                self.cache_plan = plan_expert_cache(self.model, self.params, self.context_limit)
                self.weights.experts.close()  # a new, empty expert cache with the new settings
                self.weights.experts = self._expert_cache(self.weights.store, self.weights.repack)
            elif not p.live:
                self._new_cache()
            if name == "log_level":
                logging.getLogger("colibri").setLevel(_level(v))
        log.info("set %s = %r", name, v)

    # --- text ------------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        return self.codec.encode(text, add_bos)

    def detokenize(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return self.codec.decode(list(ids), skip_special)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            template_vars: dict | None = None) -> str:
        """The template's text, for display: tokenizing it would read special-token strings in
        the messages as tokens; prompt_ids(messages) does not."""
        return self.codec.render(messages, add_generation_prompt, template_vars)

    # --- compute ---------------------------------------------------------------------------
    def _check_budget(self) -> None:
        """Auto sizing: measure the room again (at most once a second) and move the expert cache's
        budget when memory pressure moved it by more than one expert."""
        plan = self.cache_plan
        if not plan.auto or time.monotonic() - self._planned_at < 1.0:
            return
        self._planned_at = time.monotonic()
        ec = self.weights.experts
        new = replan(plan, self.cfg.num_experts, self.cfg.num_layers, ec.used_bytes, self.cache.nbytes_used)
        if abs(new.cache_bytes - plan.cache_bytes) < plan.expert_bytes:
            return
        self.cache_plan = new
        ec.set_budget(new.cache_bytes)
        log.info("memory pressure changed: expert cache %.0f -> %.0f MB (%s)", plan.cache_bytes / 1e6,
                 new.cache_bytes / 1e6, new.reason)
        if new.warning and not plan.warning:
            log.warning("%s", new.warning)

    def _ready(self) -> int | None:
        """Before a pass: the threads, the weight files, the memory budget. Returns the pass's
        chunk: MoE None (the whole prompt goes through each layer at once, so every expert is
        loaded at most once per layer per prompt), else batch_size tokens."""
        self._step_threads = self.hw.governor.update()  # fewer while too hot, or while others share the cores
        numba.set_num_threads(self._step_threads)  # (per calling thread)
        self.weights.check_files()  # a weight file cut short since loading: an error here, not SIGBUS below
        self._check_budget()
        return None if self.cfg.is_moe else self.params["batch_size"]

    def _prefill(self, ids: Sequence[int], cache: KVCache, pos0: int, all_logits: bool,
                 before_layer: Callable[[int], None] | None = None) -> np.ndarray:
        chunk = self._ready()
        t0 = time.perf_counter()
        out = self.net.forward(np.asarray(ids, np.int64), cache, pos0, all_logits, before_layer=before_layer,
                               chunk=chunk)
        if len(ids) == 1:  # a decode step: the thread tuner's evidence (prompts are not)
            self.hw.governor.observe(self._step_threads, time.perf_counter() - t0)
        return out

    def logits(self, token_ids: Sequence[int], dump: dict | None = None) -> np.ndarray:
        """Logits (len, vocab) of every position, from an empty cache; the conversation is kept."""
        ids = list(token_ids)
        check_ids(ids, self.cfg.vocab_size)
        if not ids or len(ids) > self.context_limit:
            raise ContextOverflowError(f"{len(ids)} tokens: logits needs 1 to {self.context_limit}")
        with self._lock:
            c = self.cfg
            cache = KVCache(c.num_layers, len(ids), c.num_kv_heads, c.head_dim, self.params["kv_cache_quantize"])
            numba.set_num_threads(self.threads)
            if dump is not None:
                return self.net.forward(np.asarray(ids, np.int64), cache, 0, all_logits=True, dump=dump)
            return self._prefill(ids, cache, 0, all_logits=True)

    def forward(self, token_ids: Sequence[int]) -> int:
        """Append tokens to the conversation cache; the greedy next token."""
        ids = list(token_ids)
        check_ids(ids, self.cfg.vocab_size)
        with self._lock:
            if self.cache.length + len(ids) > self.context_limit:
                raise ContextOverflowError(f"{self.cache.length} + {len(ids)} tokens exceed the context of "
                                           f"{self.context_limit}")
            self._turn = None  # the conversation moves on without any suspended generate()
            last = self._prefill(ids, self.cache, self.cache.length, all_logits=False)
            self.tokens += ids
        return int(np.argmax(last[-1]))

    def reset(self) -> None:
        """Forget the conversation held in the cache."""
        with self._lock:
            self._turn = None
            self.cache.truncate(0)
            self.tokens = []
            self.spec = Speculator(refusal(self.net), self.spec_totals)

    def stop(self) -> None:
        """Ask a running generate() to finish after the current token, or the current prefill
        chunk or layer while it reads the prompt (from any thread)."""
        self._cancel.set()

    def prompt_ids(self, prompt: str | list[dict], template_vars: dict | None = None,
                   resume: str = "") -> list[int]:
        """Raw text as it is (special-token strings in it become tokens: the caller writes the
        structure); messages through the chat template, their text always plain text, so only
        the template yields control tokens (TextCodec.encode_chat). For messages, `template_vars`
        are the template's switches (enable_thinking) and `resume` the start of a reply to continue."""
        if isinstance(prompt, str):
            return self.codec.encode(prompt)
        return self.codec.encode_chat(prompt, True, template_vars, resume)

    def generate(self, prompt: str | list[dict], stop: Sequence[str] = (), *, prompt_progress: bool = False,
                 cancel: threading.Event | None = None, template_vars: dict | None = None,
                 resume: str = "", **sampling: Any) -> Iterator[Step]:
        """Stream a reply: a raw text continuation (str) or a chat reply (a list of messages).

        The prompt's longest prefix already in the cache is not prefilled again. With
        `prompt_progress`, a Step(kind="prompt") follows each prefill chunk (batch_size tokens;
        an MoE prompt goes through the layers in one chunk). `cancel` (set from any thread) ends
        the reply like stop(), checked between tokens, prefill chunks and MoE layers. The
        engine is locked only while it computes: a generator left unfinished blocks nothing,
        and ends ("cancelled") if resumed after another call has used the conversation cache.
        A chat takes the template's switches in `template_vars` ({"enable_thinking": False}) and
        continues a reply cut short from `resume`, the text it wrote so far (prompt_ids).
        """
        return _Run(self, prompt, stop, cancel, template_vars, resume, sampling).stream(prompt_progress)

    # --- the runner: computations on caches the caller holds (engine.batch's sequences) ------
    def prefill(self, ids: Sequence[int], cache: KVCache, pos0: int,
                before_layer: Callable[[int], None] | None = None) -> np.ndarray:
        """Prompt tokens `ids` into `cache` from position `pos0`, as one computation (under the
        engine's lock, with the threads the governor allows); the last one's logits (1, vocab),
        counted in stats(). `before_layer(L)` may raise to stop between layers."""
        with self._lock:
            logits = self._prefill(ids, cache, pos0, all_logits=False, before_layer=before_layer)
        self.count(prefilled=len(ids))
        return logits

    def decode(self, tokens: Sequence[int], caches: Sequence[KVCache], routes: list | None = None,
               warmup: bool = False) -> np.ndarray:
        """The next token of N rows in one pass (tokens[i] on caches[i]: Transformer.forward on rows)
        as one computation; logits (N, vocab). Its time is the thread tuner's evidence, and its
        expert lookups count in stats(), unless it is a `warmup` (a compile is no evidence)."""
        with self._lock, self.weights.experts.quiet() if warmup else nullcontext():
            self._ready()
            t0 = time.perf_counter()
            logits = self.net.forward(np.asarray(tokens, np.int64), list(caches), 0, all_logits=True, routes=routes)
            if not warmup:
                self.hw.governor.observe(self._step_threads, time.perf_counter() - t0, len(tokens))
        return logits

    def verify(self, ids: Sequence[int], cache: KVCache) -> np.ndarray:
        """Logits (len(ids), vocab) of `ids` run at the end of `cache` in one pass, as a prompt runs
        (each layer's experts read once for every position routed to them). The cache keeps only the
        first position: the caller extends its length as drafted tokens are accepted, so the others
        are forgotten exactly (speculation refuses models whose states cannot be, engine.speculative)."""
        with self._lock:
            chunk = self._ready()
            pos0 = cache.length
            logits = self.net.forward(np.asarray(ids, np.int64), cache, pos0, all_logits=True, chunk=chunk)
            cache.length = pos0 + 1
        return logits

    def count(self, prefilled: int = 0, reused: int = 0, generated: int = 0) -> None:
        """A reply's tokens into stats(): prompt tokens run, or reused from a cache, and generated
        (a lock of its own: counting never waits for a computation)."""
        with self._counting:
            for key, n in (("prefilled", prefilled), ("reused", reused), ("generated", generated)):
                self._totals[key] += n

    # --- lifecycle -------------------------------------------------------------------------
    def warmup(self) -> float:
        """Compile (or load) every kernel and touch the hot path; returns the seconds it took.
        Its expert lookups are not counted (stats() describes real requests)."""
        t0 = time.perf_counter()
        V = self.cfg.vocab_size  # a prompt-sized probe: prompts take the multi-token kernels, decode the fused ones
        probe = [self.codec.bos_id or 0] + [(1 + i) % V for i in range(INT_MAX_T + 1)]
        ec, auto, budget = self.weights.experts, self.cache_plan.auto, self.weights.experts.budget
        # compile before the cache fills, whatever its size: a cold numba cache's compile takes memory the
        # plan gave experts, and LLVM's library is mapped until the end (an explicit 2 of 8 a layer on the
        # q4_k_m bench model peaked at 522 MB here, its probe's experts loaded, against 476 after decoding)
        ec.set_budget(0)  # (its working minimum; no re-planning meanwhile)
        if auto:
            self._planned_at = float("inf")
        try:
            with ec.quiet():
                Sampler(**self.sampling).sample(self.logits(probe)[-1], probe)  # the chat's sampling kernel too
                if self.net.fused is not None:  # every decoded token takes it (a partial cache streams): compile it now
                    self.net.fused.compile(self.params["kv_cache_quantize"])
                self.net.compile_expert_call()  # a model decoded layer by layer, with a partial cache, takes this one
                self.net.compile_prompt_swiglu()  # a prompt of 16 tokens or more through a K-quant MLP or expert
                with self._lock:
                    c = self.cfg
                    cache = KVCache(c.num_layers, len(probe) + 1, c.num_kv_heads, c.head_dim,
                                    self.params["kv_cache_quantize"])
                    self._prefill(probe, cache, 0, all_logits=False)
                    self._prefill(probe[:1], cache, len(probe), all_logits=False)
        finally:
            # the kernels are in: LLVM's code pages (about 100 MB of RSS) go back to the page cache,
            # and loading them parsed IR and freed it (13 MB of heap on the bench MoE)
            unmapped = unmap_compiler_pages()
            return_freed_heap()
            if auto:  # the room measured again, what the compile kept included
                self.cache_plan = replan(self.cache_plan, self.cfg.num_experts, self.cfg.num_layers, ec.used_bytes,
                                         self.cache.nbytes_used, settled=True)
                self._planned_at = time.monotonic()
                ec.set_budget(self.cache_plan.cache_bytes)
            else:
                ec.set_budget(budget)
        seconds = time.perf_counter() - t0
        log.info("warmup took %.2f s; LLVM's library pages unmapped: %.0f MB", seconds, unmapped / 1e6)
        return seconds

    def stats(self) -> StatsSnapshot:
        ec = self.weights.experts.stats()
        return StatsSnapshot(
            model=self.model.path.name, architecture=self.cfg.architecture, num_layers=self.cfg.num_layers,
            num_experts=self.cfg.num_experts, top_k=self.cfg.top_k, weights_bytes=self.weights.nbytes(),
            threads=self.threads, context_used=self.cache.length, context_limit=self.context_limit,
            kv_cache_kind=self.cache.kind, kv_cache_bytes=self.cache.nbytes_used,
            rss_bytes=psutil.Process().memory_info().rss, tokens_prefilled=self._totals["prefilled"],
            tokens_generated=self._totals["generated"], tokens_reused=self._totals["reused"],
            expert_cache_hit_rate=ec.hit_rate, prefetch_accuracy=ec.prefetch_accuracy, expert_cache=ec,
            expert_cache_plan=self.cache_plan.reason, mem_pool=self.pool.stats(), schedule=self.scheduler.snapshot(),
            configured_threads=self.configured_threads, hardware=self.hw.snapshot(),
            throttle_events=self.hw.governor.events, energy=self._energy,
            joules_per_token=None if self._energy is None else self._energy.joules_per_token,
            params={**self.params, **self.sampling}, memory_budget=self.cache_plan.budget,
            memory_warning=self.cache_plan.warning, simd_path=isa_run.in_effect(), kernels=isa_run.model_kernels(self.weights),
            route=self.net.plan, speculative=self.spec.totals.snapshot(self.spec.mode, self.spec.state()),
            **self._last)

    def mem_pool_defrag(self) -> int:
        """Free the expert cache's spare slots and return the pool's free pages to the OS (nothing
        is moved: no engine allocation is movable). Returns the bytes of resident memory actually
        given back, counted page by page (mincore) before each release."""
        with self._lock:
            returned = self.pool.release(self.weights.experts.drop_spares())
            returned += self.pool.defrag()
        log.info("mem_pool_defrag returned %.1f MB", returned / 1e6)
        return returned

    def close(self) -> None:
        with self._lock:
            self._turn = None
            self.scheduler.close()
            self.weights.close()
            self.cache.free()
            self.net.arena.free()
            self.hw.close()  # puts back any power limit and CPU mask we changed

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
