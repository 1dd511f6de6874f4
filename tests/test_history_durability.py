"""Killing the app (SIGKILL) while a reply streams loses at most the last second of that reply: a
real subprocess running the chat window is killed mid-stream and its history database opened
again, which shows the reply so far as an interrupted one."""
from __future__ import annotations

import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import HF_FIXTURES

from app.history import History


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.convert.convert import convert
    return str(convert(HF_FIXTURES / "qwen2", tmp_path_factory.mktemp("kill") / "qwen2", "keep").path)


def test_sigkill_mid_reply_keeps_every_earlier_message(tmp_path, tiny):
    # NUMBA_CACHE_DIR is this session's (engine.kernels.setup(), conftest): the child reuses its compiled kernels
    env = os.environ | {"COLIBRI_HOME": str(tmp_path), "QT_QPA_PLATFORM": "offscreen",
                        "PYTHONPATH": str(Path(__file__).parent.parent)}
    child = subprocess.Popen([sys.executable, str(Path(__file__).parent / "history_kill_child.py"), tiny],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x.strip()) for x in child.stdout], daemon=True).start()
    seen = []
    try:
        while "partial saved" not in seen:  # the child's stages, as they happen
            try:
                seen.append(lines.get(timeout=180))
            except queue.Empty:
                pytest.fail("the child never streamed its third reply:\n" + "\n".join(seen[-30:]))
        time.sleep(0.3)  # a few more tokens, not yet saved: those are what the kill loses
        assert child.poll() is None, "the reply ended before the kill"
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
    db = next(tmp_path.rglob("history.db"))
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    raw.close()
    h = History(db)
    assert h.notice is None  # not set aside: it opened as it was
    msgs = h.messages(h.conversations()[0].id)
    assert [(m.role, m.content) for m in msgs if m.role == "user"] == [
        ("user", "first question"), ("user", "second question"), ("user", "third question")]
    assert [m.role for m in msgs] == ["user", "assistant"] * 3  # the third reply as far as it was saved
    assert all(m.stats["generated_tokens"] == 3 for m in msgs[:4] if m.role == "assistant")
    partial = msgs[-1]
    assert partial.stats["finish_reason"] == "interrupted" and partial.stats["partial"]
    assert 0 < partial.stats["generated_tokens"] < 200  # what was saved before the kill; the rest lost
    assert partial.facts["sampling"]["max_tokens"] == 200 and partial.parent_id == msgs[-2].id
    assert h.recovered == 1
