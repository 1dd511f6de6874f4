"""Shared fixtures: the repository's test data folders and the real default model."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("COLIBRI_SIMD_BENCH", "0")  # no dot-path measurement in tests (engine.kernels.isa)
TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # test helpers (gguf_fixtures, kquant_ref) import as plain modules

HF_FIXTURES = TESTS / "fixtures" / "hf"
HF_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


@pytest.fixture(autouse=True, scope="session")
def _qt_binding_guard():
    """Protect the test process from the Qt binding's None refcount bug where it exists."""
    try:
        from ui import pyside_refcount
        pyside_refcount.install()
    except ImportError:
        pass
    yield


@pytest.fixture(autouse=True)
def _collect_qt_garbage_on_the_gui_thread(request):
    """Cycles holding Qt objects from earlier tests must die on the GUI thread: a collection
    triggered on a worker thread would delete them there (Qt warns: timers from another thread).
    The app does the same with a GUI-thread collector."""
    if "qtbot" not in request.fixturenames:
        yield
        return
    import gc
    gc.collect()
    gc.disable()  # no collection on a worker thread while the test runs
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    from engine.default_model import default_gguf_path
    return default_gguf_path()


@pytest.fixture(scope="session")
def default_converted(tmp_path_factory, default_gguf) -> Path:
    """The default model converted once (keep formats) for every test that reads it."""
    from engine.convert.convert import convert
    out = tmp_path_factory.mktemp("default") / "smollm2"
    convert(default_gguf, out)
    return out
