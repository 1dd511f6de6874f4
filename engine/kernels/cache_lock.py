"""Processes sharing numba's kernel cache folder, made safe with file locks.

Two processes use one cache folder at once on a first start (engine.kernels.isa measures the dot
paths in background children that compile cpu.matmul while the engine compiles its own) and in the
tests (pytest-xdist workers). numba 0.68 alone is not safe there:
- it adds an entry to a function's cache index without a lock (caching.IndexDataCacheFile.save):
  two processes saving two signatures of one function at once can both take the next data file
  number, and the index then names one signature's machine code for the other. A lock per index
  (`<index>.nbi.lock` beside it) makes each save whole, and each load sees a whole save;
- both would compile the same kernel (a minute each for the big ones, cold). A compile of a cached
  kernel holds a lock named after the kernel and its argument types (NUMBA_CACHE_DIR/compile-locks),
  so a second process waits and loads the first one's result from the cache instead.

Nested compiles (callees typed during their caller's compile) take no lock of their own. This
process's other threads wait on numba's global compiler lock, never while holding a file lock, so
the locks are always taken in one order. Without fcntl (Windows) nothing is installed: numba then
behaves as it does by itself.
"""
from __future__ import annotations

import contextlib
import hashlib
import os

try:
    import fcntl
except ImportError:  # Windows: no flock; install() leaves numba as it is
    fcntl = None


@contextlib.contextmanager
def _flock(path: str, mode: int):
    """Hold flock `mode` on `path` (created if absent); no lock if the file cannot be opened
    (a read-only cache folder: numba then only reads it)."""
    try:
        f = open(path, "a")
    except OSError:
        yield
        return
    with f:
        fcntl.flock(f, mode)
        yield  # (the lock goes with the file's close)


def installed() -> bool:
    """Whether numba's cache and compile are patched in this process."""
    from numba.core import dispatcher
    return getattr(dispatcher.Dispatcher.compile, "colibri_cache_lock", False)


def install() -> bool:
    """Patch numba once (idempotent); call after numba's settings are in place (engine.kernels).
    False where there is no fcntl."""
    if fcntl is None:
        return False
    from numba.core import caching, config, dispatcher
    from numba.core.compiler_lock import global_compiler_lock
    if installed():
        return True
    save, load = caching.IndexDataCacheFile.save, caching.IndexDataCacheFile.load
    compile_ = dispatcher.Dispatcher.compile
    depth = [0]  # compiles in progress in this process; changed only under global_compiler_lock

    def locked_save(self, key, data):
        os.makedirs(self._cache_path, exist_ok=True)
        with _flock(self._index_path + ".lock", fcntl.LOCK_EX):
            save(self, key, data)

    def locked_load(self, key):
        if not os.path.isdir(self._cache_path):
            return None  # nothing cached yet
        with _flock(self._index_path + ".lock", fcntl.LOCK_SH):
            return load(self, key)

    def locked_compile(self, sig):
        if isinstance(self._cache, caching.NullCache) or not config.CACHE_DIR:
            return compile_(self, sig)
        with global_compiler_lock:  # this process's other threads wait here, holding no file lock
            if depth[0]:  # nested in this thread's compile, which holds its lock already
                return compile_(self, sig)
            locks = os.path.join(config.CACHE_DIR, "compile-locks")
            with contextlib.suppress(OSError):
                os.makedirs(locks, exist_ok=True)
            name = f"{self.py_func.__module__}.{self.py_func.__qualname__}"
            digest = hashlib.sha256(str(sig).encode()).hexdigest()[:16]
            with _flock(os.path.join(locks, f"{name}-{digest}.lock"), fcntl.LOCK_EX):
                depth[0] += 1
                try:
                    return compile_(self, sig)  # (loads what another process saved meanwhile)
                finally:
                    depth[0] -= 1

    locked_compile.colibri_cache_lock = True
    caching.IndexDataCacheFile.save, caching.IndexDataCacheFile.load = locked_save, locked_load
    dispatcher.Dispatcher.compile = locked_compile
    return True
