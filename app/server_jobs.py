"""The server's requests in flight: one `Job` per request, and the scheduler that runs them.

`BatchScheduler` (the server's): continuous batching. Up to `slots` jobs decode together, one
forward pass per step for all of them (engine.batch), each on its own KV cache with its own
seeded sampler; a new job's prompt is prefilled one chunk (the engine's batch_size tokens; an
MoE's prompt whole) between two decode steps, one prompt at a time, so a long prompt delays the
others' next token by one chunk, not by its whole prefill; a finished or cancelled job leaves at
once, freeing its slot. One worker thread, so the engine never runs on the event loop (and it
keeps the only OpenMP team: app.cli_serve.warm_apart). While the GUI serves, its chat replies are jobs here too
(`local_steps`); any other Engine.generate (on the conversation cache) runs between the steps,
which take the engine's lock only.
`Turns` is a line in front of the engine's conversation cache: a reply waits for the one before it.
`local_steps`: a reply of a caller on a plain thread (the GUI's chat while it serves) through the
same scheduler, so it shares the decode steps of the served requests.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the GUI's worker imports Turns at start: numba loads later, with a model
    from engine.api import Engine, Step
    from engine.batch import Sequence

log = logging.getLogger("colibri.server")


class Turns:
    """One reply at a time on one engine's conversation cache, first come first served: the GUI's
    chat replies wait for each other here. The server's BatchScheduler takes no turn (each of its
    requests has its own KV cache), so a chat reply and served requests run at once."""

    def __init__(self, poll_s: float = 0.05):
        self._cond = threading.Condition()
        self._line: deque[object] = deque()  # tickets; the first one holds the engine
        self._poll_s = poll_s  # how often a waiter looks at its cancel event

    @property
    def waiting(self) -> int:
        """Callers waiting behind the one that holds the engine."""
        with self._cond:
            return max(len(self._line) - 1, 0)

    @contextmanager
    def turn(self, cancel: threading.Event | None = None) -> Iterator[bool]:
        """Wait for this caller's turn: yields True while it holds the engine, or False at once
        when `cancel` is set while it waits (it leaves the line then)."""
        ticket = object()
        with self._cond:
            self._line.append(ticket)
            while self._line[0] is not ticket and not (cancel is not None and cancel.is_set()):
                self._cond.wait(self._poll_s)
            mine = self._line[0] is ticket
            if not mine:
                self._line.remove(ticket)
        try:
            yield mine
        finally:
            if mine:
                with self._cond:
                    self._line.popleft()
                    self._cond.notify_all()


# prompt tokens a server reads between two decode steps (whole prompts of waiting jobs, or one
# chunk of a long one): the running replies wait that long for their next token
PREFILL_TOKENS = 256


class QueueFull(Exception):
    """More requests are waiting than the server accepts."""


@dataclass
class Job:
    """One generation request and its slot: what to run, and where its steps go.

    `events` (an asyncio.Queue on the server's loop) receives each `Step`, then one final item:
    None when the reply ended, or the exception that ended it.
    """
    prompt: str | list[dict]  # raw text, or chat messages (the engine applies the template)
    sampling: dict[str, Any]
    stop: tuple[str, ...]
    loop: asyncio.AbstractEventLoop | None  # None: a LocalJob, whose steps go to a plain queue
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    tenant: str = "served"  # whose cached prompt prefixes it may reuse (engine.batch.PrefixCache)

    def cancel(self) -> None:
        """Stop after the current token (the client went away); safe from any thread."""
        self.cancelled.set()

    def _put(self, item: Step | BaseException | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is shutting down
            self.cancelled.set()


def put_steps(items: list[tuple[Job, Step]]) -> None:
    """Each job's step of one decode step, in order: one call into each event loop for all its
    jobs instead of one per job (each call wakes the loop with a write to its self-pipe: 5% of
    the engine thread's time at 8 streams, py-spy)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, Step]]] = {}
    for job, item in items:
        if job.loop is None:
            job._put(item)
        else:
            by_loop.setdefault(job.loop, []).append((job, item))
    for loop, pairs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_each, pairs)
        except RuntimeError:  # the loop is closed: the server is shutting down
            for job, _ in pairs:
                job.cancelled.set()


def _put_each(pairs: list[tuple[Job, Step]]) -> None:
    for job, item in pairs:
        job.events.put_nowait(item)


@dataclass
class LocalJob(Job):
    """A job whose steps go to a thread-safe queue: its caller runs no event loop. The window's
    chats are its own tenant: never a prefix of a served request, nor one of theirs."""
    tenant: str = "window"
    inbox: queue.Queue = field(default_factory=queue.Queue)

    def _put(self, item: Step | BaseException | None) -> None:
        self.inbox.put(item)


def local_steps(scheduler: BatchScheduler, prompt: str | list[dict], sampling: dict[str, Any],
                cancel: threading.Event, stop: tuple[str, ...] = ()) -> Iterator[Step]:
    """A reply through `scheduler` as Engine.generate(prompt_progress=True)'s steps: joins the
    served requests' decode steps between two of them. `cancel` (the caller's Stop) ends it after
    the current token, during its prompt too; `sampling` may carry template_vars and resume.
    Raises QueueFull at once when the scheduler's queue is full."""
    job = LocalJob(prompt, dict(sampling), tuple(stop), None, cancelled=cancel)
    scheduler.submit(job)
    ended = False
    try:
        while True:
            item = job.inbox.get()
            if item is None:
                ended = True
                return
            if isinstance(item, BaseException):
                ended = True
                raise item
            yield item
    finally:
        if not ended:  # the caller dropped the reply: its slot is freed at the next step
            job.cancel()


class _Left(Exception):
    """A job's client went away during its prompt's prefill (raised between layers)."""


class Task:
    """A callable queued on an EngineThread: join() waits for it, result() gives what it returned."""

    def __init__(self, fn: Any):
        self.fn, self.done = fn, threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def join(self, timeout: float | None = None) -> None:
        self.done.wait(timeout)

    def is_alive(self) -> bool:
        return not self.done.is_set()

    def result(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


class EngineThread:
    """One long-lived thread for all of an engine's parallel kernels in a process, running its
    callables in order. libgomp keeps an OpenMP team for each thread that ran a parallel kernel;
    with two (the GUI's QThread's and the server scheduler's) there are more of its threads than
    cores, and it then spins only briefly between parallel regions, so every region sleeps and
    wakes its workers (app.cli_serve.warm_apart measured it). The GUI's worker loads and replies
    here, and its server's BatchScheduler runs its loop here while it serves: one team."""

    def __init__(self, name: str = "colibri-engine"):
        self.name = name
        self._lock = threading.Lock()
        self._jobs: queue.Queue[Task | None] = queue.Queue()
        self.thread: threading.Thread | None = None  # started by the first submit (again after close)

    @staticmethod
    def _loop(jobs: queue.Queue) -> None:
        while True:
            task = jobs.get()
            if task is None:
                return
            try:
                task.value = task.fn()
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread by Task.result
                task.error = e
            task.done.set()

    def submit(self, fn: Any) -> Task:
        """Queue fn() behind the callables before it; the Task to wait for."""
        task = Task(fn)
        with self._lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, args=(self._jobs,), name=self.name, daemon=True)
                self.thread.start()
            self._jobs.put(task)
        return task

    def call(self, fn: Any) -> Any:
        """fn() on this thread, waited for: its value, or its exception raised here."""
        if threading.current_thread() is self.thread:
            return fn()
        return self.submit(fn).result()

    def close(self, timeout: float = 10.0) -> None:
        """End the thread once the callables queued so far have run (a later submit starts another)."""
        with self._lock:
            thread, jobs = self.thread, self._jobs
            self.thread, self._jobs = None, queue.Queue()
        jobs.put(None)
        if thread is not None:
            thread.join(timeout)


class BatchScheduler:
    """Continuous batching on one engine: jobs join between decode steps and leave when done.
    Its loop runs on a thread of its own, or on `runner` (an EngineThread) until it closes."""

    def __init__(self, engine: Engine, max_queue: int, turns: Turns | None = None, slots: int = 8,
                 prefix_bytes: int = 64 << 20, runner: EngineThread | None = None,
                 spare_idle_s: float = 30.0):
        from engine.batch import Batcher
        self.engine, self.max_queue, self.slots = engine, max_queue, max(int(slots), 1)
        self.spare_idle_s = spare_idle_s  # idle this long, the spare KV caches give their pages back
        self.turns = turns  # kept for callers that pass it; batched jobs need no turn
        self.batcher = Batcher(engine, prefix_bytes, spare_caches=self.slots)  # a KV cache per slot, reused
        self._cond = threading.Condition()
        self._queue: deque[Job] = deque()
        self.active: list[tuple[Job, Sequence]] = []
        self.filling: tuple[Job, Sequence] | None = None  # the job whose prompt is being prefilled
        self._closed = False
        # set once the loop's thread has compiled (or loaded) the batched step's kernels: requests
        # that come sooner wait in the queue (Batcher.warmup)
        self.warmed = threading.Event()
        self.warm_s = 0.0
        if runner is not None:
            self._thread: threading.Thread | Task = runner.submit(self._work)
        else:
            self._thread = threading.Thread(target=self._work, name="colibri-serve-engine", daemon=True)
            self._thread.start()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> Job | None:
        """A job decoding now (the first), or the one reading its prompt; None when idle."""
        active, filling = self.active, self.filling
        return active[0][0] if active else filling[0] if filling else None

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise QueueFull("the server is shutting down")
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"{len(self._queue)} requests are already waiting (the limit is "
                                f"{self.max_queue})")
            self._queue.append(job)
            self._cond.notify_all()

    def close(self, timeout: float = 10.0) -> None:
        """Cancel the running jobs and everything queued, then end the worker thread."""
        with self._cond:
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for job, _ in self.active + ([self.filling] if self.filling else []):
            job.cancel()
        for job in queued:
            job.cancel()
            job._put(None)
            job.done.set()
        self._thread.join(timeout)
        if self.batcher.spares is not None and not self._thread.is_alive():
            self.batcher.spares.clear()

    def _work(self) -> None:
        try:
            try:
                self.warm_s = self.batcher.warmup()
            except Exception:  # a step that cannot run says so on the first request, not here
                log.exception("warming up the batched step failed")
            finally:
                self.warmed.set()
            while True:
                with self._cond:
                    while not self._closed and not self._queue and not self.active and self.filling is None:
                        spares = self.batcher.spares
                        if not self._cond.wait(self.spare_idle_s if spares else None) and spares:
                            spares.clear()  # idle: a full-context cache each, kept only while busy
                    if self._closed:
                        break
                self._admit()
                if self.active:
                    self._decode()
        finally:
            for job, seq in self.active + ([self.filling] if self.filling else []):
                self._finish(job, seq)
            self.active, self.filling = [], None

    def _admit(self) -> None:
        """Between two decode steps: read the next chunk of the prompt being read, or the prompts
        of waiting jobs while slots are free, up to PREFILL_TOKENS prompt tokens in all. Taking
        one job per step, 8 requests arriving together had their first decode steps with 1, 2, ...
        7 rows (each step reads every weight) and the 8th waited 7 steps for its first token."""
        read = 0
        while read < PREFILL_TOKENS and not self._closed:
            with self._cond:
                job = self._queue.popleft() if self.filling is None and self._queue and \
                    len(self.active) < self.slots else None
            if job is not None:
                self._open(job)
            if self.filling is None:
                return
            seq = self.filling[1]
            before = seq.filled
            self._fill()  # one chunk of one prompt
            if self.filling is not None:  # more of it to read after the others' next step
                return
            read += len(seq.ids) - before

    @staticmethod
    def _finish(job: Job, seq: Sequence | None, error: BaseException | None = None) -> None:
        job._put(error)
        if seq is not None:
            seq.close()
        job.done.set()

    def _open(self, job: Job) -> None:
        if job.cancelled.is_set():  # left while waiting
            self._finish(job, None)
            return
        try:
            seq = self.batcher.open(job.prompt, job.stop, cancel=job.cancelled, tenant=job.tenant, **job.sampling)
            self.filling = (job, seq)
        except Exception as e:  # bad input: reported to the client; the worker keeps serving
            log.exception("generation failed")
            self._finish(job, None, e)

    def _fill(self) -> None:
        job, seq = self.filling

        def check(layer: int) -> None:
            if job.cancelled.is_set():
                raise _Left

        try:
            if job.cancelled.is_set():
                raise _Left
            logits = seq.prefill_step(check)
            if logits is None:  # more of the prompt to read, after the others' next step
                if isinstance(job, LocalJob):  # the GUI shows how far its prompt is read
                    job._put(seq.step(kind="prompt"))
                return
            step = seq.feed(logits)
        except _Left:
            log.info("request cancelled during its prompt (client gone)")
            self.filling = None
            job._put(seq.end("cancelled"))
            self._finish(job, seq)
            return
        except Exception as e:  # reported to the client; the worker keeps serving
            log.exception("generation failed")
            self.filling = None
            self._finish(job, seq, e)
            return
        self.filling = None
        job._put(step)
        if seq.finish is None:
            self.active = self.active + [(job, seq)]
        else:
            self._finish(job, seq)

    def _decode(self) -> None:
        live = []
        for job, seq in self.active:
            if job.cancelled.is_set():  # a vanished client frees its slot before the step
                log.info("request cancelled after %d tokens (client gone)", seq.generated)
                job._put(seq.end("cancelled"))
                self._finish(job, seq)
            else:
                live.append((job, seq))
        self.active = live
        if not live:
            return
        try:
            logits = self.engine.decode([seq.token for _, seq in live], [seq.cache for _, seq in live])
        except Exception as e:  # every job of the step gets the error; the worker keeps serving
            log.exception("a decode step failed")
            for job, seq in live:
                self._finish(job, seq, e)
            self.active = []
            return
        still, steps = [], []
        for row, (job, seq) in enumerate(live):
            steps.append((job, seq.feed(logits[row])))
        put_steps(steps)  # (before any job's end below: its last step arrives first)
        for job, seq in live:
            if seq.finish == "cancelled":
                log.info("request cancelled after %d tokens (client gone)", seq.generated)
            if seq.finish is None:
                still.append((job, seq))
            else:
                self._finish(job, seq)
        self.active = still
