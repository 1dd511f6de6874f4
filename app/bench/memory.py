"""colibri-bench memory: Colibri's expert cache against llama.cpp on a Mixtral-style model.

One run builds (once, cached in --workdir) a random Mixtral-style checkpoint whose experts hold
≥ 90% of the parameters, converts it to int8 for Colibri and exports exactly those Q8_0 blocks
to GGUF for llama.cpp, then measures each engine in a fresh process: peak RSS, prefill and
decode tokens/s, and for Colibri the expert-cache hit rate, prefetch accuracy and the routing
entropy. With --ram_cap, every run happens inside a memory cgroup limited to a fraction of the
model's size, after the model's files were evicted from the page cache.
"""
from __future__ import annotations

import ctypes
import json
import math
import mmap
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from app.bench.models import MixtralShape, write_checkpoint

# vocabulary of the default model (SmolLM2, byte-level BPE with merges), which llama.cpp can load
BENCH_SHAPE = MixtralShape(hidden=1024, layers=16, heads=16, kv_heads=4, experts=8, top_k=2, ff=4096, vocab=49152)


def _default_tokenizer() -> str:
    from engine.convert.gguf_file import GGUFModel
    from engine.default_model import default_gguf_path
    g = GGUFModel(default_gguf_path())
    try:
        return g.tokenizer().tokenizer_json
    finally:
        g.close()
PROMPT_TOKENS, DECODE_TOKENS = 128, 48

# Runs in a child process: measures Colibri and prints one JSON line.
_COLIBRI = r"""
import json, sys, time, numpy as np
from engine.api import Engine
path, cache, threads, prompt_n, decode_n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
t0 = time.perf_counter()
eng = Engine(path, threads=threads, expert_cache_size=cache, context_length=1024, log_level="WARN")
eng.warmup(); eng.reset()
load_s = time.perf_counter() - t0
ids = [int(i) for i in np.random.default_rng(0).integers(300, eng.cfg.vocab_size, prompt_n)]
t = time.perf_counter(); nxt = eng.forward(ids); prefill = prompt_n / (time.perf_counter() - t)
t = time.perf_counter()
for _ in range(decode_n):
    nxt = eng.forward([nxt])
decode = decode_n / (time.perf_counter() - t)
st = eng.stats(); ec = st.expert_cache
acts = np.array(ec.activations, dtype=float)
p = acts / acts.sum(axis=1, keepdims=True)
entropy = float(np.mean(-(p * np.log2(np.where(p > 0, p, 1))).sum(axis=1)))
hwm = int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024
print(json.dumps({"engine": "colibri", "cache": ec.capacity_per_layer, "plan": st.expert_cache_plan,
    "load_s": load_s, "prefill_tok_s": prefill, "decode_tok_s": decode, "peak_rss_mb": hwm / 1e6,
    "hit_rate": ec.hit_rate, "served_without_wait": ec.served_without_wait,
    "prefetch_accuracy": ec.prefetch_accuracy, "routing_entropy_bits": entropy,
    "max_entropy_bits": float(np.log2(acts.shape[1])), "top4_share": float(np.sort(p, axis=1)[:, -4:].sum(1).mean())}))
"""

_LLAMA = r"""
import json, sys, time, numpy as np
from llama_cpp import Llama
path, threads, prompt_n, decode_n, mmap_on = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
t0 = time.perf_counter()
m = Llama(path, n_ctx=1024, n_threads=threads, n_batch=512, use_mmap=mmap_on, verbose=False)
load_s = time.perf_counter() - t0
ids = [int(i) for i in np.random.default_rng(0).integers(300, m.n_vocab(), prompt_n)]
t = time.perf_counter(); m.eval(ids); prefill = prompt_n / (time.perf_counter() - t)
nxt = int(np.argmax(m.scores[m.n_tokens - 1]))
t = time.perf_counter()
for _ in range(decode_n):
    m.eval([nxt]); nxt = int(np.argmax(m.scores[m.n_tokens - 1]))
decode = decode_n / (time.perf_counter() - t)
hwm = int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024
print(json.dumps({"engine": "llama.cpp", "mmap": mmap_on, "load_s": load_s, "prefill_tok_s": prefill,
    "decode_tok_s": decode, "peak_rss_mb": hwm / 1e6}))
"""


def llama_python() -> str | None:
    """An interpreter that has llama_cpp: this one, or the repo's .venv-bench."""
    for py in (sys.executable, str(Path(__file__).resolve().parents[2] / ".venv-bench" / "bin" / "python")):
        if Path(py).exists() and subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
            return py
    return None


def prepare(workdir: Path) -> tuple[Path, Path, dict]:
    """The benchmark model in both formats (built once, reused)."""
    from engine.convert.convert import convert
    from engine.convert.gguf_export import export_gguf
    hf, ours, gguf_path = workdir / "mixtral-hf", workdir / "mixtral-int8", workdir / "mixtral-q8_0.gguf"
    shape = BENCH_SHAPE
    tensors = shape.tensors()
    expert_params = sum(math.prod(s) for n, s in tensors.items() if ".experts." in n)
    info = {"params": shape.params(), "expert_share": expert_params / shape.params(),
            "shape": shape.__dict__}
    if not (hf / "model.safetensors").exists():
        print(f"building the benchmark model: {shape.params() / 1e9:.2f} B parameters, "
              f"experts {100 * info['expert_share']:.1f}%", file=sys.stderr)
        write_checkpoint(hf, shape, balanced_router=True, tokenizer_json=_default_tokenizer(), embed_std=1.0)
    if not (ours / "manifest.json").exists():
        convert(hf, ours, "int8", force=True)
    if not gguf_path.exists():
        export_gguf(ours, gguf_path)
    info["colibri_mb"] = sum(p.stat().st_size for p in ours.rglob("*") if p.is_file()) / 1e6
    info["gguf_mb"] = gguf_path.stat().st_size / 1e6
    return ours, gguf_path, info


# --- page cache and cgroups ------------------------------------------------------------------

def _resident_bytes(path: Path) -> int:
    """Bytes of `path` in the page cache (mincore over a read-only mapping)."""
    import numpy as np
    size = path.stat().st_size
    if size == 0:
        return 0
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    view = np.frombuffer(mm, np.uint8)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    ok = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec) == 0
    del view
    mm.close()
    return sum(v & 1 for v in vec) * mmap.PAGESIZE if ok else -1


def evict(paths: list[Path]) -> int:
    """Drop the files from the page cache; returns the bytes still resident afterwards."""
    left = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        left += max(0, _resident_bytes(p))
    return left


def warm(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


class MemoryCgroup:
    """A memory cgroup (v1 or v2) with a byte limit; children are started inside it."""

    def __init__(self, limit: int):
        v1 = Path("/sys/fs/cgroup/memory")
        v2 = Path("/sys/fs/cgroup")
        name = f"colibri-bench-{os.getpid()}"
        if v1.is_dir():
            self.path, files = v1 / name, ("memory.limit_in_bytes",)
        elif (v2 / "cgroup.controllers").exists():
            self.path, files = v2 / name, ("memory.max",)
        else:
            raise OSError("no memory cgroup hierarchy found")
        self.path.mkdir()
        (self.path / files[0]).write_text(str(limit))
        if (self.path / "memory.memsw.limit_in_bytes").exists():
            try:
                (self.path / "memory.memsw.limit_in_bytes").write_text(str(limit))
            except OSError:
                pass
        if (self.path / "memory.swap.max").exists():
            (self.path / "memory.swap.max").write_text("0")

    def enter(self) -> None:  # runs in the child before exec
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def close(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def run_child(cmd: list[str], cgroup: MemoryCgroup | None, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                              preexec_fn=cgroup.enter if cgroup else None)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        killed = proc.returncode in (-9, 137)
        return {"error": "killed (out of memory)" if killed else proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_suite(workdir: Path, caches: list[str], threads: int, ram_caps: list[float], decode_tokens: int,
              timeout: float) -> dict:
    ours, gguf_path, info = prepare(workdir)
    our_files = [p for p in ours.rglob("*.bin")]
    py_llama = llama_python()
    results = {"model": info, "threads": threads, "runs": []}
    for cap in ram_caps or [None]:
        for engine, arg in [("colibri", c) for c in caches] + [("llama.cpp", "1")]:
            if engine == "llama.cpp" and py_llama is None:
                results["runs"].append({"engine": "llama.cpp", "error": "llama-cpp-python not installed "
                                        "(pip install -e .[bench])", "ram_cap": cap})
                continue
            files = our_files if engine == "colibri" else [gguf_path]
            size = info["colibri_mb"] * 1e6 if engine == "colibri" else info["gguf_mb"] * 1e6
            group = None
            if cap is None:
                warm(files)  # the uncapped comparison is with files in the page cache
            else:
                left = evict(files)
                try:
                    group = MemoryCgroup(int(cap * size))
                except OSError as e:
                    results["runs"].append({"engine": engine, "ram_cap": cap, "error": f"no cgroup: {e}"})
                    continue
            if engine == "colibri":
                cmd = [sys.executable, "-c", _COLIBRI, str(ours), arg, str(threads), str(PROMPT_TOKENS),
                       str(decode_tokens)]
            else:
                cmd = [py_llama, "-c", _LLAMA, str(gguf_path), str(threads), str(PROMPT_TOKENS),
                       str(decode_tokens), arg]
            t0 = time.perf_counter()
            r = run_child(cmd, group, timeout)
            if group:
                group.close()
                r["page_cache_left_mb"] = left / 1e6
            r |= {"engine": engine, "ram_cap": cap, "wall_s": time.perf_counter() - t0}
            if engine == "colibri":
                r["cache_arg"] = arg
            results["runs"].append(r)
            print(_row(r), file=sys.stderr, flush=True)
    return results


def _row(r: dict) -> str:
    if "error" in r:
        return f"{r['engine']:>9} cap={r.get('ram_cap')}: {r['error']}"
    extra = ""
    if r["engine"] == "colibri":
        acc = r["prefetch_accuracy"]
        extra = (f" cache {r['cache']}/8 hit {r['hit_rate']:.2f} no-wait {r['served_without_wait']:.2f} "
                 f"prefetch {'-' if acc is None else f'{acc:.2f}'} entropy {r['routing_entropy_bits']:.2f} bits")
    return (f"{r['engine']:>9} ram_cap={r['ram_cap']}: peak RSS {r['peak_rss_mb']:.0f} MB, prefill "
            f"{r['prefill_tok_s']:.1f} tok/s, decode {r['decode_tok_s']:.2f} tok/s{extra}")


def main(args) -> int:
    workdir = Path(args.workdir or Path.home() / ".cache" / "colibri" / "bench").expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(workdir).free < 8e9:
        print(f"{workdir}: needs about 8 GB free", file=sys.stderr)
        return 1
    caps = [float(c) for c in args.ram_cap.split(",")] if args.ram_cap else []
    caches = args.caches.split(",") if not caps else ["auto"]
    res = run_suite(workdir, caches, args.threads, caps, args.decode_tokens, args.timeout)
    text = json.dumps(res, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


# --- how to read an expert: mmap, pread or O_DIRECT -------------------------------------------

def _load_mmap(path: Path, offset: int, nbytes: int, out) -> None:
    with open(path, "rb") as f:
        start = offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
        mm = mmap.mmap(f.fileno(), nbytes + offset - start, access=mmap.ACCESS_READ, offset=start)
        try:
            out[:nbytes] = memoryview(mm)[offset - start:offset - start + nbytes]
        finally:
            mm.close()  # nothing stays mapped, as with the other two


def _load_pread(path: Path, offset: int, nbytes: int, out) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [memoryview(out)[:nbytes]], offset)
    finally:
        os.close(fd)


def _load_direct(path: Path, offset: int, nbytes: int, out) -> None:
    align = 4096
    start = offset // align * align
    length = (offset + nbytes - start + align - 1) // align * align
    buf = mmap.mmap(-1, length)  # page-aligned, as O_DIRECT requires
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    try:
        os.preadv(fd, [buf], start)
        out[:nbytes] = memoryview(buf)[offset - start:offset - start + nbytes]
    finally:
        os.close(fd)
        buf.close()


def measure_loads(model: Path, repeats: int = 5) -> dict:
    """Cold (page cache evicted) and warm loads of one expert with each method; medians."""
    import statistics

    import numpy as np

    from engine.experts import ExpertStore
    from engine.model_dir import open_model_dir
    store = ExpertStore(open_model_dir(model))
    span = store.span(0, 0)
    out = np.empty(span.nbytes, np.uint8)
    out[:] = 0
    result = {"expert_mb": span.nbytes / 1e6}
    for name, fn in (("mmap", _load_mmap), ("pread", _load_pread), ("o_direct", _load_direct)):
        for state in ("cold", "warm"):
            times = []
            for _ in range(repeats):
                if state == "cold":
                    evict([span.path])
                else:
                    fn(span.path, span.offset, span.nbytes, out)
                t = time.perf_counter()
                fn(span.path, span.offset, span.nbytes, out)
                times.append(time.perf_counter() - t)
            med = statistics.median(times)
            result[f"{name}_{state}_ms"] = med * 1e3
            result[f"{name}_{state}_mb_s"] = span.nbytes / 1e6 / med
    return result


# --- memory pool: one lock per tier against one global lock ----------------------------------

def measure_pool_locks(ops: int = 20000, repeats: int = 5) -> dict:
    """Two threads allocate, touch and free blocks of every tier; medians of `repeats` runs."""
    import random
    import statistics
    import threading

    import numpy as np

    from engine.mempool import MemoryPool

    def churn(pool: MemoryPool, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(ops):
            b = pool.alloc(rng.choice([200, 3000, 64 << 10, 512 << 10, 2 << 20]))
            b.array(np.uint8, (b.requested,))[:4096] = 1  # touch it, as a real user would
            b.free()

    out = {}
    for name, global_lock in (("per_tier", False), ("global", True)):
        times = []
        for _ in range(repeats):
            pool = MemoryPool(global_lock=global_lock)
            ts = [threading.Thread(target=churn, args=(pool, s)) for s in range(2)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            times.append(time.perf_counter() - t0)
        out[f"{name}_s"] = statistics.median(times)
    out["global_over_per_tier"] = out["global_s"] / out["per_tier_s"]
    return out
