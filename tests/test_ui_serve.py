"""View → Server → Serve on localhost: the loaded model behind colibri-serve, from the chat window."""
from __future__ import annotations

import socket
import urllib.parse

import pytest
from test_ui_main_window import home, open_window, send, tiny  # noqa: F401 - fixtures

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


def test_the_switch_serves_the_loaded_model_and_stops(qtbot, home, tiny):  # noqa: F811
    from openai import OpenAI
    w = open_window(qtbot, tiny)
    w.settings.ui["serve_port"] = 0  # any free port: the label shows the one taken
    w.serve_action.trigger()  # (the worker's answer is waited for on this thread: it arrives queued)
    qtbot.waitUntil(lambda: bool(w.server_url), timeout=30_000)
    assert w.serve_action.isChecked() and w.server_label.isVisible() and w.server_url in w.server_label.text()
    url = urllib.parse.urlparse(w.server_url)
    assert url.hostname == "127.0.0.1"  # loopback only from the GUI
    client = OpenAI(base_url=w.server_url, api_key="unused", max_retries=0, timeout=60)
    (model,) = [m.id for m in client.models.list()]
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4, temperature=0)
    assert reply.choices[0].message.content and reply.usage.completion_tokens <= 4
    send(qtbot, w, "and the chat still works")  # chat and server share the engine, one reply at a time
    assert w.history.messages(w.conv_id)[-1].role == "assistant"
    w.serve_action.trigger()
    qtbot.waitUntil(lambda: not w.server_url and not w.server_label.isVisible(), timeout=30_000)
    assert not w.serve_action.isChecked()
    with pytest.raises(OSError):  # the port is closed again
        socket.create_connection((url.hostname, url.port), timeout=2).close()
    w.close()


def test_a_taken_port_is_a_dialog_and_the_switch_stays_off(qtbot, home, tiny):  # noqa: F811
    from test_ui_main_window import dialogs
    w = open_window(qtbot, tiny)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        w.settings.ui["serve_port"] = taken.getsockname()[1]
        w.serve_action.trigger()
        qtbot.waitUntil(lambda: bool(dialogs("error_dialog")), timeout=30_000)
        assert "could not start" in dialogs("error_dialog")[0].text() + dialogs("error_dialog")[0].informativeText()
        assert not w.serve_action.isChecked() and not w.server_url
        for d in dialogs("error_dialog"):
            d.close()
    finally:
        taken.close()
    w.close()
