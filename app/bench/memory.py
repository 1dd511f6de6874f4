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

from app.bench.memory_report import markdown, medians, run_line, write_readme
from app.bench.models import MixtralShape, write_checkpoint

_USER_OMP_WAIT = os.environ.get("OMP_WAIT_POLICY")  # as the user started us

# vocabulary of the default model (SmolLM2, byte-level BPE with merges), which llama.cpp can load
BENCH_SHAPE = MixtralShape(hidden=1024, layers=16, heads=16, kv_heads=4, experts=8, top_k=2, ff=4096, vocab=49152)
# about 0.72 GB in Q8_0 (experts 82%): dense weights + 200 MB still fit under half of it
MODERATE_SHAPE = MixtralShape(hidden=1024, layers=8, heads=16, kv_heads=4, experts=8, top_k=2, ff=2816, vocab=49152)
SHAPES = {"large": BENCH_SHAPE, "moderate": MODERATE_SHAPE}


def _default_tokenizer() -> str:
    from engine.convert.gguf_file import GGUFModel
    from engine.default_model import default_gguf_path
    g = GGUFModel(default_gguf_path())
    try:
        return g.tokenizer().tokenizer_json
    finally:
        g.close()
PROMPT_TOKENS, DECODE_TOKENS = 128, 48
# what both engines' children (_COLIBRI, _LLAMA) are fed: a prompt, then one token a decode step, from
# one seeded generator (llama-bench's tg feeds random tokens too). Until 6015cff llama.cpp's child
# decoded greedily from the binding's `scores`, which stay zero without logits_all: it fed token 0 at
# every step, each routed alike (22 MB read a token at cap 0.9 of the moderate model, 142-178 MB fed
# the tokens Colibri decodes)
_TOKENS = """rng = np.random.default_rng(0)
ids = [int(i) for i in rng.integers(300, vocab, prompt_n)]
stream = [int(i) for i in rng.integers(300, vocab, decode_n)]
"""
DECODE_INPUT = "seeded random tokens (the same for both engines)"  # (runs before 6015cff: "greedy tokens")

# Runs in a child process: measures Colibri and prints one JSON line.
# A child's first lines: engine.kernels.setup() before engine.api (a checkout from before it set up at import)
SETUP = "import engine.kernels as _k\ngetattr(_k, 'setup', lambda: None)()\n"
_COLIBRI = SETUP + r"""
import json, sys, time, numpy as np
from engine.api import Engine
path, cache, threads, prompt_n, decode_n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
trace = sys.argv[6] if len(sys.argv) > 6 else ""
max_s = float(sys.argv[7]) if len(sys.argv) > 7 else float("inf")  # decode stops after this (3 tokens at least)
def io_read():  # bytes this process made the block layer read (page-cache hits do not count)
    return int(next(l for l in open('/proc/self/io') if l.startswith('read_bytes')).split()[1])
def major_faults():  # pages of mapped files (dense weights, code) read back from disk: evicted under the cap
    return int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[9])
t0 = time.perf_counter()
cache, *opts = cache.split("/")  # "2/p0/lru": expert_cache_size 2, prefetch_window 0, LRU eviction
window = [int(o[1:]) for o in opts if o.startswith("p")]
policy = [o for o in opts if o in ("lfu", "lru")]
eng = Engine(path, threads=threads, expert_cache_size=None if cache == "auto" else int(cache), context_length=1024,
             log_level="WARN", **({"prefetch_window": window[0]} if window else {}),
             **({"expert_cache_policy": policy[0]} if policy else {}))
eng.warmup(); eng.reset()
if trace:  # benchmark-only hook: routing and look-ahead replayed from a real model's trace
    from app.bench.memory import replay_routing
    replay_routing(eng, trace)
load_s = time.perf_counter() - t0
vocab = eng.cfg.vocab_size
%TOKENS%t = time.perf_counter(); eng.forward(ids); prefill = prompt_n / (time.perf_counter() - t)
r0, l0, f0 = io_read(), eng.stats().expert_cache.bytes_loaded, major_faults()
t, n, c0 = time.perf_counter(), 0, time.process_time()
while n < decode_n and (n < 3 or time.perf_counter() - t < max_s):
    eng.forward([stream[n]]); n += 1
decode = n / (time.perf_counter() - t)
cpu_ms = (time.process_time() - c0) / n * 1e3  # all threads' CPU time a token: comparable on a loaded machine
from engine import sysmem
room, limited_by = sysmem.room()
st = eng.stats(); ec = st.expert_cache
acts = np.array(ec.activations, dtype=float)
p = acts / np.maximum(acts.sum(axis=1, keepdims=True), 1)
entropy = float(np.mean(-(p * np.log2(np.where(p > 0, p, 1))).sum(axis=1)))
hwm = int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024
print(json.dumps({"engine": "colibri", "fed": stream[:n], "cache": ec.capacity_per_layer, "plan": st.expert_cache_plan,
    "budget_mb": getattr(ec, "budget_bytes", 0) / 1e6, "warning": getattr(st, "memory_warning", None),
    "load_s": load_s, "prefill_tok_s": prefill, "decode_tok_s": decode, "peak_rss_mb": hwm / 1e6,
    "read_mb_per_token": (io_read() - r0) / n / 1e6, "decode_tokens": n, "cpu_ms_per_token": cpu_ms,
    "major_faults_per_token": (major_faults() - f0) / n,
    "room_after_mb": room / 1e6 if limited_by == "cgroup limit" else None,
    "missed_mb_per_token": (ec.bytes_loaded - l0) / n / 1e6,
    "hit_rate": ec.hit_rate, "served_without_wait": ec.served_without_wait,
    "prefetch_accuracy": ec.prefetch_accuracy, "prefetch_paused": getattr(ec, "prefetch_paused", None),
    "read_ways_mb": {k: v / 1e6 for k, v in getattr(ec, "read_bytes", ())}, "routing_entropy_bits": entropy,
    "max_entropy_bits": float(np.log2(acts.shape[1])), "top4_share": float(np.sort(p, axis=1)[:, -4:].sum(1).mean())}))
""".replace("%TOKENS%", _TOKENS)


def replay_routing(eng, trace_path: str) -> None:
    """Make `eng` route as a recorded trace did (colibri-bench routing --trace): layer L of the
    benchmark model takes layer L of the trace, token after token (wrapping around), with equal
    weights; the prefetcher guesses the next layer with the trace's one-layer-ahead picks (what
    that model's next router made of this layer's input). The fused decode (all experts resident)
    takes the trace's picks through its `given` hook. Benchmark only: it patches the instance."""
    import numpy as np
    tr = np.load(trace_path)
    ids, ahead = tr["ids"].astype(np.int64), tr["ahead"].astype(np.int64)
    net, cfg = eng.net, eng.cfg
    L, E, K = cfg.num_layers, cfg.num_experts, cfg.top_k
    if ids.shape[1] < L or ids.shape[2] < K:
        raise ValueError(f"{trace_path}: a trace of {ids.shape[1]} layers, top-{ids.shape[2]}; the model needs "
                         f"{L} layers, top-{K}")
    state = {"call": 0, "tok": 0}

    def route(logits, lw=None, step=None):  # Transformer.route's signature
        T, layer = logits.shape[0], state["call"] % L
        rows = (state["tok"] + np.arange(T)) % len(ids)
        state["call"] += 1
        if layer == L - 1:
            state["tok"] += T
        return np.full((T, K), 1.0 / K, np.float32), ids[rows, layer, :K] % E

    def prefetch(layer, h, logits, step=None):  # Transformer.prefetch's (called where prediction_due())
        cache = net.w.experts
        if layer + 1 < L:
            rows = (state["tok"] + np.arange(h.shape[0])) % len(ids)
            cache.prefetch(layer + 1, np.unique(ahead[rows, layer, :K] % E), due=True)

    def given():  # FusedDecode.given: a whole token in one call
        picks = ids[state["tok"] % len(ids), :L, :K] % E
        state["call"], state["tok"] = state["call"] + L, state["tok"] + 1
        return picks

    net.route, net.prefetch = route, prefetch
    if net.fused is not None:
        net.fused.given = given


# Runs llama.cpp's own llama-bench (mmap on) in a child and reports its peak RSS and block reads.
_LLAMA_BENCH = r"""
import json, resource, subprocess, sys
exe, path, threads, prompt_n, decode_n, mode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
out = subprocess.run([exe, "-m", path, "-t", threads, "-p", prompt_n, "-n", decode_n, "-r", "1", "-lm", mode,
                      "-o", "json"], capture_output=True, text=True, check=True).stdout
rows = json.loads(out)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
tok_s = {("prefill" if r["n_prompt"] else "decode"): r["avg_ts"] for r in rows}
# llama-bench warms up with the whole prompt again and one generated token
tokens = sum(2 * r["n_prompt"] + r["n_gen"] + (r["n_gen"] > 0) for r in rows)
print(json.dumps({"engine": "llama.cpp", "mmap": mode == "mmap", "prefill_tok_s": tok_s.get("prefill", 0.0),
    "decode_tok_s": tok_s.get("decode", 0.0), "peak_rss_mb": ru.ru_maxrss * 1024 / 1e6,
    "read_mb_total": ru.ru_inblock * 512 / 1e6, "tokens_run": tokens}))
"""

# llama.cpp through its Python binding (the same libllama as llama-bench): decode stops after
# max_s seconds like Colibri's, and /proc/self/io counts the reads of the decode alone.
_LLAMA = r"""
import json, sys, time, numpy as np
from llama_cpp import Llama
path, threads, prompt_n, decode_n, mmap_on = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
max_s = float(sys.argv[6]) if len(sys.argv) > 6 else float("inf")
def io_read():
    return int(next(l for l in open('/proc/self/io') if l.startswith('read_bytes')).split()[1])
t0 = time.perf_counter()
m = Llama(path, n_ctx=1024, n_threads=threads, n_threads_batch=threads, n_batch=512, use_mmap=mmap_on, verbose=False)
load_s = time.perf_counter() - t0
vocab = m.n_vocab()
%TOKENS%t = time.perf_counter(); m.eval(ids); prefill = prompt_n / (time.perf_counter() - t)
r0, t, n, c0 = io_read(), time.perf_counter(), 0, time.process_time()
while n < decode_n and (n < 3 or time.perf_counter() - t < max_s):
    m.eval([stream[n]]); n += 1
decode = n / (time.perf_counter() - t)
hwm = int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024
print(json.dumps({"engine": "llama.cpp", "fed": stream[:n], "mmap": mmap_on, "load_s": load_s, "prefill_tok_s": prefill,
    "decode_tok_s": decode, "peak_rss_mb": hwm / 1e6, "read_mb_per_token": (io_read() - r0) / n / 1e6,
    "decode_tokens": n, "cpu_ms_per_token": (time.process_time() - c0) / n * 1e3}))
""".replace("%TOKENS%", _TOKENS)


def llama_python() -> str | None:
    """An interpreter that has llama_cpp: this one, or the repo's .venv-bench."""
    for py in (sys.executable, str(Path(__file__).resolve().parents[2] / ".venv-bench" / "bin" / "python")):
        if Path(py).exists() and subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
            return py
    return None


def prepare(workdir: Path, shape: MixtralShape = BENCH_SHAPE) -> tuple[Path, Path, dict]:
    """The benchmark model in both formats (built once, reused)."""
    from engine.convert.convert import convert
    from engine.convert.gguf_export import export_gguf
    hf, ours, gguf_path = workdir / "mixtral-hf", workdir / "mixtral-int8", workdir / "mixtral-q8_0.gguf"
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

def page_cache_bytes(path: Path) -> int:
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
        left += max(0, page_cache_bytes(p))
    return left


def warm(paths: list[Path], huge: bool = False) -> None:
    """Read the files into the page cache: with plain reads (small folios, as llama.cpp's mapped
    reads and any copy leave them), or `huge` through a MADV_HUGEPAGE mapping, as Colibri's misses
    read expert files (2 MiB folios: engine.expert_store)."""
    from engine.folios import read_ahead_huge
    for p in paths:
        if huge:
            fd = os.open(p, os.O_RDONLY)
            try:
                read_ahead_huge(fd, 0, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            continue
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

    def peak(self) -> int:
        """The most memory the group was charged (anonymous and page cache), bytes."""
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            if (self.path / name).exists():
                return int((self.path / name).read_text().split()[0])
        return -1

    def oom_kills(self) -> int:
        for name in ("memory.oom_control", "memory.events"):
            f = self.path / name
            if f.exists():
                for line in f.read_text().splitlines():
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        return -1

    def close(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def run_child(cmd: list[str], cgroup: MemoryCgroup | None, timeout: float, engine_root: Path | None = None,
              passive: bool = False) -> dict:
    """`engine_root`: the checkout whose engine the child imports (another branch, for before/after).
    `passive`: OMP_WAIT_POLICY=PASSIVE (OpenMP workers sleep instead of spinning between regions)."""
    env = dict(os.environ, PYTHONPATH=str(engine_root or Path(__file__).resolve().parents[2]))
    env.pop("OMP_WAIT_POLICY", None)  # each engine picks its own OpenMP wait policy, unless the user set one
    if _USER_OMP_WAIT is not None or passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE" if passive else _USER_OMP_WAIT
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=engine_root,
                              preexec_fn=cgroup.enter if cgroup else None)  # (-c imports from the cwd first)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        killed = proc.returncode in (-9, 137)
        return {"error": "killed (out of memory)" if killed else proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def llama_bench() -> Path | None:
    """llama.cpp's own llama-bench, if built (COLIBRI_LLAMA_BIN or .llama.cpp/build/bin)."""
    from app.bench.llamacpp import bin_dir
    b = bin_dir("COLIBRI_LLAMA_BIN") / "llama-bench"
    return b if b.exists() else None


def disk_bandwidth(files: list[Path], nbytes: int = 256 << 20) -> float:
    """Bytes/s of cold O_DIRECT reads in 1 MiB pieces over these files (4 threads), as the expert
    store reads: the bound on how fast missed experts can come in."""
    from concurrent.futures import ThreadPoolExecutor
    buf = mmap.mmap(-1, 4 << 20)
    evict(files)
    jobs, left = [], nbytes
    for p in files:
        size = p.stat().st_size // 4096 * 4096
        jobs += [(p, off) for off in range(0, min(size, left), 1 << 20)]
        left -= size
        if left <= 0:
            break
    fds = {p: os.open(p, os.O_RDONLY | getattr(os, "O_DIRECT", 0)) for p, _ in jobs}
    views = [memoryview(buf)[i << 20:(i + 1) << 20] for i in range(4)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as ex:
        done = sum(ex.map(lambda ij: os.preadv(fds[jobs[ij][0]], [views[ij % 4]], jobs[ij][1]), range(len(jobs))))
    dt = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    return done / dt


CAPS = (None, 0.9, 0.75, 0.6, 0.5, 0.35)  # fractions of the model's size; None: no cap, files warm
PRESETS = ("q8_0", "q4_k_m")  # the GGUFs llama.cpp writes; Colibri imports the same files
CONVERT_HF = str(Path(os.environ.get("COLIBRI_LLAMA_CPP") or Path(__file__).resolve().parents[2] / ".llama.cpp")
                 / "convert_hf_to_gguf.py")  # the llama.cpp tree beside the checkout (docs/bench/README.md)


def llamacpp_gguf(workdir: Path, preset: str) -> Path:
    """The benchmark model as llama.cpp's own tools write it: convert_hf_to_gguf.py --outtype q8_0,
    or --outtype f16 then llama-quantize to the preset (built once, kept in workdir)."""
    out = workdir / f"mixtral-{preset}-llamacpp.gguf"
    if out.exists():
        return out
    from app.bench.workers import converter_python
    hf, exe = workdir / "mixtral-hf", llama_bench()
    if preset == "q8_0":
        subprocess.run([converter_python(), CONVERT_HF, str(hf), "--outtype", "q8_0", "--outfile", str(out)], check=True,
                       capture_output=True)
        return out
    if exe is None:
        raise FileNotFoundError("llama-quantize not found (COLIBRI_LLAMA_BIN)")
    f16 = workdir / "mixtral-f16-llamacpp.gguf"
    if not f16.exists():
        subprocess.run([converter_python(), CONVERT_HF, str(hf), "--outtype", "f16", "--outfile", str(f16)], check=True,
                       capture_output=True)
    subprocess.run([str(exe.parent / "llama-quantize"), str(f16), str(out), preset.upper()], check=True,
                   capture_output=True)
    return out


def colibri_import(gguf: Path) -> Path:
    """Colibri's import of llama.cpp's file, formats kept (built once)."""
    from engine.convert.convert import convert
    out = gguf.with_suffix("")
    if not (out / "manifest.json").exists():
        convert(gguf, out, None, force=True)
    return out


def run_suite(workdir: Path, caches: list[str], threads: int, ram_caps: list[float | None], decode_tokens: int,
              timeout: float, shape: MixtralShape = BENCH_SHAPE, engine_root: Path | None = None,
              with_llama: bool = True, presets: tuple[str, ...] = ("q8_0",), repeats: int = 1,
              trace: Path | None = None, capped: tuple[str, ...] = ("auto",),
              prompt_tokens: int = PROMPT_TOKENS, decode_s: float = math.inf) -> dict:
    """Every (preset, cap, engine) run `repeats` times, the engines' order reversed every other
    round so that neither always runs first; capped runs start with the model's files evicted
    from the page cache. Uncapped, Colibri runs once per entry of `caches`; capped, with its auto
    budget (`capped`: its variants, e.g. auto/p0 for prefetch off). With `trace`, Colibri also runs with the trace's routing replayed (llama.cpp cannot)."""
    prepare(workdir, shape)
    info = {"shape": shape.__dict__, "params": shape.params(), "presets": {}}
    models = {}
    for preset in presets:
        gguf = llamacpp_gguf(workdir, preset)
        ours = colibri_import(gguf)
        models[preset] = (gguf, ours)
        info["presets"][preset] = {"gguf_mb": gguf.stat().st_size / 1e6,
                                   "colibri_mb": sum(p.stat().st_size for p in ours.rglob("*") if p.is_file()) / 1e6}
    first = models[presets[0]][1]
    info["disk_mb_s"] = disk_bandwidth(sorted((first / "experts").glob("*.bin"))) / 1e6
    from app.bench.llamacpp import use_binding_beside
    bench_exe = llama_bench()
    use_binding_beside(bench_exe)  # the binding loads the libllama built beside llama-bench
    py_llama = llama_python()
    results = {"model": info, "threads": threads, "engine_root": str(engine_root or ""), "repeats": repeats,
               "trace": str(trace or ""), "runs": []}
    for preset in presets:  # Numba compiles on the first run (with a cold cache ~300 MB more): not under a cap;
        # all resident (the fused decode) and streaming (the layered path, trace replay) compile apart
        for cache, tr in (("auto", ""), ("2", str(trace or ""))):
            r = run_child([sys.executable, "-c", _COLIBRI, str(models[preset][1]), cache, str(threads), "8", "2", tr],
                          None, timeout, engine_root)
            results.setdefault("compile_run_s", []).append(r.get("load_s"))
    for rep in range(repeats):
        for preset in presets:
            gguf, ours = models[preset]
            for cap in ram_caps or [None]:
                plan = [("colibri", c, routing) for c in (caches if cap is None else capped)
                        for routing in (["random"] + (["trace"] if trace else []))]
                if with_llama:
                    plan += [("llama.cpp", "mmap", "model"), ("llama.cpp", "none", "model")]
                disk = info["disk_mb_s"]
                if cap is not None:  # the disk's speed now: it moves with the host (2x within an hour here)
                    disk = disk_bandwidth(sorted((ours / "experts").glob("*.bin"))) / 1e6
                for engine, arg, routing in plan[::-1] if rep % 2 else plan:
                    r = _one_run(engine, arg, routing, cap, gguf, ours, info["presets"][preset], threads,
                                 decode_tokens, timeout, engine_root, bench_exe, py_llama, trace, prompt_tokens,
                                 decode_s)
                    r |= {"preset": preset, "repeat": rep}
                    r["disk_mb_s"] = disk
                    if r.get("missed_mb_per_token"):
                        r["io_bound_tok_s"] = disk / r["missed_mb_per_token"]
                    results["runs"].append(r)
                    print(run_line(r), file=sys.stderr, flush=True)
    results["medians"] = medians(results["runs"])
    return results


def _one_run(engine: str, arg: str, routing: str, cap: float | None, gguf: Path, ours: Path, sizes: dict,
             threads: int, decode_tokens: int, timeout: float, engine_root: Path | None, bench_exe: Path | None,
             py_llama: str | None, trace: Path | None, prompt_tokens: int = PROMPT_TOKENS,
             decode_s: float = math.inf) -> dict:
    """One engine in a fresh process (in a cgroup of `cap` x the model's size, cold page cache)."""
    base = {"engine": engine, "ram_cap": cap, "variant": arg, "routing": routing}
    if engine == "llama.cpp" and bench_exe is None and py_llama is None:
        return base | {"error": "llama.cpp not found (its Python binding or llama-bench)"}
    files = sorted(ours.rglob("*.bin")) if engine == "colibri" else [gguf]
    size = (sizes["colibri_mb"] if engine == "colibri" else sizes["gguf_mb"]) * 1e6
    group, left = None, 0
    if cap is None:
        # the uncapped comparison is with the files in the page cache as each engine's own reads leave
        # them: Colibri's expert files in 2 MiB folios (its misses read them so, and have small ones
        # read again so), the rest with plain reads (llama.cpp maps its GGUF without MADV_HUGEPAGE;
        # in 2 MiB folios its Q8_0 decode measured 43.5 against 41.5 tok/s, AMD EPYC Zen 3, 2 threads)
        evict(files)
        experts = [f for f in files if f.parent.name == "experts"] if engine == "colibri" else []
        warm(experts, huge=True)
        warm([f for f in files if f not in experts])
    else:
        left = evict(files)
        try:
            group = MemoryCgroup(int(cap * size))
        except OSError as e:
            return base | {"error": f"no cgroup: {e}"}
    if engine == "colibri":
        cmd = [sys.executable, "-c", _COLIBRI, str(ours), arg, str(threads), str(prompt_tokens), str(decode_tokens),
               str(trace) if routing == "trace" else "", str(decode_s)]
    elif py_llama is not None:  # the binding: a decode bounded in time, its reads counted alone
        cmd = [py_llama, "-c", _LLAMA, str(gguf), str(threads), str(prompt_tokens), str(decode_tokens),
               "1" if arg == "mmap" else "0", str(decode_s)]
    else:
        cmd = [sys.executable, "-c", _LLAMA_BENCH, str(bench_exe), str(gguf), str(threads), str(prompt_tokens),
               str(decode_tokens), arg]
    t0 = time.perf_counter()
    r = run_child(cmd, group, timeout, engine_root)
    if group:
        r |= {"cgroup_peak_mb": group.peak() / 1e6, "oom_kills": group.oom_kills(), "page_cache_left_mb": left / 1e6}
        group.close()
    if "error" in r and r.get("oom_kills", 0) > 0:
        r["error"] = "killed (out of memory)"
    if "read_mb_total" in r and r.get("tokens_run"):
        r["read_mb_per_token"] = r["read_mb_total"] / r["tokens_run"]
    return r | base | {"cap_mb": None if cap is None else cap * size / 1e6, "wall_s": time.perf_counter() - t0}


def main(args) -> int:
    if getattr(args, "from_json", None):  # the page's block regenerated from a finished run
        res = json.loads(Path(args.from_json).read_text())
        if args.readme:
            write_readme(res, Path(args.readme), args.from_json)
        print(markdown(res))
        return 0
    shape = getattr(args, "shape", "large")
    default = Path.home() / ".cache" / "colibri" / "bench" / ("" if shape == "large" else shape)
    workdir = Path(args.workdir or default).expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(workdir).free < 8e9:
        print(f"{workdir}: needs about 8 GB free", file=sys.stderr)
        return 1
    if getattr(args, "matrix", False):
        caps = list(CAPS)
    else:
        caps = [None if c == "none" else float(c) for c in args.ram_cap.split(",")] if args.ram_cap else []
    caches = args.caches.split(",")
    root = getattr(args, "engine_root", None)
    presets = tuple(getattr(args, "presets", "q8_0").split(","))
    trace = Path(args.trace) if getattr(args, "trace", None) else None
    load_before = [round(x, 1) for x in os.getloadavg()]
    res = run_suite(workdir, caches, args.threads, caps, args.decode_tokens, args.timeout, SHAPES[shape],
                    Path(root).resolve() if root else None, not getattr(args, "no_llama", False), presets,
                    getattr(args, "repeats", 1), trace, tuple(getattr(args, "capped", "auto").split(",")),
                    getattr(args, "prompt_tokens", PROMPT_TOKENS), getattr(args, "decode_seconds", math.inf))
    from app.bench.report import machine, stamp
    res |= stamp() | {"machine": machine(), "load_before": load_before, "load_after": [round(x, 1) for x in os.getloadavg()],
            "prompt_tokens": getattr(args, "prompt_tokens", PROMPT_TOKENS),
            "decode_tokens": args.decode_tokens, "decode_seconds": getattr(args, "decode_seconds", None),
            "decode_input": DECODE_INPUT, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    text = json.dumps(res, indent=1, default=str)
    if args.json:
        Path(args.json).write_text(text + "\n")
    if getattr(args, "markdown", None):
        Path(args.markdown).write_text(markdown(res))
    if getattr(args, "readme", None):
        write_readme(res, Path(args.readme), args.json or "this run")
    print(markdown(res))
    return 0
