"""An API key goes only where it belongs: the local server's key (COLIBRI_API_KEY) never leaves for a
remote endpoint, a stored key only to the endpoint it was stored for, never inside an address in the
settings, never into a plain-text keyring, and not over plain http to another machine unasked.

The endpoints are real HTTP servers on loopback ports that record each request's Authorization
header, asked through the official openai client (app.remote.list_models)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import keyring
import pytest
from keyring.backend import KeyringBackend
from test_remote import MemoryKeyring

from app import remote as R


class _Recorder(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.seen.append(self.headers.get("Authorization"))
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "x"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def endpoints():
    """Two endpoints: the one a key was stored for and a mistyped neighbour."""
    servers = []
    for _ in range(2):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        srv.seen = []
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    yield [(f"http://127.0.0.1:{s.server_address[1]}/v1", s.seen) for s in servers]
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.fixture
def vault():
    before = keyring.get_keyring()
    kr = MemoryKeyring()
    keyring.set_keyring(kr)
    yield kr
    keyring.set_keyring(before)


def test_the_local_servers_key_and_a_stored_key_reach_only_their_own_endpoint(endpoints, vault, monkeypatch):
    (mine, seen_mine), (typo, seen_typo) = endpoints
    monkeypatch.setenv("COLIBRI_API_KEY", "the-local-servers-key")
    R.store_key(mine, "sk-mine")
    assert [m.id for m in R.list_models(typo)] == ["m"]
    assert [m.id for m in R.list_models(mine)] == ["m"]
    assert seen_typo == [f"Bearer {R.NO_KEY}"]
    assert seen_mine == ["Bearer sk-mine"]
    assert R.api_key(typo) is None and R.api_key(typo, "typed") == "typed"


def test_an_address_with_a_user_and_password_is_refused_and_never_kept(tmp_path):
    from app import settings as S
    with pytest.raises(R.RemoteError, match="user name or password in the address"):
        R.normalize_url("http://me:sk-secret@10.0.0.7:8000/v1")
    (tmp_path / "settings.json").write_text(json.dumps({"remote": {"url": "http://me:sk-old@h:1/v1", "model": "m"}}))
    s = S.load(tmp_path / "settings.json")
    assert s.remote == {"model": "m"}
    s.remote = {"url": "http://me:sk-new@h:1/v1", "model": "m"}
    s.save()
    assert "sk-new" not in (tmp_path / "settings.json").read_text()


class PlaintextKeyring(KeyringBackend):
    """As keyrings.alt.file.PlaintextKeyring: the keys in a readable file."""
    priority = 1

    def __init__(self, path):
        super().__init__()
        self.path = path

    def get_password(self, service, username):
        return json.loads(self.path.read_text()).get(username) if self.path.exists() else None

    def set_password(self, service, username, password):
        doc = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.path.write_text(json.dumps(doc | {username: password}))

    def delete_password(self, service, username):
        pass


def test_a_plain_text_keyring_is_refused(tmp_path):
    before = keyring.get_keyring()
    keyring.set_keyring(PlaintextKeyring(tmp_path / "keys.json"))
    try:
        with pytest.raises(R.RemoteError, match="keeps keys in plain text.*this session only"):
            R.store_key("http://h:1/v1", "sk-secret")
        assert not (tmp_path / "keys.json").exists()
        (tmp_path / "keys.json").write_text(json.dumps({"http://h:1/v1": "sk-planted"}))
        assert R.stored_key("http://h:1/v1") is None
    finally:
        keyring.set_keyring(before)


@pytest.mark.qt_log_level_fail("WARNING")
@pytest.mark.parametrize("url,warned", [("http://10.0.0.7:8000/v1", True), ("http://127.0.0.1:8000/v1", False),
                                        ("https://10.0.0.7:8000/v1", False), ("http://localhost:8000/v1", False)])
def test_the_dialog_warns_before_a_key_goes_over_plain_http_to_another_machine(qtbot, tmp_path, vault, url, warned):
    from app import settings as S
    from ui.remote_dialog import RemoteDialog
    dialog = RemoteDialog(S.load(tmp_path / "settings.json"))
    qtbot.addWidget(dialog)
    chosen = []
    dialog.chosen.connect(lambda *a: chosen.append(a))
    dialog.url.setText(url)
    dialog.key.setText("sk-typed")
    dialog.connect_button.click()
    if warned:
        assert chosen == [] and "unencrypted" in dialog.status.text() and "Press Connect again" in dialog.status.text()
        dialog.connect_button.click()
    assert chosen == [(url, "", "sk-typed")]
    assert R.plain_http_to_another_machine(url) is warned
