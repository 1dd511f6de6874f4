"""One chat, answered one way by the window's worker, colibri-cli and a remote endpoint alike.

A `ChatSession` holds a conversation's messages and drives an Engine, or an app.remote.RemoteBackend
whose generate() yields the same Steps. A chat that outgrows the context is cut by its policy
(POLICIES): counted with the backend's template where it has one (`plan`: the window's meter and
markers too), else cut each time the endpoint says the prompt does not fit. Qt-free.
"""
from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from app.attachments import with_attachments
from app.reasoning import OPEN, ThinkSplitter, can_switch, is_reasoning_model, starts_inside
from engine.errors import ColibriError

POLICIES = ("drop_oldest", "keep_first", "stop")
DEFAULT_POLICY = "drop_oldest"
LABELS = {  # what the chat settings show (translated in the UI through these source strings)
    "drop_oldest": "Drop the oldest messages",
    "keep_first": "Keep the start, drop the middle",
    "stop": "Stop at the limit",
}


def reply_room(limit: int) -> int:
    """Tokens kept free for the reply: a prompt that fills the context leaves it nothing to say."""
    return max(1, min(512, limit // 8))


@dataclass(frozen=True)
class ContextPlan:
    """The outcome for one prompt: indices into the messages given to `plan`."""
    policy: str
    keep: tuple[int, ...]  # sent, in order
    dropped: tuple[int, ...]  # left out (one contiguous run), in order
    tokens: int  # what the kept messages take in the context
    limit: int
    fits: bool  # False: not even the messages the policy must keep fit (or "stop" and it is too long)

    @property
    def marker_before(self) -> int | None:
        """Index of the first message after the dropped run (where the chat shows the marker)."""
        return self.dropped[-1] + 1 if self.dropped else None


def cuts(messages: Sequence[dict], policy: str) -> tuple[int, list[int]]:
    """Where the policy may cut: messages[start:cut] may go, for each cut in turn, after the system
    prompt (and first exchange for keep_first), before the last user message, each cut at a user's
    message (or the end); none under "stop"."""
    start = 1 if messages and messages[0].get("role") == "system" else 0
    end = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages))
    if policy == "keep_first":
        start += 2 if start + 1 < end and messages[start + 1].get("role") == "assistant" else 1
    end = max(start, end)
    return start, [c for c in range(start + 1, end + 1) if policy != "stop" and (
        c == end or messages[c].get("role") == "user")]


def plan(messages: Sequence[dict], count: Callable[[list[dict]], int], limit: int,
         policy: str = DEFAULT_POLICY, room: int | None = None) -> ContextPlan:
    """The messages to send so that prompt + `room` tokens fit in `limit`: whole exchanges dropped,
    the smallest cut that fits found by bisection (dropping more never costs more tokens)."""
    if policy not in POLICIES:
        raise ValueError(f"context policy {policy!r}: expected one of {', '.join(POLICIES)}")
    room = reply_room(limit) if room is None else room
    everything = list(range(len(messages)))
    total = count(list(messages))
    if total + room <= limit or policy == "stop":
        return ContextPlan(policy, tuple(everything), (), total, limit, total + room <= limit)
    start, points = cuts(messages, policy)
    kept = lambda cut: everything[:start] + everything[cut:]  # noqa: E731
    tokens = lambda cut: count([messages[i] for i in kept(cut)])  # noqa: E731
    if not points:
        return ContextPlan(policy, tuple(everything), (), total, limit, False)
    at = bisect.bisect_left(points, True, key=lambda c: tokens(c) + room <= limit)  # the first cut that fits
    cut = points[min(at, len(points) - 1)]  # none fits: even the smallest prompt the policy allows is too long
    return ContextPlan(policy, tuple(kept(cut)), tuple(range(start, cut)), tokens(cut), limit, at < len(points))


class ContextFullError(ColibriError):
    """The chat does not fit the context and its policy (or its last message) allows no cut."""

    def __init__(self, plan: ContextPlan):
        room = reply_room(plan.limit)
        super().__init__(
            f"this chat takes {plan.tokens:,} tokens of the model's {plan.limit:,}, and a reply needs {room:,} more; "
            f"its context policy is to stop at the limit: start a new chat, or choose another policy under the "
            f"message box" if plan.policy == "stop" else
            f"even with the earlier messages left out, the prompt takes {plan.tokens:,} tokens but the context "
            f"holds {plan.limit:,}, {room:,} of them kept for the reply: shorten the message or its attachments, "
            f"or raise the context length in Settings")
        self.plan = plan


@dataclass
class Reply:
    """A reply, filled in as it is written."""
    text: str  # as the model wrote it: a reasoning model's <think> tags included (app.reasoning.split)
    step: Any  # the last engine Step, or None when nothing came
    dropped: int  # messages left out because the context was full (the chat's context policy)
    thinking_tokens: int = 0  # tokens of this reply written inside its thinking
    plan: ContextPlan | None = None  # which messages were sent (None: not counted here)


def prompt_progress(step: Any) -> float | None:
    """The fraction of the prompt read so far when `step` reports prompt processing, else None:
    generate(prompt_progress=True) yields Step(kind="prompt") after each prefill chunk, with
    `prompt_done` of `prompt_tokens` in the cache."""
    if getattr(step, "kind", None) != "prompt" or not step.prompt_tokens:
        return None
    return min(1.0, step.prompt_done / step.prompt_tokens)


def stream(steps: Iterator, emit: Callable[[str, Any], None], frame_s: float = 0.0,
           clock: Callable[[], float] = time.perf_counter, pending: str = "") -> None:
    """Emit the text of `steps` in batches of at most one per frame (`pending` first), and prompt
    progress, without text, at most once a frame."""
    last, t_emit = None, clock()
    for step in steps:
        if prompt_progress(step) is not None:  # the prompt is being read: no text yet
            if clock() - t_emit >= frame_s:
                emit("", step)
                t_emit = clock()
            continue
        last, pending = step, pending + step.text
        if step.finish_reason is not None or clock() - t_emit >= frame_s:
            emit(pending, step)
            pending, t_emit = "", clock()
    if pending:
        emit(pending, last)


def reasoning_of(engine) -> tuple[bool, bool]:
    """(the model reasons, its template has a thinking switch); (False, False) without a local template."""
    codec = getattr(engine, "codec", None)
    if codec is None:
        return False, False
    reasons = is_reasoning_model(codec.template_source, lambda t: codec.tok.token_to_id(t) is not None)
    return reasons, reasons and can_switch(codec.template_source)


class ChatSession:
    """Messages (role/content dicts, a system prompt first if any) and their replies. Each verb returns
    a reply's Steps, which `cancel` ends after the current token or prompt chunk; `reply` describes
    it as it comes, and it joins the messages once its Steps are used up or closed."""

    def __init__(self, backend, messages: Sequence[dict] = (), policy: str = DEFAULT_POLICY,
                 template_vars: dict | None = None, scheduler: Any = None):
        self.backend, self.messages, self.policy = backend, list(messages), policy
        self.template_vars, self.scheduler, self.reply = template_vars, scheduler, None

    def plan(self) -> ContextPlan | None:
        """What the policy sends, counted with the backend's template (None: a remote one)."""
        if getattr(self.backend, "remote", False):
            return None
        count = lambda m: len(self.backend.prompt_ids(m, self.template_vars)) if m else 0  # noqa: E731
        return plan(self.messages, count, self.backend.context_limit, self.policy)

    def send(self, text: str, attachments: list = (), *, cancel: threading.Event | None = None, **sampling) -> Iterator:
        self.messages.append({"role": "user", "content": with_attachments(text, attachments)})
        return self.answer(cancel, **sampling)

    def regenerate(self, cancel: threading.Event | None = None, **sampling) -> Iterator:
        """Another reply in place of the last one."""
        self._reply()
        return self.answer(cancel, **sampling)

    def resume(self, cancel: threading.Event | None = None, **sampling) -> Iterator:
        """The last reply, continued where the token limit (or Stop) cut it."""
        return self.answer(cancel, self._reply() or "", **sampling)

    def edit(self, index: int, text: str, attachments: list = (), **kw) -> Iterator:
        """The user message at `index` replaced, and what followed it let go."""
        del self.messages[index:]
        return self.send(text, attachments, **kw)

    def _reply(self) -> str | None:  # the last reply's text, taken off the messages
        return self.messages.pop()["content"] if self.messages and self.messages[-1]["role"] == "assistant" else None

    def answer(self, cancel: threading.Event | None = None, resume: str = "", **sampling) -> Iterator:
        """A reply to the messages as they are; `resume`: the text of a reply cut short, continued. A
        `<think>` the template put at the end of the prompt starts `reply.text`."""
        from engine.api import ContextOverflowError
        plan, n, written = self.plan(), len(self.messages), resume
        if plan is not None and not plan.fits:
            raise ContextFullError(plan)
        start, points = cuts(self.messages, self.policy)
        tries = [plan.keep] if plan else [(*range(start), *range(cut, n)) for cut in (start, *points)]
        reasons, lead = reasoning_of(self.backend)[0], ""
        for keep in tries:  # an endpoint that says the prompt does not fit: the policy's next cut
            msgs = [self.messages[i] for i in keep]
            if reasons and starts_inside(self.backend.apply_chat_template(msgs, True, self.template_vars)):
                lead = "" if written else OPEN  # the prompt opens the thinking: a resumed reply's tag is in it
                resume = written[len(OPEN):].lstrip() if written.startswith(OPEN) else written
            try:
                if self.scheduler is not None:
                    from app.server_jobs import local_steps
                    steps = local_steps(self.scheduler, msgs, {**sampling, "template_vars": self.template_vars,
                                                               "resume": resume}, cancel)
                else:
                    steps = self.backend.generate(msgs, cancel=cancel, prompt_progress=True,
                                                  template_vars=self.template_vars, resume=resume, **sampling)
                break
            except ContextOverflowError:
                if keep is tries[-1]:
                    raise
        self.reply = Reply(lead, None, n - len(keep), 0, plan)
        return self._written(steps, written, reasons)

    def _written(self, steps: Iterator, written: str, reasons: bool) -> Iterator:
        reply, splitter = self.reply, ThinkSplitter()
        splitter.push(written + reply.text)  # where the reply stands before its first new token
        try:
            for step in steps:
                if prompt_progress(step) is None:
                    reply.step, reply.text = step, reply.text + step.text
                    if reasons and step.token_id is not None:  # a token of the reply (not its end token)
                        was_inside = splitter.inside
                        splitter.push(step.text)
                        reply.thinking_tokens += was_inside or splitter.inside
                yield step
        finally:
            steps.close()
            self.messages.append({"role": "assistant", "content": written + reply.text})

