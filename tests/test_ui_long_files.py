"""Issue 47 item 9: a file longer than the context goes to the model as its passages most relevant
to the question (BM25 over the file's lines), each cited by its lines, instead of a refusal."""
from __future__ import annotations

import pytest
import test_ui_main_window as M
from test_ui_context import small_window

from app.attachments import Attachment
from app.passages import bm25, excerpt, split

home, tiny = M.home, M.tiny
pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


def long_text(lines: int = 120, at: int = 87) -> str:
    filler = ["weather report: rain in the morning, sun later", "the train left the station on time",
              "prices rose a little this quarter", "a quiet evening in the old town"]
    return "\n".join("The secret harbour is called Vellmora." if n == at else f"{n}. {filler[n % 4]}"
                     for n in range(1, lines + 1))


def test_passages_are_whole_lines_and_the_relevant_one_ranks_first():
    passages = split(long_text(), 200)
    assert [p.first for p in passages[1:]] == [p.last + 1 for p in passages[:-1]]  # every line, once
    assert "\n".join(p.text for p in passages) == long_text()
    scores = bm25("Which harbour is secret?", passages)
    best = passages[scores.index(max(scores))]
    assert best.first <= 87 <= best.last and "Vellmora" in best.text
    assert excerpt(Attachment("a.txt", "text", "one very long line " * 500, 2500), "line", 100) is None  # one passage


def test_a_file_longer_than_the_context_sends_its_relevant_passages(qtbot, home, tiny, tmp_path):
    w = small_window(qtbot, tiny)  # a context of 192 tokens
    log = tmp_path / "log.txt"
    log.write_text(long_text())
    w.input.setPlainText("Which harbour is secret?")
    key = w.attach(log)
    qtbot.waitUntil(lambda: key in w.tray.excerpts and w.draft_plan is not None and w.draft_plan.fits,
                    timeout=20_000)
    e = w.tray.excerpts[key]
    assert 1 <= e.sent < e.total and w.tray.warning.text() == ""
    assert f"{e.sent} of {e.total} passages sent" in w.tray._chips[key][1].text()
    M.send(qtbot, w, "Which harbour is secret?")
    (user, _) = w.history.messages(w.conv_id)
    sent = user.attachments[0]["text"]
    assert "Vellmora" in sent and "[log.txt, lines " in sent and len(sent) < len(long_text()) / 2
    cited = sent.split("Vellmora")[0].rsplit("[log.txt, lines ", 1)[1].split("]")[0]
    first, last = (int(n) for n in cited.split("–"))
    assert first <= 87 <= last  # the citation points at the line it quotes
    w.close()
