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
# numba's settings, and its cache shared whole between pytest-xdist's workers (each kernel compiled
# by one of them, each cache index save whole: engine/kernels/cache_lock.py), before any test module
# imports a kernel
from engine import kernels  # noqa: E402

kernels.setup()

HF_FIXTURES = TESTS / "fixtures" / "hf"
HF_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


# The files that take minutes on 2 cores cold (numba compiles, child processes that compile for other
# instruction paths, the real model's quality runs), longest first. pytest-xdist gives each file to one
# worker in collection order (setup.sh: --dist loadfile --no-loadscope-reorder): these go first, the
# rest by test count as xdist would order them, so that no worker is left with a long file at the end.
LONG_FILES = ("test_kernels.py", "test_server.py", "test_quality.py", "test_batch.py", "test_fused_decode.py",
              "test_experts.py", "test_cuda_sim.py")


def pytest_collection_modifyitems(session, config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process: the files in their usual order
    count: dict[str, int] = {}
    for it in items:
        count[it.path.name] = count.get(it.path.name, 0) + 1
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda it: (rank.get(it.path.name, len(LONG_FILES)), -count[it.path.name], str(it.path)))


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
