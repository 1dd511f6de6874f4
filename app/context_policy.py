"""Which messages of a chat go to the model when the chat no longer fits its context.

Three policies, chosen per chat: "stop" (send everything or nothing: the user decides),
"drop_oldest" (leave out the oldest exchanges, the system prompt stays) and "keep_first" (the
system prompt and the first exchange stay, the middle goes). Pure logic over message dicts and a
token-counting function, so it is tested without Qt or an engine; the worker counts with the
loaded model's template and the UI draws the marker where `ContextPlan.marker_before` says.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
        if not self.dropped:
            return None
        return self.dropped[-1] + 1


def _protected(messages: Sequence[dict], policy: str) -> tuple[int, int]:
    """The droppable run [start, end): after the system prompt (and the first exchange for
    keep_first), before the last user message (the question being asked) and what follows it."""
    first = 1 if messages and messages[0].get("role") == "system" else 0
    end = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages))
    if policy == "keep_first":
        first += 2 if first + 1 < end and messages[first + 1].get("role") == "assistant" else 1
    return first, max(first, end)


def plan(messages: Sequence[dict], count: Callable[[list[dict]], int], limit: int,
         policy: str = DEFAULT_POLICY, room: int | None = None) -> ContextPlan:
    """The messages to send so that prompt + `room` tokens for the reply fit in `limit`.

    Drops whole exchanges (the kept part after the gap starts with a user message, as templates
    that insist on user/assistant turns want). Dropping more never costs more tokens, so the
    smallest cut that fits is found by bisection: O(log n) calls of `count`."""
    if policy not in POLICIES:
        raise ValueError(f"context policy {policy!r}: expected one of {', '.join(POLICIES)}")
    room = reply_room(limit) if room is None else room
    everything = list(range(len(messages)))
    total = count(list(messages))
    if total + room <= limit or policy == "stop":
        return ContextPlan(policy, tuple(everything), (), total, limit, total + room <= limit)
    start, end = _protected(messages, policy)
    # the cut points: drop messages[start:cut]; the message at `cut` must be a user's (or the end)
    cuts = [c for c in range(start + 1, end + 1) if c == end or messages[c].get("role") == "user"]

    def kept(cut: int) -> list[int]:
        return everything[:start] + everything[cut:]

    def tokens(cut: int) -> int:
        return count([messages[i] for i in kept(cut)])

    if not cuts:
        return ContextPlan(policy, tuple(everything), (), total, limit, False)
    lo, hi = 0, len(cuts) - 1
    if tokens(cuts[hi]) + room > limit:  # even the smallest prompt the policy allows is too long
        cut = cuts[hi]
        return ContextPlan(policy, tuple(kept(cut)), tuple(range(start, cut)), tokens(cut), limit, False)
    while lo < hi:  # the first cut that fits
        mid = (lo + hi) // 2
        if tokens(cuts[mid]) + room <= limit:
            hi = mid
        else:
            lo = mid + 1
    cut = cuts[lo]
    return ContextPlan(policy, tuple(kept(cut)), tuple(range(start, cut)), tokens(cut), limit, True)
