"""Issue 47 item 8: the server panel — on/off, port, the address with a copy button, serving on the
local network with a generated API key, and a live log of the requests the server answers."""
from __future__ import annotations

import urllib.parse

import openai
import pytest
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QPushButton
from test_ui_main_window import home, open_window, tiny  # noqa: F401 - fixtures

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


def rows(panel) -> list[list[str]]:
    t = panel.log
    return [[t.item(r, c).text() for c in range(t.columnCount())] for r in range(t.rowCount())]


def test_the_panel_serves_on_the_network_with_a_key_and_logs_each_request(qtbot, home, tiny):  # noqa: F811
    w = open_window(qtbot, tiny)
    panel = w.open_server_panel()
    assert panel.isVisible() and not panel.serve.isChecked() and not panel.key_row.isVisible()
    panel.port.setValue(0)  # any free port
    panel.lan.setChecked(True)
    panel.serve.setChecked(True)
    qtbot.waitUntil(lambda: bool(panel.address.text()), timeout=30_000)
    key = panel.key.text()
    assert len(key) >= 24 and panel.key_row.isVisible() and w.serve_action.isChecked()
    port = urllib.parse.urlparse(panel.address.text()).port
    assert panel.address.text() == w.server_url and port

    panel.findChild(QPushButton, "copy_address").click()
    assert QGuiApplication.clipboard().text() == panel.address.text()
    base = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(openai.AuthenticationError):  # on the network, a request without the key is refused
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0, timeout=30).models.list()
    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)
    (model,) = [m.id for m in client.models.list()]
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=3, temperature=0)
    qtbot.waitUntil(lambda: len(rows(panel)) == 3, timeout=10_000)
    chat, listed, refused = rows(panel)  # the newest first
    assert chat[1:4] == ["POST", "/v1/chat/completions", "200"]
    assert chat[5] == f"{reply.usage.prompt_tokens} → {reply.usage.completion_tokens}"
    assert listed[1:4] == ["GET", "/v1/models", "200"] and listed[5] == ""
    assert refused[1:4] == ["GET", "/v1/models", "401"]

    panel.serve.setChecked(False)
    qtbot.waitUntil(lambda: panel.address.text() == "" and not w.server_url, timeout=30_000)
    assert not w.serve_action.isChecked()
    w.close()
