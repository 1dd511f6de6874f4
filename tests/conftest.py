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


def _share_numba_compiles_between_workers() -> None:
    """pytest-xdist's workers share numba's cache folder (engine.kernels names it), and two file
    locks make that sharing whole:
    - a compile of a cached kernel holds a lock named after the kernel and its argument types, so a
      worker that meets a kernel another worker is compiling waits for it and loads its result from
      the cache instead of compiling it too (the big kernels take a minute each, cold);
    - numba adds an entry to a function's cache index without a lock (numba 0.68
      caching.IndexDataCacheFile.save): two processes saving two signatures of one function at once
      could both take the next data file number, and the index then named one signature's machine
      code for the other. A lock per index makes each save whole."""
    import fcntl
    import hashlib

    import engine.kernels  # noqa: F401  (numba's settings before numba is imported)
    from numba.core import caching, dispatcher
    from numba.core.compiler_lock import global_compiler_lock
    if getattr(dispatcher.Dispatcher.compile, "shared", False):
        return
    save, compile_ = caching.IndexDataCacheFile.save, dispatcher.Dispatcher.compile
    locks = os.path.join(os.environ["NUMBA_CACHE_DIR"], "compile-locks")
    inside = [0]  # nested compiles (callees typed by the caller's compile) take no lock of their own

    def locked_save(self, key, data):
        os.makedirs(self._cache_path, exist_ok=True)
        with open(self._index_path + ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            save(self, key, data)  # (the lock goes with the file's close)

    def locked_compile(self, sig):
        if isinstance(self._cache, caching.NullCache) or inside[0]:
            return compile_(self, sig)
        with global_compiler_lock:  # this process's other threads wait here, never while holding a file lock
            os.makedirs(locks, exist_ok=True)
            name = f"{self.py_func.__module__}.{self.py_func.__qualname__}"
            digest = hashlib.sha256(str(sig).encode()).hexdigest()[:16]
            with open(os.path.join(locks, f"{name}-{digest}.lock"), "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                inside[0] += 1
                try:
                    return compile_(self, sig)  # (loads what another worker saved meanwhile)
                finally:
                    inside[0] -= 1
    locked_compile.shared = True
    caching.IndexDataCacheFile.save, dispatcher.Dispatcher.compile = locked_save, locked_compile


_share_numba_compiles_between_workers()
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
