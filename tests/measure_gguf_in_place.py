"""Measure a GGUF run in place at real scale (issue 43 item 6): the time to index it, the disk the model
folder takes, the time to load it with a small expert cache, what O_DIRECT's 4 KiB alignment costs
with GGUF offsets (32-byte aligned), and a few decoded tokens.

    python tests/measure_gguf_in_place.py ~/.cache/colibri/bench/qwen3-30b-a3b-Q4_K_M.gguf \
        --out /tmp/qwen3-30b-in-place --cache_gb 2

Not a test: it reads an 18 GB file (colibri-bench make-scale writes it). Misses are timed cold: each
sampled expert's runs are dropped from the page cache first (POSIX_FADV_DONTNEED of those ranges only).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import kernels  # noqa: E402

kernels.setup()

import numpy as np  # noqa: E402

from engine.api import Engine  # noqa: E402
from engine.convert.convert import convert  # noqa: E402
from engine.expert_store import ExpertStore  # noqa: E402
from engine.mempool import MemoryPool  # noqa: E402
from engine.model_dir import open_model_dir  # noqa: E402


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def rss_mb() -> tuple[float, float]:
    st = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(st["VmRSS"].split()[0]) / 1024, int(st["VmHWM"].split()[0]) / 1024


def cold_misses(model, mode: str, keys: list, pool: MemoryPool) -> list[float]:
    store = ExpertStore(model, read_mode=mode)
    block = pool.alloc(max(store.span(*k).slot_bytes for k in keys))
    buf = block.array(np.uint8, (block.size,))
    times = []
    try:
        fd = os.open(model.gguf, os.O_RDONLY)
        for k in keys:
            for off, n in store.span(*k).runs:
                os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)
            t = time.perf_counter()
            store.read_into(*k, buf)
            times.append(time.perf_counter() - t)
        os.close(fd)
    finally:
        block.free()
        store.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cache_gb", type=float, default=2.0)
    ap.add_argument("--misses", type=int, default=96, help="experts read cold per read mode")
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()

    t = time.perf_counter()
    r = convert(args.gguf, args.out, in_place=True, force=True)
    print(f"index: {time.perf_counter() - t:.2f} s for a {args.gguf.stat().st_size / 1e9:.2f} GB GGUF; "
          f"folder {disk_bytes(args.out) / 1e3:.0f} KB on disk ({r.bytes_written / 1e3:.0f} KB of files)")

    model = open_model_dir(args.out)
    cfg, store = model.config, ExpertStore(model)
    spans = [store.span(L, e) for L in range(cfg.dense_layers, cfg.num_layers) for e in range(cfg.num_experts)]
    extra = [s.slot_bytes - s.nbytes for s in spans]
    aligned = sum(o % 4096 == 0 for s in spans for o, _ in s.runs)
    print(f"alignment: {len(spans)} routed experts of {spans[0].nbytes / 1e6:.3f} MB in {len(spans[0].runs)} runs; "
          f"O_DIRECT reads {statistics.mean(extra) / 1e3:.1f} KB more per expert (mean, max {max(extra) / 1e3:.1f}; "
          f"{100 * sum(extra) / sum(s.nbytes for s in spans):.2f}% of the bytes); "
          f"{aligned} of {sum(len(s.runs) for s in spans)} runs start on a 4 KiB page")
    store.close()

    pool = MemoryPool()
    rng = random.Random(0)
    keys = rng.sample([(L, e) for L in range(cfg.dense_layers, cfg.num_layers) for e in range(cfg.num_experts)],
                      2 * args.misses)
    for mode, ks in (("direct", keys[:args.misses]), ("dontneed", keys[args.misses:])):
        ts = cold_misses(model, mode, ks, pool)
        med = statistics.median(ts)
        print(f"cold miss, {mode}: median {1e3 * med:.2f} ms per expert ({spans[0].nbytes / med / 1e9:.2f} GB/s of "
              f"expert bytes), mean {1e3 * statistics.mean(ts):.2f} ms, {len(ts)} experts")

    t = time.perf_counter()
    eng = Engine(args.out, threads=2, expert_cache_bytes=int(args.cache_gb * 1e9), context_length=256)
    load = time.perf_counter() - t
    rss, hwm = rss_mb()
    print(f"load: {load:.2f} s (expert cache {args.cache_gb} GB); RSS {rss:.0f} MB, peak {hwm:.0f} MB")
    try:
        t, ids, text = time.perf_counter(), [], ""
        for step in eng.generate("The capital of France is", max_tokens=args.tokens, temperature=0.0):
            if step.token_id is not None:
                ids.append(step.token_id)
            text += step.text
        dt = time.perf_counter() - t
        rss, hwm = rss_mb()
        print(f"decode: {len(ids)} tokens in {dt:.1f} s (prompt included; random weights: the text is noise) "
              f"{ids}; RSS {rss:.0f} MB, peak {hwm:.0f} MB")
    finally:
        eng.close()


if __name__ == "__main__":
    main()
