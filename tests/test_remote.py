"""Remote backends with real parts: a real colibri-serve on a free loopback port is the endpoint;
Colibri's RemoteBackend, colibri-cli --remote and the chat window talk to it with the official
openai client. The reference for every reply is the same model run here, directly.

The OS keyring is absent on a test machine: the keyring library gets an in-memory backend at its
own boundary (keyring.set_keyring), the way a desktop's Secret Service would be.
"""
from __future__ import annotations

import json
import logging
import threading
import time

import keyring
import openai
import pytest
from conftest import HF_FIXTURES
from keyring.backend import KeyringBackend
from keyring.errors import PasswordDeleteError

from app import remote as R
from app import server as S
from engine.api import ContextOverflowError, Engine

GREEDY = {"temperature": 0.0, "max_tokens": 12}
HI = [{"role": "user", "content": "Hi"}]


class MemoryKeyring(KeyringBackend):
    priority = 1

    def __init__(self):
        super().__init__()
        self.entries: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.entries.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.entries[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        if self.entries.pop((service, username), None) is None:
            raise PasswordDeleteError("no such entry")


@pytest.fixture
def vault(monkeypatch):
    monkeypatch.delenv("COLIBRI_API_KEY", raising=False)
    before = keyring.get_keyring()
    kr = MemoryKeyring()
    keyring.set_keyring(kr)
    yield kr
    keyring.set_keyring(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.convert.convert import convert
    return convert(HF_FIXTURES / "qwen2", tmp_path_factory.mktemp("remote") / "qwen2", "keep").path


@pytest.fixture(scope="module")
def engine(tiny):
    eng = Engine(tiny, threads=1)
    eng.warmup()
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine):
    handle = S.start(engine, "127.0.0.1", 0)
    yield handle
    handle.stop()


def local(engine, prompt, **sampling) -> str:
    return "".join(s.text for s in engine.generate(prompt, **(GREEDY | sampling)))


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the backend -----------------------------------------------------------------------------
def test_models_come_from_the_endpoint_and_replies_equal_the_model_run_here(server, engine, vault):
    (card,) = R.list_models(server.url)
    assert card == R.RemoteModel(server.model_id, "colibri", engine.context_limit)
    with R.RemoteBackend(server.url) as rb:
        assert rb.model_id == server.model_id and rb.context_limit == engine.context_limit
        steps = list(rb.generate(HI, **GREEDY))
        assert len([s for s in steps if s.text]) >= 3  # streamed, not one lump
        assert "".join(s.text for s in steps) == local(engine, HI)
        last = steps[-1]
        assert last.finish_reason == "length" and last.generated_tokens == GREEDY["max_tokens"]
        assert last.prompt_tokens == len(engine.prompt_ids(HI))  # the endpoint's usage
        assert last.context_used == last.prompt_tokens + last.generated_tokens
        raw = "".join(s.text for s in rb.generate("1, 2, 3,", **GREEDY))  # /v1/completions
        assert raw == local(engine, "1, 2, 3,")
        snap = rb.stats()
        assert snap.remote.url == server.url and snap.remote.requests == 2 and snap.remote.errors == 0
        assert snap.remote.completion_tokens == GREEDY["max_tokens"] and snap.tokens_generated == 24
        assert snap.model == server.model_id and "remote" in snap.architecture and snap.decode_tok_s > 0


def test_sampling_values_and_stop_strings_reach_the_endpoint(server, engine, vault):
    with R.RemoteBackend(server.url, server.model_id) as rb:
        seeded = {"temperature": 1.0, "top_k": 5, "min_p": 0.05, "repeat_penalty": 1.1, "seed": 7,
                  "max_tokens": 12}
        assert "".join(s.text for s in rb.generate(HI, **seeded)) == local(engine, HI, **seeded)
        whole = local(engine, HI)
        stop = whole[4:7]
        cut = list(rb.generate(HI, stop=[stop], **GREEDY))
        assert "".join(s.text for s in cut) == whole[:whole.index(stop)] and cut[-1].finish_reason == "stop"
        rb.set_param("max_tokens", 3)  # a sampling setting becomes the backend's default
        rb.set_param("threads", 1)  # an engine setting is the endpoint's business: accepted, not applied
        assert list(rb.generate(HI, temperature=0.0))[-1].generated_tokens == 3


def test_stop_closes_the_stream_and_frees_the_endpoint_at_once(server, engine, vault, caplog):
    cancel = threading.Event()
    with caplog.at_level(logging.INFO, logger="colibri.server"), R.RemoteBackend(server.url) as rb:
        steps = []
        for step in rb.generate(HI, cancel=cancel, temperature=0.0, max_tokens=200):
            steps.append(step)
            if len(steps) == 3:
                cancel.set()
        assert steps[-1].finish_reason == "cancelled" and len(steps) < 20
        t0 = time.monotonic()
        assert "".join(s.text for s in rb.generate(HI, **GREEDY)) == local(engine, HI)
        assert time.monotonic() - t0 < 30
        deadline = time.monotonic() + 5
        while not any("request cancelled after" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the endpoint went on generating for a client that left"
            time.sleep(0.05)


def test_errors_are_said_in_plain_words(server, engine, vault):
    closed = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(R.RemoteError, match=r"cannot reach .*Is the server running"):
        R.RemoteBackend(closed)
    with pytest.raises(R.RemoteError, match=r"has no model 'gpt-4o'; it serves " + server.model_id):
        R.RemoteBackend(server.url, "gpt-4o")
    with pytest.raises(R.RemoteError, match="not an http"):
        R.normalize_url("ftp://example.org")
    assert R.normalize_url("127.0.0.1:8080") == "http://127.0.0.1:8080/v1"
    locked = S.start(engine, "127.0.0.1", 0, api_key="right")
    try:
        with pytest.raises(R.RemoteError, match=r"refused the API key \(401"):
            R.RemoteBackend(locked.url, key="wrong")
        with pytest.raises(R.RemoteError, match=r"refused the API key"):
            R.list_models(locked.url)  # no key at all
        R.store_key(locked.url, "right")  # the keyring's key is used when none is given
        with R.RemoteBackend(locked.url) as rb:
            assert "".join(s.text for s in rb.generate(HI, **GREEDY)) == local(engine, HI)
            long = [{"role": "user", "content": "colibri " * 300}]  # more than the 256-token context
            with pytest.raises(ContextOverflowError, match=r"answered 400: the prompt is \d+ tokens"):
                rb.generate(long)  # the endpoint's own words, as the error the worker handles for a local model
            assert rb.stats().remote.errors == 1 and "the context is 256" in rb.stats().remote.last_error
    finally:
        locked.stop()


def test_the_key_lives_in_the_keyring_never_in_the_settings(vault, monkeypatch, tmp_path):
    from app import settings as S_
    url = "http://10.0.0.7:8000/v1"
    R.store_key(url, "sk-secret")
    assert vault.entries == {(R.KEYRING_SERVICE, url): "sk-secret"}
    assert R.api_key(url) == "sk-secret" and R.api_key(url + "/") == "sk-secret"
    monkeypatch.setenv("COLIBRI_API_KEY", "the-local-servers-key")  # colibri-serve's, never an endpoint's
    assert R.api_key(url) == "sk-secret" and R.api_key(url, "given") == "given"
    s = S_.load(tmp_path / "settings.json")
    s.remote = {"url": url, "model": "m", "key": "sk-secret"}  # a key put there by mistake is not written
    s.save()
    assert "sk-secret" not in (tmp_path / "settings.json").read_text()
    assert S_.load(tmp_path / "settings.json").remote == {"url": url, "model": "m"}
    R.store_key(url, "")  # forget it
    assert vault.entries == {}


def test_without_a_system_keyring_storing_says_so(monkeypatch):
    from keyring.backends import fail
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        assert R.stored_key("http://h:1/v1") is None
        with pytest.raises(R.RemoteError, match="could not be kept in the system keyring.*this session only"):
            R.store_key("http://h:1/v1", "k")
    finally:
        keyring.set_keyring(before)


# --- one line in front of the engine: the GUI's chat and the local server ---------------------
@pytest.mark.parametrize("chat_first", [True, False], ids=["chat-then-server", "server-then-chat"])
def test_a_chat_reply_and_a_server_request_overlapping_both_finish_intact(qapp, engine, vault, chat_first):
    from PySide6.QtCore import Qt

    from app.worker import EngineWorker
    n = 100
    alone_chat, alone_served = local(engine, HI, max_tokens=n), local(engine, "1, 2, 3,", max_tokens=n)
    worker = EngineWorker()
    worker.engine = engine
    worker.serve(True, 0)
    client = openai.OpenAI(base_url=worker.server.url, api_key="x", max_retries=0, timeout=120)
    started, replies, served, ended = threading.Event(), [], [], {}
    direct = Qt.DirectConnection  # emitted on this test's threads, where no event loop runs
    worker.text.connect(lambda r, t, s: started.set() if t else None, direct)
    worker.finished.connect(lambda r, reply: replies.append(reply), direct)

    def chat() -> None:
        worker.arm()
        worker.generate(1, HI, {"temperature": 0.0, "max_tokens": n})
        ended["chat"] = time.monotonic()

    def ask() -> None:
        stream = client.completions.create(model=worker.server.model_id, prompt="1, 2, 3,", stream=True,
                                           temperature=0, max_tokens=n)
        for chunk in stream:
            served.append(chunk.choices[0].text if chunk.choices else "")
            started.set()
        ended["ask"] = time.monotonic()
    first, second = (chat, ask) if chat_first else (ask, chat)
    try:
        a = threading.Thread(target=first)
        a.start()
        assert started.wait(60)  # the first reply is streaming…
        second_at = time.monotonic()
        b = threading.Thread(target=second)
        b.start()
        a.join(120)
        b.join(120)
    finally:
        worker.serve(False, 0)
    assert second_at < ended[first.__name__]  # …when the second one arrives
    assert replies[-1].text == alone_chat and replies[-1].step.finish_reason == "length"
    assert "".join(served) == alone_served


def test_the_chat_windows_stop_ends_a_remote_reply(qapp, server, engine, vault):
    from PySide6.QtCore import Qt

    from app.worker import EngineWorker
    worker = EngineWorker()
    worker.engine = R.RemoteBackend(server.url)
    replies, pieces = [], []

    def on_text(request: int, text: str, step) -> None:
        pieces.append(text)
        if len(pieces) == 2:
            worker.request_stop()  # what Stop (or Esc) does, from the GUI thread
    worker.text.connect(on_text, Qt.DirectConnection)
    worker.finished.connect(lambda r, reply: replies.append(reply), Qt.DirectConnection)
    try:
        worker.arm()
        worker.generate(1, HI, {"temperature": 0.0, "max_tokens": 200})
        # the worker coalesces text that arrives faster than the GUI repaints (under load the second
        # emission can carry a hundred pieces): ended before max_tokens is what Stop promises
        assert replies[-1].step.finish_reason == "cancelled" and replies[-1].step.generated_tokens < 200
        worker.arm()
        worker.generate(2, HI, dict(GREEDY))
        assert replies[-1].text == local(engine, HI) and replies[-1].step.finish_reason == "length"
    finally:
        worker.close()


def test_stop_while_waiting_for_the_server_leaves_the_line(engine):
    from app.server_jobs import Turns
    turns, cancel, order = Turns(), threading.Event(), []
    with turns.turn() as mine:
        assert mine
        waiter = threading.Thread(target=lambda: order.append(turns.turn(cancel).__enter__()))
        waiter.start()
        time.sleep(0.2)
        assert turns.waiting == 1 and order == []
        cancel.set()
        waiter.join(5)
        assert order == [False] and turns.waiting == 0
    with turns.turn(cancel) as mine:  # a set cancel does not keep a free engine from its caller
        assert mine


def test_a_served_request_does_not_wait_behind_a_chat_reply(engine):
    from app.server_jobs import Turns
    turns = Turns()
    handle = S.start(engine, "127.0.0.1", 0, turns=turns)
    try:
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=120)
        with turns.turn() as mine:  # a chat reply holds the line: batched requests take no turn
            assert mine
            out = client.completions.create(model=handle.model_id, prompt="1, 2,", max_tokens=5, temperature=0)
            assert out.choices[0].text == local(engine, "1, 2,", max_tokens=5) and turns.waiting == 0
        deadline = time.monotonic() + 10  # the slot is freed just after the last event is sent
        while handle.status()["busy"]:
            assert time.monotonic() < deadline, "the finished request still holds its slot"
            time.sleep(0.02)
        assert handle.status() == {"url": handle.url, "model": handle.model_id, "busy": False, "waiting": 0}
    finally:
        handle.stop()


# --- colibri-cli --remote --------------------------------------------------------------------
def test_cli_chats_through_the_endpoint(server, engine, vault, capsys):
    from app.cli_chat import main
    rc = main(["--remote", server.url, "--prompt", "Hi", "--temperature", "0", "--max_tokens", "12"])
    out = capsys.readouterr()
    assert rc == 0 and out.out.rstrip("\n") == local(engine, HI), out.err
    assert f"model: {server.model_id} at {server.url} (colibri)" in out.err and "12 tokens" in out.err
    rc = main(["--remote", server.url, "--model", "nope", "--prompt", "Hi"])
    assert rc == 1 and f"has no model 'nope'; it serves {server.model_id}" in capsys.readouterr().err
    rc = main(["--remote", f"http://127.0.0.1:{free_port()}", "--prompt", "Hi"])
    assert rc == 1 and "cannot reach" in capsys.readouterr().err


def test_cli_store_key_puts_the_key_in_the_keyring(vault, monkeypatch, capsys):
    from app.cli_chat import main
    monkeypatch.setattr("getpass.getpass", lambda prompt: "sk-typed")
    assert main(["--remote", "http://10.1.2.3:8000", "--store_key"]) == 0
    assert vault.entries == {(R.KEYRING_SERVICE, "http://10.1.2.3:8000/v1"): "sk-typed"}
    assert main(["--store_key"]) == 1 and "needs --remote" in capsys.readouterr().err


# --- the chat window -------------------------------------------------------------------------
@pytest.mark.qt_log_level_fail("WARNING")
@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_the_window_chats_through_a_remote_endpoint(qtbot, home, tiny, server, engine, vault):  # noqa: F811
    from test_ui_main_window import dialogs, open_window, send
    w = open_window(qtbot, str(tiny))
    dialog = w.open_remote_dialog()
    dialog.url.setText(server.url)
    dialog.key.setText("sk-gui")
    dialog.fetch()
    qtbot.waitUntil(lambda: dialog.model.count() == 1 and dialog.fetch_button.isEnabled(), timeout=30_000)
    assert dialog.model.currentText() == server.model_id and "serves 1 model" in dialog.status.text()
    dialog.connect_button.click()
    qtbot.waitUntil(lambda: (w.flow.model or "").startswith("remote: "), timeout=60_000)
    assert w.model_picker.currentText() == f"{server.model_id} at {server.url}"
    assert w.snapshot.remote.url == server.url
    send(qtbot, w, "Hi")
    reply = w.history.messages(w.conv_id)[-1]
    assert reply.role == "assistant" and reply.content == local(engine, HI, max_tokens=8)
    assert reply.stats["generated_tokens"] == 8 and reply.stats["finish_reason"] == "length"
    assert vault.entries == {(R.KEYRING_SERVICE, server.url): "sk-gui"}
    saved = (w.settings.path).read_text()
    assert "sk-gui" not in saved and json.loads(saved)["remote"] == {"url": server.url, "model": server.model_id}
    board = w.open_dashboard()
    board.on_stats(w.snapshot)  # the remote snapshot: the endpoint's figures, where the model runs
    board.draw_now()
    assert f"runs remotely: {server.model_id} at {server.url} (colibri)" in board.header.text()
    w.serve_action.trigger()  # the local server serves a local engine only: it says so
    qtbot.waitUntil(lambda: bool(dialogs("error_dialog")), timeout=30_000)
    assert "remote endpoint" in dialogs("error_dialog")[0].informativeText() and not w.server_url
    dialogs("error_dialog")[0].close()
    dialog = w.open_remote_dialog()
    dialog.url.setText(f"http://127.0.0.1:{free_port()}/v1")
    dialog.connect_button.click()
    qtbot.waitUntil(lambda: bool(dialogs("error_dialog")), timeout=30_000)
    assert "cannot reach" in dialogs("error_dialog")[0].informativeText()
    assert w.flow.model.startswith("remote: ") and w.snapshot.remote.url == server.url  # the endpoint in use stays
    for d in dialogs("error_dialog"):
        d.close()
    w.close()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("COLIBRI_HOME", str(tmp_path))
    return tmp_path


# --- colibri-bench serve's load generator (figures are printed by the benchmark, never asserted) --
def test_the_load_generator_counts_streams_against_the_same_requests_run_alone(server):
    from app.bench import serve as B
    ref = B.references(server.url, server.model_id, B.DISTINCT[:4], max_tokens=6)
    result, outcomes = B.run_load(server.url, server.model_id, clients=4, requests_each=1, max_tokens=6,
                                  reference=ref)
    assert {o.request for o in outcomes} == set(B.DISTINCT[:4])
    assert (result.requests, result.errors, result.lost, result.garbled) == (4, 0, 0, 0), result
    assert result.completion_tokens == sum(o.tokens for o in outcomes) == 24 and result.ttft_p50_s is not None
    wrong = {r: text + "!" for r, text in ref.items()}  # the count can fail: a changed text is garbled
    assert B.run_load(server.url, server.model_id, 2, 1, max_tokens=6, reference=wrong)[0].garbled == 2


@pytest.mark.qt_log_level_fail("WARNING")
def test_without_a_keyring_the_dialog_says_so_and_connects_for_this_session(qtbot, tmp_path):
    from keyring.backends import fail

    from app import settings as S_
    from ui.remote_dialog import RemoteDialog
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        settings = S_.load(tmp_path / "settings.json")
        dialog = RemoteDialog(settings)
        qtbot.addWidget(dialog)
        chosen = []
        dialog.chosen.connect(lambda *a: chosen.append(a))
        dialog.url.setText("10.0.0.9:8000")
        dialog.key.setText("sk-session")
        dialog.connect_button.click()
        assert chosen == [] and "could not be kept in the system keyring" in dialog.status.text()
        assert "Press Connect again" in dialog.status.text()
        dialog.connect_button.click()
        assert chosen == [("http://10.0.0.9:8000/v1", "", "sk-session")]
        assert "sk-session" not in (tmp_path / "settings.json").read_text()
    finally:
        keyring.set_keyring(before)


class _SlowKeyring(MemoryKeyring):
    """A keyring whose lookups wait for `go`: the dialog's background job outlives the dialog."""

    def __init__(self):
        super().__init__()
        self.go, self.done = threading.Event(), threading.Event()

    def get_password(self, service: str, username: str) -> str | None:
        self.go.wait(10)
        self.done.set()
        return super().get_password(service, username)


def test_a_dialog_dropped_while_its_keyring_lookup_runs_is_not_freed_by_that_job(qtbot, tmp_path):
    # the job once held the dialog: dropped by the GUI first, the dialog was freed on the job's thread
    # when the job ended (a segfault: CI's xdist worker died in the dialog's test)
    import gc

    from app import settings as S_
    from ui import remote_dialog as RD
    before, slow = keyring.get_keyring(), _SlowKeyring()
    keyring.set_keyring(slow)
    try:
        freed_on = []
        dialog = RD.RemoteDialog(S_.load(tmp_path / "settings.json"))
        dialog.destroyed.connect(lambda: freed_on.append(threading.current_thread().name))
        dialog.show()
        qtbot.wait(10)
        del dialog
        gc.collect()
        slow.go.set()
        assert slow.done.wait(10)
        for t in [t for t in threading.enumerate() if t.name == "colibri-remote-dialog"]:
            t.join(10)
        qtbot.wait(50)  # the answer, queued for a dialog that is gone, is dropped
        assert freed_on == [threading.main_thread().name]
        live = RD.RemoteDialog(S_.load(tmp_path / "settings.json"))  # and a new dialog gets its own answers
        qtbot.addWidget(live)
        RD._relay().models.emit(live._id, "http://10.0.0.9:8000/v1", ["m"], "")
        RD._relay().models.emit(live._id + 1, "http://10.0.0.9:8000/v1", ["not this dialog's"], "")
        qtbot.waitUntil(lambda: live.model.count() == 1)
        qtbot.wait(20)
        assert [live.model.itemText(i) for i in range(live.model.count())] == ["m"]
    finally:
        slow.go.set()
        keyring.set_keyring(before)
