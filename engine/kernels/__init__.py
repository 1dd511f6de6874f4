"""Compute kernels: Numba (cpu.py) with a numpy twin of each (reference.py).

Importing this package changes nothing; `setup()` does the work, once per process: every command
and the test suite call it first, and `Engine()` does (engine.api imports no compiled module until
then), so `from engine.api import Engine` needs nothing before it. What it puts in place: the compiled-kernel cache in the
user's cache folder (so a read-only install still caches), one folder per digest of these sources; a
threading layer that is safe when two Python threads run kernels at once (missing → a loud error,
never a silent fallback that crashes under threads); the instruction set (`simd`) and the byte
dot-product path (`simd_path`, engine.kernels.isa, measured once per CPU in a background process);
file locks for processes sharing the cache folder (cache_lock.py), cached kernels without live IR
(cached_ir.py) and unique compiled names (_RandomUids).

Why a module imported before setup() fails (kernels/ready.py) rather than setting up by itself:
numba reads its cache folder and target when a kernel is decorated, and simd.py fixes its path when
it is imported, so whatever comes first decides for the whole process. Set up silently by an
import, a command's --simd or --simd_path (or the window's settings) would be ignored without a word.

`simd` (the parameter, or COLIBRI_SIMD in a child process that Colibri starts):
  auto    — the target measured fastest on this CPU (engine.kernels.isa: each path timed under
            both); until measured, avx512 on AMD CPUs (Zen 4 runs it at full clock) and avx2
            elsewhere (AVX-512 lowers the clock of many Intel CPUs)
  avx2    — the host's features with every AVX-512 extension switched off
  avx512  — everything the host CPU has (numba's own default)
A change takes effect at the next start: numba compiles for one target per process (the kernel
cache keeps one entry per target, so switching back and forth never recompiles twice).
"""
from __future__ import annotations

import os
import secrets
import sys

import platformdirs

SIMD_CHOICES = ("auto", "avx2", "avx512")
SIMD_REQUESTED: str | None = None  # the `simd` asked for (None until setup)
SIMD: str | None = None  # what this process compiles for: "avx2", "avx512", "native" or "custom"


def setup(simd: str | None = None, simd_path: str | None = None, bench: bool = True) -> str:
    """Put numba's settings, this CPU's instruction path and the patches in place before any kernel
    is imported; returns SIMD. Idempotent: a later call changes nothing (the kernels are compiled for
    the first one's choice; Engine warns when its parameters ask for another). `simd` and `simd_path`
    are the parameters (engine.params); None or "auto" leaves what a parent Colibri process passed
    down (COLIBRI_SIMD), else auto. `bench`: start the background measurement of the paths if this
    CPU has none cached (COLIBRI_SIMD_BENCH=0 also prevents it: the test suite)."""
    global SIMD, SIMD_REQUESTED
    if SIMD is not None:
        return SIMD
    if simd not in (None, "auto"):
        if simd not in SIMD_CHOICES:
            raise ValueError(f"simd: {simd!r} is not one of {', '.join(SIMD_CHOICES)}")
        os.environ["COLIBRI_SIMD"] = simd  # (this process's children compile for it too)
    if SIMD_REQUESTED is None:  # (once, even if what follows fails: a wrong simd_path for this CPU)
        _numba_settings()
    requested = os.environ.get("COLIBRI_SIMD", "auto").lower()
    SIMD_REQUESTED = requested if requested in SIMD_CHOICES else "auto"
    target = _apply_simd(SIMD_REQUESTED)
    choose_dot(bench, simd_path)
    from engine.kernels import cache_lock, cached_ir
    cache_lock.install()  # after choose_dot, which may move the cache folder (a forced dot path)
    cached_ir.install()
    _unique_compiled_names()  # before anything is compiled or loaded
    SIMD = target
    return SIMD


def _sources_digest() -> str:
    """A digest of every kernel source file. Numba checks only the timestamp of the file that
    defines a cached function, not of what it calls (simd.py's intrinsics are compiled into
    cpu.py's kernels): a folder per digest keeps an edited or upgraded kernel from loading a
    stale machine-code cache."""
    import hashlib
    h = hashlib.sha256()
    folder = os.path.dirname(os.path.abspath(__file__))
    try:
        names = sorted(os.listdir(folder))
    except OSError:  # no source folder to read (an unusual frozen build): one shared cache
        return "unversioned"
    for name in names:
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()[:12]


def _numba_settings() -> None:
    """The cache folder and the threading layer, in the environment (numba reads them at its import;
    child processes inherit them) and in numba's config if it is imported already: a program that
    imported it first would cache the kernels beside their sources, by each file's timestamp only
    (simd.py edited: cpu.py's stale code)."""
    if "NUMBA_CACHE_DIR" not in os.environ:
        home = os.environ.get("COLIBRI_HOME")
        base = os.path.join(home, "cache") if home else platformdirs.user_cache_dir("colibri", appauthor=False)
        os.environ["NUMBA_CACHE_DIR"] = os.path.join(base, "numba", _sources_digest())
    if os.environ.get("COLIBRI_DOT"):  # a forced dot-product path (simd.py) compiles apart from the natural one
        os.environ["NUMBA_CACHE_DIR"] += "-dot-" + os.environ["COLIBRI_DOT"]
    os.environ.setdefault("NUMBA_THREADING_LAYER", "threadsafe")
    if "numba" in sys.modules:
        from numba.core import config
        config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
        if config.THREADING_LAYER == "default":
            config.THREADING_LAYER = os.environ["NUMBA_THREADING_LAYER"]
    # OMP_WAIT_POLICY stays libgomp's default (spin briefly, then sleep): PASSIVE decodes several
    # times slower on a quiet machine and helps only when other programs compete for the cores. Set
    # it in the environment to choose.


def _without_avx512() -> tuple[str, str] | None:
    """(cpu name, feature string) of the host minus AVX-512, or None if it has none."""
    import llvmlite.binding as llvm  # llvmlite alone: numba must not be imported yet
    feats = llvm.get_host_cpu_features()
    if not feats.get("avx512f"):
        return None
    from engine.kernels.isa import without_avx512  # (the one rule of what AVX-512 off means)
    return llvm.get_host_cpu_name(), ",".join(("+" if on else "-") + k for k, on in without_avx512(feats).items())


def _apply_simd(choice: str) -> str:
    """Set numba's target from `choice`; returns what is in effect ("avx2", "avx512", "native" or "custom")."""
    if "COLIBRI_USER_TARGET" not in os.environ:  # (children inherit the first process's verdict)
        user = "NUMBA_CPU_NAME" in os.environ or "NUMBA_CPU_FEATURES" in os.environ
        os.environ["COLIBRI_USER_TARGET"] = "1" if user else "0"
    if os.environ["COLIBRI_USER_TARGET"] == "1":
        return "custom"  # the user set numba's own variables: theirs win
    if "numba" not in sys.modules:  # a parent's AVX-512-less target: this process chooses its own (never
        os.environ.pop("NUMBA_CPU_NAME", None)  # under a running numba, which re-reads its variables
        os.environ.pop("NUMBA_CPU_FEATURES", None)  # and would compile later kernels for another target)
    if choice == "auto":
        from engine.kernels import isa  # (standard library and llvmlite only: numba is not imported yet)
        choice = isa.measured_target(_sources_digest()) or isa.vendor_target()
    if choice == "avx512":
        return "avx512"
    target = _without_avx512()
    if target is None:
        return "native"  # no AVX-512 to switch off
    os.environ["NUMBA_CPU_NAME"], os.environ["NUMBA_CPU_FEATURES"] = target
    return "avx2"


def choose_dot(bench: bool = True, simd_path: str | None = None) -> str:
    """Decide the byte dot-product path before simd.py is imported (engine.kernels.isa): the
    override, else the choice measured for this CPU (measured now on the first start)."""
    from engine.kernels import isa
    return isa.apply(_sources_digest(), bench, simd_path)


class _RandomUids:
    """Numba names each compiled function after its qualified name, its argument types and a
    per-process counter (`v<uid>`). A process that loads kernels another process cached then
    holds two bodies under one name whenever the counters line up on two different functions of
    the same name (closures, numba's own overload helpers), and LLVM's weak merge calls the wrong
    one: the one-call decode gave other logits than the layered path after a CLI process had
    cached it (numba issue #10486, open). Random 64-bit ids keep every name unique."""

    def __iter__(self):
        return self

    def __next__(self) -> int:
        return secrets.randbits(63)


def _unique_compiled_names() -> None:
    from numba.core.bytecode import FunctionIdentity
    if not isinstance(FunctionIdentity._unique_ids, _RandomUids):
        FunctionIdentity._unique_ids = _RandomUids()
