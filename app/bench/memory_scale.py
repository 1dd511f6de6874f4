"""colibri-bench memory --gguf: the expert cache at real scale, on any MoE GGUF (make-scale's random
Qwen3-30B-A3B shape, or a real file): Colibri (its import of the file) and llama.cpp's llama-bench
(mmap, --repack 0: its default repacks into anonymous memory and is OOM-killed under a cap), each in
a fresh process inside a memory cgroup of a fraction of the file, after the files were evicted from
the page cache, engines alternating. Beside each Colibri figure: the bytes it missed a token, the
disk's O_DIRECT bandwidth measured just before (dd iflag=direct over the file), the I/O bound they
imply (bandwidth / missed bytes a token) and the share of it reached.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from app.bench.memory import _COLIBRI, MemoryCgroup, colibri_import, evict, llama_bench, run_child


def dd_bandwidth(path: Path, nbytes: int = 1 << 30) -> float:
    """Bytes/s of one cold O_DIRECT pass (dd iflag=direct bs=4M) over the file's first `nbytes`."""
    evict([path])
    out = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M", f"count={nbytes >> 22}", "iflag=direct"],
                         capture_output=True, text=True, check=True).stderr
    m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", out)
    return int(m.group(1)) / float(m.group(2))


_LLAMA_BENCH = r"""
import json, subprocess, sys
exe, path, threads, prompt_n, decode_n = sys.argv[1:6]
rows = json.loads(subprocess.run([exe, "-m", path, "-t", threads, "-p", prompt_n, "-n", decode_n, "-r", "1",
                                  "-lm", "mmap", "--repack", "0", "-o", "json"], capture_output=True, text=True,
                                 check=True).stdout)
print(json.dumps({("prefill_tok_s" if r["n_prompt"] else "decode_tok_s"): r["avg_ts"] for r in rows}))
"""


def one_run(engine: str, gguf: Path, ours: Path, cap: float, threads: int, prompt: int, decode: int,
            decode_s: float, timeout: float, engine_root: Path | None = None) -> dict:
    """One engine in a fresh process, in a cgroup of `cap` x the file's size, the page cache cold."""
    files = sorted(ours.rglob("*.bin")) + [gguf]
    evict(files)
    group = MemoryCgroup(int(cap * gguf.stat().st_size))
    if engine == "colibri":
        cmd = [sys.executable, "-c", _COLIBRI, str(ours), "auto", str(threads), str(prompt), str(decode), "",
               str(decode_s)]
    else:
        cmd = [sys.executable, "-c", _LLAMA_BENCH, str(llama_bench()), str(gguf), str(threads), str(prompt),
               str(decode)]
    t0 = time.perf_counter()
    try:
        r = run_child(cmd, group, timeout, engine_root if engine == "colibri" else None)
        r |= {"cgroup_peak_mb": group.peak() / 1e6, "oom_kills": group.oom_kills()}
    finally:
        group.close()
    r.pop("fed", None)
    return r | {"engine": engine, "ram_cap": cap, "wall_s": time.perf_counter() - t0}


def run(gguf: Path, caps: list[float], threads: int, prompt: int, decode: int, decode_s: float, repeats: int,
        timeout: float, with_llama: bool = True, engine_root: Path | None = None) -> dict:
    """Every cap's runs `repeats` times, the engines' order reversed every other round. `engine_root`:
    Colibri from another checkout (before/after)."""
    ours = colibri_import(gguf)
    runs = []
    for rep in range(repeats):
        for cap in caps:
            disk = dd_bandwidth(gguf)
            plan = ["colibri"] + (["llama.cpp"] if with_llama else [])
            for engine in plan[::-1] if rep % 2 else plan:
                r = one_run(engine, gguf, ours, cap, threads, prompt, decode, decode_s, timeout, engine_root)
                r |= {"repeat": rep, "disk_mb_s": disk / 1e6}
                if r.get("missed_mb_per_token"):
                    r["io_bound_tok_s"] = disk / 1e6 / r["missed_mb_per_token"]
                    r["share_of_io_bound"] = r["decode_tok_s"] / r["io_bound_tok_s"]
                if r.get("prefill_tok_s"):
                    r["prompt_s"] = prompt / r["prefill_tok_s"]
                runs.append(r)
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                                  if k not in ("read_ways_mb",)}), file=sys.stderr, flush=True)
    return {"gguf": str(gguf), "gguf_mb": gguf.stat().st_size / 1e6, "threads": threads, "prompt_tokens": prompt,
            "decode_tokens": decode, "runs": runs}


def markdown(res: dict) -> str:
    """One line per run: cap, engine, decode, prompt, what the Colibri run read and the bound it implies."""
    def f(v, spec=".2f"):
        return "–" if v is None else format(v, spec)
    lines = [f"{res['gguf']} ({res['gguf_mb']:.0f} MB), {res['threads']} threads, prompt {res['prompt_tokens']} tokens",
             "", "| cap | engine | decode tok/s | prompt s | hit rate | missed MB/token | disk MB/s (dd direct) "
             "| I/O bound tok/s | share | routing entropy (of max) | cgroup peak MB | OOM kills | CPU ms/token "
             "| major faults/token |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        ent = r.get("routing_entropy_bits")
        ent = None if ent is None else f"{ent:.2f} bits ({ent / r['max_entropy_bits']:.2f})"
        lines.append(f"| {r['ram_cap']} | {r['engine']} | {f(r.get('decode_tok_s'))} | {f(r.get('prompt_s'), '.1f')} "
                     f"| {f(r.get('hit_rate'))} | {f(r.get('missed_mb_per_token'), '.1f')} | {f(r.get('disk_mb_s'), '.0f')} "
                     f"| {f(r.get('io_bound_tok_s'), '.1f')} | {f(r.get('share_of_io_bound'), '.1%')} | {ent or '–'} "
                     f"| {f(r.get('cgroup_peak_mb'), '.0f')} | {r.get('oom_kills', '–')} "
                     f"| {f(r.get('cpu_ms_per_token'), '.0f')} | {f(r.get('major_faults_per_token'), '.1f')} |"
                     + (f" {r['error']}" if "error" in r else ""))
    return "\n".join(lines)


def main(args) -> int:
    caps = [float(c) for c in (args.ram_cap or "0.75,0.5").split(",")]
    res = run(Path(args.gguf), caps, args.threads, args.prompt_tokens, args.decode_tokens, args.decode_seconds,
              args.repeats, args.timeout, not args.no_llama, Path(args.engine_root).resolve() if args.engine_root else None)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    print(markdown(res))
    return 0
