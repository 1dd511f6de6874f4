"""Compute kernels: Numba (cpu.py) with a numpy twin of each (reference.py).

Numba's settings must be in place before it is first imported: the compiled-kernel cache goes to
the user's cache folder (so a read-only install still caches), the threading layer must be one
that is safe when two Python threads run kernels at once (missing → a loud error, never a silent
fallback that crashes under threads), and the instruction set is chosen here (`simd`). Processes
that share the cache folder do so under file locks (cache_lock.py).

`simd` (the `--simd` parameter, or the COLIBRI_SIMD environment variable, read at import):
  auto    — the target measured fastest on this CPU (engine.kernels.isa: each path timed under
            both); until measured, avx512 on AMD CPUs (Zen 4 runs it at full clock) and avx2
            elsewhere (AVX-512 lowers the clock of many Intel CPUs, as the seed warns; yet on a
            Sapphire Rapids-class VM its prefill kernels ran 1.35-1.8x faster: hence measured)
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


if "NUMBA_CACHE_DIR" not in os.environ:
    home = os.environ.get("COLIBRI_HOME")
    base = os.path.join(home, "cache") if home else platformdirs.user_cache_dir("colibri", appauthor=False)
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(base, "numba", _sources_digest())
if os.environ.get("COLIBRI_DOT"):  # a forced dot-product path (simd.py) compiles apart from the natural one
    os.environ["NUMBA_CACHE_DIR"] += "-dot-" + os.environ["COLIBRI_DOT"]
os.environ.setdefault("NUMBA_THREADING_LAYER", "threadsafe")
if "numba" in sys.modules:  # numba read its settings at its own import: a program that imported it first
    from numba.core import config as _config  # would cache the kernels beside their sources, by each file's
    _config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]  # timestamp only (simd.py edited: cpu.py's stale code)
    if _config.THREADING_LAYER == "default":
        _config.THREADING_LAYER = os.environ["NUMBA_THREADING_LAYER"]
# OMP_WAIT_POLICY stays libgomp's default (spin briefly, then sleep). Measured on 2 cores: PASSIVE
# is 2.7x slower decoding the default model on a quiet machine (16 vs 43 tok/s) and 1.4x on an
# all-resident MoE, while it helps only when other programs compete for the cores (MoE with
# expert loads: 6.9 vs 3.4 tok/s beside a CPU hog; on a 2-core VM at load 12-16, the moderate bench
# model streaming at half its size: 1.2 -> 7.5 tok/s). Set it in the environment to choose.


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


_requested = os.environ.get("COLIBRI_SIMD", "auto").lower()
SIMD_REQUESTED = _requested if _requested in SIMD_CHOICES else "auto"
SIMD = _apply_simd(SIMD_REQUESTED)  # what this process compiles for


def choose_dot(bench: bool = True) -> str:
    """Decide the byte dot-product path before simd.py is imported (engine.kernels.isa): the
    override, else the choice measured for this CPU (measured now on the first start)."""
    from engine.kernels import isa
    return isa.apply(_sources_digest(), bench)


choose_dot()


def _share_cache_between_processes() -> None:
    """File locks around numba's cache (cache_lock.py): the dot-path measurement's children and
    this process compile into one folder on a first start. After choose_dot, which may move the
    folder (a forced dot path), and numba's other settings."""
    from engine.kernels import cache_lock
    cache_lock.install()


_share_cache_between_processes()


def _cached_kernels_without_ir() -> None:
    """Kernels loaded from the cache keep their LLVM IR as bytes, not as live modules (cached_ir.py):
    37 of the 82 MB that loading the bench MoE's kernels took."""
    from engine.kernels import cached_ir
    cached_ir.install()


_cached_kernels_without_ir()


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


_unique_compiled_names()  # before anything is compiled or loaded
