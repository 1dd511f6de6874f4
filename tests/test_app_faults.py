"""App-level faults of issue 18: replacing a model is atomic (and an interrupted one is undone at
start), two sources with one file name get two library folders, and a history that cannot be
opened is a dialog, not a bare traceback."""
from __future__ import annotations

import os
import shutil
import sys

import pytest
from conftest import HF_FIXTURES
from PySide6.QtWidgets import QMessageBox

from app import model_library as L
from app import worker as W
from engine.convert import convert as C
from engine.model_dir import open_model_dir

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("COLIBRI_HOME", str(tmp_path))
    return tmp_path


def _layers(path) -> int:
    return open_model_dir(path).config.num_layers


def test_replacing_a_model_swaps_it_in_one_step(tmp_path, monkeypatch):
    dst = tmp_path / "m"
    C.convert(HF_FIXTURES / "qwen2", dst, "keep")
    seen = []
    real = C._exchange
    monkeypatch.setattr(C, "_exchange", lambda a, b: seen.append(real(a, b)) or seen[-1])
    C.convert(HF_FIXTURES / "llama", dst, "keep", force=True)
    assert seen == [True]  # ext4/tmpfs: renameat2(RENAME_EXCHANGE); no moment without a model
    assert open_model_dir(dst).config.architecture != "" and sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_failed_replacement_keeps_the_old_model(tmp_path, monkeypatch):
    dst = tmp_path / "m"
    C.convert(HF_FIXTURES / "qwen2", dst, "keep")
    before = (dst / "config.json").read_text()
    monkeypatch.setattr(C, "_exchange", lambda a, b: False)  # a file system without the swap
    real_rename, calls = os.rename, []

    def rename(a, b):
        calls.append((str(a), str(b)))
        if len(calls) == 2:  # the new model's rename into place fails (e.g. the disk is gone)
            raise OSError(5, "Input/output error", str(b))
        return real_rename(a, b)
    monkeypatch.setattr(C.os, "rename", rename)
    with pytest.raises(Exception, match="Input/output error"):
        C.convert(HF_FIXTURES / "llama", dst, "keep", force=True)
    assert (dst / "config.json").read_text() == before and not list(tmp_path.glob(".m.old-*"))


def test_a_replacement_killed_half_way_is_undone_at_start(tmp_path):
    lib = tmp_path / "models"
    lib.mkdir()
    C.convert(HF_FIXTURES / "qwen2", lib / "m", "keep")
    C.convert(HF_FIXTURES / "qwen2", lib / "n", "keep")
    dead = 4_000_000  # no such process
    os.rename(lib / "m", lib / f".m.old-{dead}")  # killed right after setting the old model aside
    shutil.copytree(lib / "n", lib / f".n.old-{dead}")  # here the new model had arrived: the copy goes
    back = L.recover(lib)
    assert back == [lib / "m"] and _layers(lib / "m") > 0
    assert sorted(p.name for p in lib.iterdir()) == ["m", "n"]


def test_two_model_gguf_files_from_two_folders_get_two_models(home, tmp_path):
    from gguf_fixtures import write_gguf
    a, b = tmp_path / "a", tmp_path / "b"
    write_gguf(HF_FIXTURES / "qwen2", a / "model.gguf")
    write_gguf(HF_FIXTURES / "llama", b / "model.gguf")

    def progress(fraction, tensor):
        pass
    first = W.import_model(a / "model.gguf", progress, W.threading.Event())
    second = W.import_model(b / "model.gguf", progress, W.threading.Event())
    assert first.name == "model" and second.name == "model-b"
    assert _arch(first) != _arch(second)  # before: the second import returned the first model
    assert L.source_of(first.parent, "model") == str((a / "model.gguf").resolve())
    mtime = (first / "manifest.json").stat().st_mtime
    assert W.import_model(a / "model.gguf", progress, W.threading.Event()) == first  # found, not converted twice
    assert (first / "manifest.json").stat().st_mtime == mtime
    assert [p.name for p in L.installed_models()] == ["model", "model-b"]  # the index is no model


def _arch(path) -> str:
    return open_model_dir(path).config.architecture


def test_a_history_that_cannot_be_opened_is_a_dialog(home, qtbot, monkeypatch):
    from app import gui_main
    from app.history import HistoryError
    shown = []

    def fail(*a, **k):
        raise HistoryError("history.db: history schema version 9 is newer than this Colibri reads (1)")
    monkeypatch.setattr(gui_main, "History", fail)
    monkeypatch.setattr(QMessageBox, "exec", lambda box: shown.append((box.objectName(), box.informativeText())))
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # restored after the test
    assert gui_main.main([]) == 1
    assert shown == [("history_error", "history.db: history schema version 9 is newer than this Colibri reads (1)")]
    assert sys.excepthook is gui_main._crash_dialog  # installed before the history was opened
