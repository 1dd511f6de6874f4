"""colibri-bench: measurements that are printed, never asserted.

    colibri-bench convert [--model_path SRC | --synthetic_mb 1000] [--quantize int8] [--json FILE]
    colibri-bench speed [--model default,moe-q8_0,moe-q4_0] [--threads 1,2] [--runs 3] [--json FILE]
    colibri-bench profile [--model default] [--threads 2] [--json FILE]
    colibri-bench fuzz [--files A.gguf,HF_FOLDER] [--default_model] [--seconds 60] [--json FILE]
    colibri-bench fuzz --server [--model FOLDER] [--seconds 60] [--json FILE]
    colibri-bench perplexity --model M --text FILE [--ctx 512] [--reference M2] [--json FILE]
    colibri-bench serve [--clients 1,2,4,8,16] [--requests 2 | --duration 120] [--soak 1000] [--json FILE]
    colibri-bench make-scale --shape qwen3-30b-a3b --preset Q4_K_M [--layers 4] --out FILE [--json FILE]
    colibri-bench schemas [--model FOLDER] [--json FILE]   (replies held to 50+ JSON schemas: share valid, mask cost)
    colibri-bench docs [--check]     (the generated tables of README.md and docs/, from the saved JSONs)

`convert` times a conversion in a child process and reports its throughput and peak resident
memory beside the streaming bound (3 × the largest tensor + 300 MB). `speed` runs Colibri,
llama.cpp and transformers on the same model, alternating, and reports decode/prefill speed,
time to first token, load time, peak memory and decode as a share of the memory-bandwidth
limit (app/bench/speed.py). `profile` splits a decoded token's time by kernel and tensor
(app/bench/profile.py). `perplexity` measures what a quantization costs, as llama-perplexity
does, beside llama-perplexity itself (app/bench/perplexity.py).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.bench import docs as bench_docs
from app.bench import duel as bench_duel
from app.bench import fuzz as bench_fuzz
from app.bench import perplexity as bench_perplexity
from app.bench import quality as bench_quality
from app.bench import profile as bench_profile
from app.bench import routing as bench_routing
from app.bench import scale_models as bench_scale_models
from app.bench import schemas as bench_schemas
from app.bench import serve as bench_serve
from app.bench import spec as bench_spec
from app.bench import speed as bench_speed
from app.bench.models import shape_for_size, write_checkpoint
from engine import kernels


def _largest_tensor_bytes(model_path: Path) -> int:
    from engine.convert.convert import open_source
    src = open_source(model_path)
    try:
        return max(t.nbytes for t in src.tensors.values())
    finally:
        src.close()


def _source_bytes(model_path: Path) -> int:
    if model_path.is_file():
        return model_path.stat().st_size
    return sum(p.stat().st_size for p in model_path.glob("*.safetensors"))


# The child reads its own high-water mark (VmHWM belongs to the exec'd image; ru_maxrss would
# also count the parent's pages at fork time).
_CHILD = """
import sys
from app.cli_convert import main
code = main(sys.argv[1:])
hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))
print('PEAK_RSS_KB', hwm.split()[1], file=sys.stderr)
sys.exit(code)
"""


def measure_conversion(model_path: Path, out: Path, quantize: str | None) -> dict:
    """Convert in a fresh process and report its throughput and peak resident memory."""
    cmd = [sys.executable, "-c", _CHILD, "--model_path", str(model_path), "--output_path", str(out),
           "--force", "--quiet"] + (["--quantize", quantize] if quantize else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"conversion failed:\n{proc.stderr}")
    peak_kb = int(proc.stderr.rsplit("PEAK_RSS_KB", 1)[1].split()[0])
    largest = _largest_tensor_bytes(model_path)
    src = _source_bytes(model_path)
    written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"source_mb": src / 1e6, "output_mb": written / 1e6, "seconds": seconds,
            "mb_per_s": src / 1e6 / seconds, "peak_rss_mb": peak_kb / 1024,
            "largest_tensor_mb": largest / 1e6,
            "rss_bound_mb": 3 * largest / 1e6 + 300, "quantize": quantize or "default"}


def cmd_convert(args: argparse.Namespace) -> int:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="colibri-bench-"))
    try:
        src = Path(args.model_path) if args.model_path else None
        if src is None:
            shape = shape_for_size(args.synthetic_mb)
            src = write_checkpoint(work / "synthetic-mixtral", shape)
            print(f"synthetic Mixtral-style checkpoint: {shape.layers} layers x {shape.experts} experts, "
                  f"{shape.params() / 1e6:.0f}M parameters, {_source_bytes(src) / 1e6:.0f} MB bf16")
        result = measure_conversion(src, work / "converted", args.quantize)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    for k, v in result.items():
        print(f"{k:>18}: {v:.1f}" if isinstance(v, float) else f"{k:>18}: {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def cmd_loads(args: argparse.Namespace) -> int:
    from app.bench.loads import measure_loads, measure_repack
    result = measure_loads(Path(args.model)) | measure_repack(Path(args.model))
    if args.against:  # the same model in the other expert layout: decode both, alternating
        from app.bench.loads import measure_layout_decode
        ours = "repacked" if result["repacked_on_disk"] else "stored"
        other = "stored" if ours == "repacked" else "repacked"
        result |= measure_layout_decode({ours: Path(args.model), other: Path(args.against)}, args.threads,
                                        args.decode_tokens, args.cache)
    for k, v in result.items():
        print(f"{k:>34}: {v:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="colibri-bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="conversion throughput and peak memory")
    c.add_argument("--model_path", help="a GGUF file or HF folder (default: a synthetic checkpoint)")
    c.add_argument("--synthetic_mb", type=float, default=1000, help="size of the synthetic checkpoint")
    c.add_argument("--quantize", default="int8")
    c.add_argument("--workdir", help="keep the files here instead of a temporary folder")
    c.add_argument("--keep", action="store_true", help="do not delete the temporary folder")
    c.add_argument("--json", help="also write the figures to this file")
    c.set_defaults(func=cmd_convert)
    bench_speed.add_parser(sub)
    bench_profile.add_parser(sub)
    bench_fuzz.add_parser(sub)
    bench_perplexity.add_parser(sub)
    bench_serve.add_parser(sub)
    bench_routing.add_parser(sub)
    bench_duel.add_parser(sub)
    bench_quality.add_parser(sub)
    bench_docs.add_parser(sub)
    bench_scale_models.add_parser(sub)
    bench_schemas.add_parser(sub)
    bench_spec.add_parser(sub)
    m = sub.add_parser("memory", help="expert cache vs llama.cpp on a Mixtral-style model (peak RSS, tok/s)")
    m.add_argument("--workdir", help="where the benchmark model is built and kept (default ~/.cache/colibri/bench)")
    m.add_argument("--caches", default="auto,2", help="Colibri expert_cache_size values for uncapped runs (auto allowed; "
                        "'2/p0': prefetch_window 0, for a prefetch A/B; '2/lru': LRU eviction instead of the default LFU)")
    m.add_argument("--ram_cap", help="comma-separated fractions of the model size: run each engine in a memory "
                                     "cgroup that small (needs root), e.g. none,0.75,0.5")
    m.add_argument("--matrix", action="store_true", help="caps none,0.9,0.75,0.6,0.5,0.35 (overrides --ram_cap)")
    m.add_argument("--capped", default="auto", help="Colibri variants for capped runs, e.g. auto,auto/p0")
    m.add_argument("--presets", default="q8_0", help="GGUF presets llama.cpp writes, e.g. q8_0,q4_k_m")
    m.add_argument("--repeats", type=int, default=3, help="rounds over every run (medians are reported)")
    m.add_argument("--trace", help="also run Colibri with this routing trace replayed (colibri-bench routing --trace)")
    m.add_argument("--markdown", help="write the median table to this file")
    m.add_argument("--doc", "--readme", dest="readme",
                   help="regenerate this page's generated memory block (docs/bench/memory.md) from the run (or --from_json)")
    m.add_argument("--from_json", help="no run: read this earlier --json result (with --doc: regenerate the page's block)")
    m.add_argument("--gguf", help="instead of the Mixtral-style model: this MoE GGUF (e.g. make-scale's), Colibri's "
                   "import of it against llama-bench mmap --repack 0, caps from --ram_cap (default 0.75,0.5)")
    m.add_argument("--shape", choices=("large", "moderate"), default="large",
                   help="large: 1.75B parameters (1.9 GB in Q8_0); moderate: 0.68B (0.72 GB)")
    m.add_argument("--engine_root", help="run Colibri from this checkout instead (e.g. main, for before/after)")
    m.add_argument("--no_llama", action="store_true", help="Colibri runs only")
    m.add_argument("--threads", type=int, default=2)
    m.add_argument("--decode_tokens", type=int, default=48)
    m.add_argument("--prompt_tokens", type=int, default=128, help="prompt length of each run (prefill)")
    m.add_argument("--decode_seconds", type=float, default=float("inf"),
                   help="a run's decode stops after this many seconds (at least 3 tokens): bounds a thrashing cap")
    m.add_argument("--timeout", type=float, default=900, help="seconds per run before it counts as failed")
    m.add_argument("--json", help="also write the results to this file")
    m.set_defaults(func=lambda a: __import__("app.bench.memory_scale" if a.gguf else "app.bench.memory",
                                             fromlist=["main"]).main(a))
    lo = sub.add_parser("loads", help="cold and warm expert loads: each read mode, mmap, repack on a miss")
    lo.add_argument("--model", required=True, help="a converted MoE model folder")
    lo.add_argument("--against", metavar="DIR", help="the same model converted in the other expert layout "
                    "(colibri-convert --no-repack_experts): both decode the same tokens, paired token by token")
    lo.add_argument("--threads", type=int, default=2, help="with --against")
    lo.add_argument("--decode_tokens", type=int, default=150, help="with --against")
    lo.add_argument("--cache", type=int, default=2, help="with --against: experts cached a layer")
    lo.add_argument("--json", help="also write the results to this file")
    lo.set_defaults(func=cmd_loads)
    pl = sub.add_parser("pool", help="memory pool: per-tier locks against one global lock, 2 threads")
    pl.set_defaults(func=lambda a: print(__import__("app.bench.loads", fromlist=["x"]).measure_pool_locks()) or 0)
    args = ap.parse_args(argv)
    kernels.setup()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
