"""Issue 47 item 9: a file longer than the context goes to the model as its passages most relevant
to the question (BM25 over the file's lines), each cited by its lines, instead of a refusal."""
from __future__ import annotations

import re

import pytest
import test_ui_main_window as M

from app import settings as S
from app.attachments import Attachment
from app.history import History
from app.passages import bm25, excerpt, split

home, tiny = M.home, M.tiny
pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


def long_text(lines: int = 120, at: int = 87) -> str:
    filler = ["weather report: rain in the morning, sun later", "the train left the station on time",
              "prices rose a little this quarter", "a quiet evening in the old town"]
    return "\n".join("The secret harbour is called Vellmora." if n == at else f"{n}. {filler[n % 4]}"
                     for n in range(1, lines + 1))


def window(qtbot, tiny, context: int):
    from ui.main_window import MainWindow
    settings = S.load()
    settings.model, settings.engine = tiny, {"context_length": context, "threads": 1}
    settings.sampling = {"temperature": 0.0, "max_tokens": 4}
    w = MainWindow(settings, History())
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.flow.ready, timeout=300_000):
        w.flow.start()
    return w


def test_passages_are_whole_lines_and_the_relevant_one_ranks_first():
    passages = split(long_text(), 200)
    assert [p.first for p in passages[1:]] == [p.last + 1 for p in passages[:-1]]  # every line, once
    assert "\n".join(p.text for p in passages) == long_text()
    scores = bm25("Which harbour is secret?", passages)
    best = passages[scores.index(max(scores))]
    assert best.first <= 87 <= best.last and "Vellmora" in best.text
    assert excerpt(Attachment("a.txt", "text", "one very long line " * 500, 2500), "line", 100) is None  # one passage


def test_a_file_longer_than_the_context_sends_its_relevant_passages(qtbot, home, tiny, tmp_path):
    w = window(qtbot, tiny, 512)  # the tiny model holds 256; the file is about 3,300 tokens
    log = tmp_path / "log.txt"
    log.write_text(long_text())
    w.input.setPlainText("Which harbour is secret?")
    key = w.attach(log)
    qtbot.waitUntil(lambda: key in w.tray.excerpts and w.draft_plan is not None and w.draft_plan.fits,
                    timeout=60_000)
    e = w.tray.excerpts[key]
    assert 1 <= e.sent < e.total and w.tray.warning.text() == ""
    assert f"{e.sent} of {e.total} passages sent" in w.tray._chips[key][1].text()
    M.send(qtbot, w, "Which harbour is secret?")
    (user, _) = w.history.messages(w.conv_id)
    sent = user.attachments[0]["text"]
    assert "Vellmora" in sent and len(sent) < len(long_text()) / 2
    cited = re.findall(r"\[log\.txt, lines? (\d+)(?:–(\d+))?\]", sent.split("Vellmora")[0])[-1]
    assert int(cited[0]) <= 87 <= int(cited[1] or cited[0])  # the citation points at the line it quotes
    w.close()
