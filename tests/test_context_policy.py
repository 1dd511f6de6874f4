"""The context policy: which messages are sent when a chat outgrows the context (no Qt, no engine)."""
import pytest

from app.chat_session import ContextPlan, plan, reply_room


def chat(n_exchanges: int, system: bool = True, size: int = 10) -> list[dict]:
    msgs = [{"role": "system", "content": "s" * size}] if system else []
    for i in range(n_exchanges):
        msgs += [{"role": "user", "content": f"{i}" * size}, {"role": "assistant", "content": f"{i}" * size}]
    return msgs + [{"role": "user", "content": "q" * size}]


calls: list[int] = []


def count(msgs: list[dict]) -> int:
    """A template-like count: 4 tokens of structure per message plus one per character."""
    calls.append(len(msgs))
    return sum(4 + len(m["content"]) for m in msgs)


def test_everything_is_sent_when_it_fits():
    msgs = chat(3)
    p = plan(msgs, count, limit=1000, policy="drop_oldest")
    assert p == ContextPlan("drop_oldest", tuple(range(len(msgs))), (), count(msgs), 1000, True)
    assert p.marker_before is None


def test_drop_oldest_keeps_the_system_prompt_and_drops_whole_exchanges():
    msgs = chat(10)  # 22 messages of 14 tokens: 308
    p = plan(msgs, count, limit=120, policy="drop_oldest", room=20)
    assert p.fits and p.keep[0] == 0 and p.keep[-1] == len(msgs) - 1
    assert p.dropped == tuple(range(1, p.dropped[-1] + 1))  # one run right after the system prompt
    assert msgs[p.marker_before]["role"] == "user"  # the kept part starts with a user turn
    assert p.tokens + 20 <= 120 and p.tokens == count([msgs[i] for i in p.keep])
    # the smallest cut: one exchange fewer dropped would not fit
    bigger = [0] + list(range(p.marker_before - 2, len(msgs)))
    assert count([msgs[i] for i in bigger]) + 20 > 120


def test_keep_first_keeps_the_first_exchange_and_drops_the_middle():
    msgs = chat(10)
    p = plan(msgs, count, limit=120, policy="keep_first", room=20)
    assert p.fits and p.keep[:3] == (0, 1, 2) and p.dropped[0] == 3
    assert msgs[p.marker_before]["role"] == "user" and p.marker_before == p.dropped[-1] + 1


def test_without_a_system_prompt_the_first_message_can_go():
    msgs = chat(6, system=False)
    p = plan(msgs, count, limit=60, policy="drop_oldest", room=10)
    assert p.fits and p.dropped[0] == 0 and msgs[p.keep[0]]["role"] == "user"


def test_stop_sends_everything_and_says_it_does_not_fit():
    msgs = chat(10)
    p = plan(msgs, count, limit=120, policy="stop", room=20)
    assert not p.fits and p.dropped == () and p.keep == tuple(range(len(msgs)))


def test_a_question_too_long_for_any_cut_does_not_fit():
    msgs = chat(3) + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "x" * 500}]
    for policy in ("drop_oldest", "keep_first"):
        p = plan(msgs, count, limit=200, policy=policy, room=10)
        assert not p.fits and p.keep[-1] == len(msgs) - 1  # the question itself is never dropped


def test_counting_is_a_bisection_not_a_scan():
    msgs = chat(200)
    calls.clear()
    p = plan(msgs, count, limit=300, policy="drop_oldest", room=10)
    assert p.fits and len(calls) <= 12  # 1 whole + 1 smallest + log2(200) probes


def test_reply_room_and_bad_policy():
    assert reply_room(4096) == 512 and reply_room(256) == 32 and reply_room(4) == 1
    with pytest.raises(ValueError, match="context policy 'newest'.*drop_oldest"):
        plan(chat(1), count, 100, "newest")
