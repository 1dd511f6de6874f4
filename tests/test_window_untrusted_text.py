"""What a remote endpoint and model text can do in the window: an endpoint's stream is cut at the
reply's max_tokens in pieces and in bytes, odd `timings` are ignored rather than ending a reply with a
raw error, error dialogs show text as text (no rich text, no links), and a link a model writes can
only open an http(s) page: the view's own actions carry a token the model never sees.

The endpoints are real HTTP servers on loopback ports speaking server-sent events, asked by
RemoteBackend through the official openai client."""
from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QLabel, QWidget

from app import remote as R
from app.history import Message

HI = [{"role": "user", "content": "Hi"}]


def chunk(content: str | None = None, finish: str | None = None, **extra) -> bytes:
    doc = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
           "choices": [{"index": 0, "delta": {"content": content} if content is not None else {},
                        "finish_reason": finish}], **extra}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class _Endpoint(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "x"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for piece in self.server.script():
                self.wfile.write(piece)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.server.hung_up.set()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def endpoint():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    srv.hung_up = threading.Event()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("piece", ["tok ", "x" * 100_000], ids=["endless pieces", "huge pieces"])
def test_an_endless_stream_is_cut_at_max_tokens(endpoint, piece):
    srv, url = endpoint
    srv.script = lambda: (chunk(piece) for _ in range(20_000_000 // len(piece)))  # far past max_tokens, no finish
    with R.RemoteBackend(url) as rb:
        t0 = time.monotonic()
        steps = list(rb.generate(HI, temperature=0.0, max_tokens=5))
        assert time.monotonic() - t0 < 30
    text = "".join(s.text for s in steps)
    assert len([s for s in steps if s.text]) <= 5 and len(text.encode()) <= R.BYTES_PER_TOKEN * 5
    assert steps[-1].finish_reason == "length"
    assert srv.hung_up.wait(10)  # the connection was closed, not read to its end


def test_odd_timings_and_usage_end_a_reply_normally(endpoint):
    srv, url = endpoint
    odd = {"timings": {"predicted_per_second": "fast", "prompt_per_second": [1], "cache_n": "lots"},
           "usage": {"prompt_tokens": "many", "completion_tokens": -3, "total_tokens": None}}
    srv.script = lambda: [chunk("Hello"), chunk(" there"), chunk(None, "stop", **odd), b"data: [DONE]\n\n"]
    with R.RemoteBackend(url) as rb:
        steps = list(rb.generate(HI, max_tokens=8))
        assert "".join(s.text for s in steps) == "Hello there" and steps[-1].finish_reason == "stop"
        snap = rb.stats()
        assert snap.remote.figures == "measured here" and snap.decode_tok_s >= 0
        assert steps[-1].prompt_tokens == 0 and steps[-1].generated_tokens == 2


@pytest.mark.qt_log_level_fail("WARNING")
@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_error_dialogs_show_text_as_text(qtbot, tmp_path):
    from ui.model_flow import show_error
    parent = QWidget()
    qtbot.addWidget(parent)
    box = show_error(parent, "Loading the model", '<a href="version:1:1">click here</a> <b>now</b>')
    labels = [lab for lab in box.findChildren(QLabel) if lab.text()]
    assert any("click here" in lab.text() for lab in labels)
    assert all(lab.textFormat() == Qt.PlainText for lab in labels)
    box.close()
    from app import settings as S
    from ui.remote_dialog import RemoteDialog
    dialog = RemoteDialog(S.load(tmp_path / "settings.json"))
    qtbot.addWidget(dialog)
    assert dialog.status.textFormat() == Qt.PlainText  # where an endpoint's error text is said


@pytest.mark.qt_log_level_fail("WARNING")
def test_a_link_in_model_text_cannot_act_inside_the_window(qtbot, monkeypatch):
    from PySide6.QtGui import QDesktopServices

    from ui import chat_view, theme
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toString()))
    view = chat_view.ChatView(theme.palette("light"), 11)
    qtbot.addWidget(view)
    hostile = "[see](version:1:1) [edit](edit:1) [copy](copymsg:1) [site](https://example.org/x)"
    view.set_messages([Message(1, 1, "user", "Hi", 0.0), Message(2, 1, "assistant", hostile, 0.0, {}, 1)])
    acted = []
    for signal in (view.version_requested, view.edit_requested, view.copy_requested):
        signal.connect(lambda *a: acted.append(a))
    for href in ("version:1:1", "edit:1", "copymsg:1", "regenerate:"):
        view.anchorClicked.emit(QUrl(href))  # what clicking the model's links sends
    assert acted == []
    view.anchorClicked.emit(QUrl("https://example.org/x"))
    assert opened == ["https://example.org/x"]
    own = [h for h in re.findall(r'href="([^"]+)"', view.toHtml()) if h.endswith(":edit:1")]
    assert own, "the view's own Edit link"
    view.anchorClicked.emit(QUrl(own[0]))
    assert acted == [(1,)]
