"""The chat app, to be killed: two exchanges are written, then a third reply streams until the
parent test SIGKILLs this process, once the reply so far has been saved (tests/test_history_durability.py). Prints one line per stage.

Its engine writes a token every 20 ms (a sleep wrapped around Engine.generate), so "streaming"
lasts long enough for the kill to land mid-reply; everything else is the app's own code."""
from __future__ import annotations

import sys
import time

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app import settings as S
from app.history import History
from engine import kernels

kernels.setup()  # before engine.api
from engine.api import Engine  # noqa: E402

_generate = Engine.generate


def slow_generate(self, *args, **kwargs):
    for step in _generate(self, *args, **kwargs):
        if step.kind == "token":
            time.sleep(0.02)
        yield step


def main(model: str) -> None:
    Engine.generate = slow_generate
    app = QApplication(sys.argv[:1])
    from ui.main_window import MainWindow
    settings = S.load()
    settings.model = model
    settings.sampling = {"temperature": 0.0, "max_tokens": 3}
    w = MainWindow(settings, History())
    w.show()
    prompts = ["first question", "second question", "third question"]

    def tick() -> None:
        """On the GUI thread, every 20 ms: the next question once the window is idle, then say when
        the third reply streams."""
        if w.flow.model is None or w.busy:
            if w.request == 3 and w.view.streaming:
                print("streaming", flush=True)
                if w.history.db.execute("SELECT COUNT(*) FROM partial_replies").fetchone()[0]:
                    print("partial saved", flush=True)  # the reply so far is in the database
            return
        if prompts:
            text = prompts.pop(0)
            if text == "third question":
                w.history.set_options(w.conv_id, "", {"max_tokens": 200, "temperature": 0.0})
            w.send(text)
            print(f"sent {text}", flush=True)
    timer = QTimer(objectName="kill_child_timer", interval=20)
    timer.timeout.connect(tick)
    timer.start()
    w.flow.start()
    app.exec()


if __name__ == "__main__":
    main(sys.argv[1])
