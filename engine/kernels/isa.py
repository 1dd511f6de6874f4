"""The instruction path measured, not assumed: the byte dot-product path (simd.DOT: vnni, avx2,
generic) and, on a CPU with AVX-512, the target numba compiles for (AVX-512 on or off).

Why: which instructions are fastest depends on the CPU (VNNI is not always the winner, e.g. where
it runs at half rate), and a path that computes wrong numbers on some CPU must never run. So on
the first engine.kernels.setup() on a CPU (and kernel version) each path this CPU
can execute multiplies a small matrix per int8 format, one token (decode) and 64 tokens on the
8-row repacked layout (prefill), checked against the format's numpy twin (engine.kernels.table): a
wrong path is excluded, the fastest correct one is chosen (the smallest sum over the cases of its
time over the best path's: numba compiles one path per process, so one path serves all formats).
On a CPU with AVX-512 each path is measured under both targets ("avx512/vnni", "avx2/vnni", ...):
which is faster is the CPU's business (measured on a 2-core Sapphire Rapids-class VM: AVX-512's
prefill kernels 1.35-1.8x the AVX-VNNI ones, where the vendor rule had switched AVX-512 off on
every Intel CPU), and engine.kernels applies the measured target at the next start.

Design (the cheapest honest one): simd.DOT is fixed when simd.py is imported, so each path runs
in its own child process (engine.kernels.isa_run.child_main), with its own numba cache folder
(engine.kernels appends "-dot-PATH"), so the timing itself is well under a second per path once
compiled; the first start pays numba's compile of cpu.matmul once per path (measured on 2 cores:
about 30-50 s a path cold, 1.3 s warm). The result is cached as JSON in the user data folder, keyed
by CPU model name + the features that decide the path + the kernels' source digest, and measured
again when the key changes. The measurement runs in a detached, niced process so that a first start is
not held up: that start runs simd.py's own pick, and the next one the measured choice.
COLIBRI_SIMD_BENCH=0 skips the measurement (the test suite: simd.py's own pick then runs, as before).

Override: the `simd` parameter (engine.kernels: the target) and the `simd_path` parameter (given to
engine.kernels.setup()): auto (the measured choice, else simd.py's own pick), vnni, avx2 or generic.
COLIBRI_DOT (tests, benchmarks, the measurement's children) wins over both.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import platformdirs

PATHS = ("vnni", "avx2", "generic")  # as engine.kernels.table.PATHS (importing the table here is avoided)
CHOICES = ("auto",) + PATHS
FORMATS = ("q4_0", "q4_1", "q8_0", "q5_0", "q5_1", "iq4_nl", "mxfp4", "iq4_xs", "q2_k", "q3_k", "q4_k",
           "q5_k", "q6_k")  # table.int_formats()
_DECIDING = ("avx2", "avx512f", "avx512vl", "avx512vnni", "avxvnni")  # the features simd._mode reads
CACHE_NAME = "simd_paths.json"

# The outcome of this process's choice, for stats(): how DOT was decided ("override", "measured",
# "forced", "default") and the cached measurement ({path: {format: seconds or None}}), if any.
SOURCE = "default"
MEASURED: dict = {}


def _features() -> dict[str, bool]:
    """The features numba compiles for (as simd._features, without importing numba)."""
    if os.environ.get("NUMBA_CPU_FEATURES"):
        return {f[1:]: f[0] == "+" for f in os.environ["NUMBA_CPU_FEATURES"].split(",") if f[:1] in "+-"}
    import llvmlite.binding as llvm
    return dict(llvm.get_host_cpu_features())


def host_features() -> dict[str, bool]:
    """The CPU's own features (what the cache key names): the user's NUMBA_CPU_FEATURES where they
    set numba's target themselves, else the host's — not the AVX-512-less target engine.kernels may
    have set for this process."""
    if _user_target():
        return _features()
    import llvmlite.binding as llvm
    return dict(llvm.get_host_cpu_features())


def _user_target() -> bool:
    return os.environ.get("COLIBRI_USER_TARGET") == "1"  # (engine.kernels sets it before its own choice)


def without_avx512(feats: dict[str, bool]) -> dict[str, bool]:
    return {k: v and not k.startswith("avx512") and k != "evex512" for k, v in feats.items()}


def vendor_target() -> str:
    """The target before any measurement: AVX-512 on AMD CPUs (Zen 4 runs it at full clock), off
    elsewhere (it lowers the clock of many Intel CPUs, as the seed warns)."""
    return "avx512" if _cpuinfo("vendor_id") == "AuthenticAMD" else "avx2"


def candidates(feats: dict[str, bool]) -> tuple[str, ...]:
    """What is measured on a CPU with these (host) features, the vendor's default first: the
    executable paths, each as "TARGET/PATH" where the CPU has AVX-512 and numba's target is ours
    to choose. Each child costs a cold compile (1-2 min on 2 cores, niced, in the background), so
    AVX-512 is tried with its best path only (vnni where AVX-512 VNNI is there) and generic only
    once (a correctness fallback, never the fastest)."""
    if _user_target() or not feats.get("avx512f"):
        return executable(feats)
    wide = (f"avx512/{executable(feats)[0]}",)
    narrow = tuple(f"avx2/{p}" for p in executable(without_avx512(feats)))
    return wide + narrow if vendor_target() == "avx512" else narrow[:-1] + wide + narrow[-1:]


def split(entry: str) -> tuple[str | None, str]:
    """"avx512/vnni" -> ("avx512", "vnni"); "vnni" -> (None, "vnni")."""
    target, _, path = entry.rpartition("/")
    return target or None, path


def executable(feats: dict[str, bool]) -> tuple[str, ...]:
    """The paths this CPU (these features) can execute, best first."""
    out = []
    if (feats.get("avx512vnni") and feats.get("avx512vl")) or feats.get("avxvnni"):
        out.append("vnni")
    if feats.get("avx2"):
        out.append("avx2")
    return tuple(out) + ("generic",)


def _cpuinfo(field: str) -> str:
    """A field of /proc/cpuinfo's first CPU ("" where there is none: not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(field)), "")
    except OSError:
        return ""


def cpu_model() -> str:
    import platform
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cache_key(digest: str, feats: dict[str, bool] | None = None) -> str:
    """CPU model + the deciding features + the kernels' source digest: a new CPU, target or kernel
    version measures again."""
    feats = host_features() if feats is None else feats
    flags = ",".join(f for f in _DECIDING if feats.get(f))
    return f"{cpu_model()} | {flags} | {digest}"


def cache_path() -> Path:
    home = os.environ.get("COLIBRI_HOME")
    return Path(home) / CACHE_NAME if home else Path(platformdirs.user_data_dir("colibri", appauthor=False)) / CACHE_NAME


def load(key: str) -> dict | None:
    """The cached measurement for `key`, or None (absent, unreadable, or another key)."""
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and data.get("key") == key and split(str(data.get("choice")))[1] in PATHS
    return data if ok else None


def measured_target(digest: str) -> str | None:
    """The target ("avx512" or "avx2") measured fastest on this CPU for these kernels, or None
    (not measured yet, or not ours to choose). engine.kernels reads it before numba is imported."""
    if _user_target():
        return None
    data = load(cache_key(digest))
    return split(data["choice"])[0] if data else None


def choose(times: dict[str, dict[str, float | None]]) -> str:
    """The entry with the smallest score, among those correct on every case (a None = a wrong result
    or a failed run); generic when none is. Score: the sum over the cases (formats, decode and
    prefill) of the entry's time over the best entry's, so each case weighs the same whatever its
    size. `times` is in candidates() order: the first correct entry stays unless another beats it
    by over 5% (on the 2-core Sapphire Rapids VM vnni and avx2 measured 6% apart, within a noisy
    neighbour's reach)."""
    ok = {p: t for p, t in times.items() if t and all(v is not None for v in t.values())}
    if not ok:
        return next((p for p in times if split(p)[1] == "generic"), "generic")
    cases = set.intersection(*(set(t) for t in ok.values()))
    best = {c: min(t[c] for t in ok.values()) for c in cases}
    score = {p: sum(t[c] / max(best[c], 1e-12) for c in cases) for p, t in ok.items()}
    first, top = next(iter(score)), min(score, key=score.get)
    return first if score[first] <= 1.05 * score[top] else top


def run_child(entry: str) -> dict[str, float | None]:
    """One entry ("PATH" or "TARGET/PATH") measured in a fresh process (simd.DOT and numba's target
    are fixed per process); {} if it failed."""
    target, path = split(entry)
    env = dict(os.environ, COLIBRI_DOT=path, PYTHONPATH=os.pathsep.join(sys.path))
    if target is not None:  # (the parent's own AVX-512-less target, if any, is not the child's)
        env["COLIBRI_SIMD"] = target
        env.pop("NUMBA_CPU_NAME", None)
        env.pop("NUMBA_CPU_FEATURES", None)
    try:
        r = subprocess.run([sys.executable, "-c", "import engine.kernels.isa_run as m, sys; m.child_main(sys.argv[1])",
                            path], env=env, capture_output=True, text=True, timeout=600)
        return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return {}


def measure(digest: str, feats: dict[str, bool], runner: Callable[[str], dict[str, float | None]] = run_child) -> dict:
    """Every candidate for these (host) features timed (`runner`: an entry -> {case: seconds or
    None}), the choice written to the cache; returns the cache's content."""
    times = {p: runner(p) for p in candidates(feats)}
    data = {"key": cache_key(digest, feats), "choice": choose(times), "times": times, "measured_at": time.time()}
    p = cache_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, p)
    except OSError:
        pass  # a read-only home: measured again at the next start
    return data


def _set(path: str, natural: str) -> None:
    """Force `path` for this process unless it is what simd.py picks by itself (whose numba cache
    folder is shared with every run that forces nothing)."""
    if path != natural:
        os.environ["COLIBRI_DOT"] = path
        os.environ["NUMBA_CACHE_DIR"] += "-dot-" + path


def decide(digest: str, feats: dict[str, bool], wanted: str = "auto", bench: bool = True,
           runner: Callable[[str], dict] = run_child) -> tuple[str | None, str, dict]:
    """(path, how, measurement): the override `wanted` if it names a path; else the cached choice
    for this key (feats: the host's), measured first if absent and `bench`; else (None, "default",
    {}): simd.py's pick."""
    paths = executable(feats)
    if wanted in PATHS:
        if wanted not in paths:
            raise ValueError(f"simd_path {wanted}: this CPU ({cpu_model()}) runs only {', '.join(paths)}")
        return wanted, "override", {}
    if wanted != "auto":
        raise ValueError(f"simd_path {wanted!r}: one of {', '.join(CHOICES)}")
    data = load(cache_key(digest, feats))
    if data is None and bench and os.environ.get("COLIBRI_SIMD_BENCH", "1") != "0":
        import logging
        logging.getLogger("colibri").info("measuring the instruction paths %s once for this CPU and kernel "
                                          "version (%s)", ", ".join(candidates(feats)), cache_path())
        data = measure(digest, feats, runner)
    if data is not None and split(data["choice"])[1] in paths:
        return split(data["choice"])[1], "measured", data
    return None, "default", {}


def _measuring_elsewhere() -> bool:
    """A background measurement of this CPU is running (its lock file names a live process)."""
    try:
        pid = int(cache_path().with_suffix(".lock").read_text())
    except (OSError, ValueError):
        return False
    return Path(f"/proc/{pid}").exists() if sys.platform.startswith("linux") else True


def measure_in_background(digest: str) -> bool:
    """Start the measurement in a detached, low-priority process that writes the cache for the
    next start, so a first start is not held up by numba compiling every path (minutes on 2
    cores cold). False if one is already running or it cannot start."""
    if _measuring_elsewhere():
        return False
    code = ("import os, sys; os.nice(10); import engine.kernels as k; k.setup(); import engine.kernels.isa as m; "
            "m.cache_path().parent.mkdir(parents=True, exist_ok=True); "
            "lock = m.cache_path().with_suffix('.lock'); lock.write_text(str(os.getpid())); "
            "m.measure(sys.argv[1], m.host_features()); lock.unlink(missing_ok=True)")
    env = dict(os.environ, COLIBRI_SIMD_BENCH="0", PYTHONPATH=os.pathsep.join(sys.path))  # its own import: no recursion
    try:
        subprocess.Popen([sys.executable, "-c", code, digest], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return False
    return True


def apply(digest: str, bench: bool = True, wanted: str | None = None) -> str:
    """Decide this process's path before simd.py is imported: `wanted` (the simd_path parameter;
    None = auto), except that COLIBRI_DOT (set by tests, benchmarks and the measurement for their
    children) wins; returns how (SOURCE). Without a cached measurement this process runs simd.py's
    own pick and the measurement runs in the background, for the next start."""
    global SOURCE, MEASURED
    if SOURCE != "default" or "engine.kernels.simd" in sys.modules:  # decided already
        return SOURCE
    if os.environ.get("COLIBRI_DOT"):
        SOURCE = "forced"
        return SOURCE
    feats = host_features()
    path, SOURCE, MEASURED = decide(digest, feats, (wanted or "auto").lower(), bench=False)
    if path is not None and path not in executable(_features()):  # measured under a target not in effect
        path, SOURCE = None, "default"  # (simd = avx2 asked for on a CPU whose AVX-512 path won)
    if SOURCE == "default" and bench and os.environ.get("COLIBRI_SIMD_BENCH", "1") != "0" \
            and measure_in_background(digest):
        SOURCE = "default; measuring for the next start"
    if path is not None:
        _set(path, executable(feats)[0])
    return SOURCE
