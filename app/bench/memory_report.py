"""colibri-bench memory's report: the medians of a matrix's runs, its table, and the block of
docs/bench/memory.md generated from its JSON (app/bench/memory.py runs the matrix)."""
from __future__ import annotations

from pathlib import Path

from app.bench.report import dated, replace_generated

MEDIAN_KEYS = ("decode_tok_s", "prefill_tok_s", "peak_rss_mb", "cgroup_peak_mb", "read_mb_per_token", "cpu_ms_per_token",
               "missed_mb_per_token", "io_bound_tok_s", "hit_rate", "prefetch_accuracy", "budget_mb")


def medians(runs: list[dict]) -> list[dict]:
    """Per (preset, cap, engine, variant, routing): the median of each figure over its runs, the
    number of runs, failures and OOM kills."""
    import statistics
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        key = (r.get("preset"), r.get("ram_cap"), r["engine"], r.get("variant"), r.get("routing"))
        groups.setdefault(key, []).append(r)
    out = []
    for (preset, cap, engine, variant, routing), rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        row = {"preset": preset, "ram_cap": cap, "engine": engine, "variant": variant, "routing": routing,
               "runs": len(rs), "failed": len(rs) - len(ok), "oom_kills": sum(max(0, r.get("oom_kills", 0)) for r in rs),
               "errors": sorted({str(r["error"]) for r in rs if "error" in r})}
        for k in MEDIAN_KEYS:
            vals = [r[k] for r in ok if r.get(k) is not None]
            row[k] = statistics.median(vals) if vals else None
        if engine == "colibri":
            row["decode_values"] = [round(r["decode_tok_s"], 2) for r in ok]
        out.append(row)
    return out


def markdown(results: dict) -> str:
    """The memory table from a run's medians: per preset and cap, each engine's decode
    tok/s and what it cost (peak RSS, the cgroup's peak, bytes read per token)."""
    def fmt(v, spec=".1f"):
        return "–" if v is None else format(v, spec)
    lines = [f"| model | cap | engine | decode tok/s (median of {results['repeats']}) | × llama.cpp mmap | peak RSS MB "
             f"| cgroup peak MB | read MB/token | I/O bound tok/s | hit rate | prefetch acc. |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    mmap = {(m["preset"], m["ram_cap"]): m["decode_tok_s"] for m in results["medians"]
            if m["engine"] == "llama.cpp" and m["variant"] == "mmap"}
    for m in results["medians"]:
        peer = mmap.get((m["preset"], m["ram_cap"]))
        ratio = m["decode_tok_s"] / peer if m["engine"] == "colibri" and peer and m["decode_tok_s"] else None
        name = m["engine"] if m["engine"] == "llama.cpp" else f"Colibri ({m['variant']}, {m['routing']} routing)"
        if m["engine"] == "llama.cpp":
            name += " mmap" if m["variant"] == "mmap" else " --no-mmap"
        refused = sum("InsufficientMemoryError" in e for e in m["errors"])
        dec = fmt(m["decode_tok_s"], ".2f") + (f" ({m['failed']} failed)" if m["failed"] and not refused else "")
        if refused:  # below dense weights + 200 MB: refused before loading, by design (never OOM-killed)
            dec += " (refused: below dense weights + 200 MB)"
        elif m["oom_kills"]:
            dec += f", {m['oom_kills']} OOM-killed"
        lines.append(f"| {m['preset']} | {m['ram_cap'] or 'none'} | {name} | {dec} | {fmt(ratio, '.2f')} | "
                     f"{fmt(m['peak_rss_mb'], '.0f')} | "
                     f"{fmt(m['cgroup_peak_mb'], '.0f')} | {fmt(m['read_mb_per_token'])} | "
                     f"{fmt(m['io_bound_tok_s'])} | {fmt(m['hit_rate'], '.2f')} | {fmt(m['prefetch_accuracy'], '.2f')} |")
    return "\n".join(lines) + "\n"


README_END = "<!-- colibri-bench memory: end -->"  # (the block's markers: app.bench.report.replace_generated)


def memory_block(results: dict) -> str:
    """The generated memory block: its provenance, how the matrix ran, then its median table."""
    m = results["model"]
    sizes = ", ".join(f"{k} {v['gguf_mb']:.0f} MB" for k, v in m.get("presets", {}).items())
    shape = m.get("shape", {})
    mc = results.get("machine") or {}
    flags = mc.get("flags")
    flags = ", ".join(flags) if isinstance(flags, (list, tuple)) else flags
    cpu = (f"{mc.get('cpu')} ({mc.get('physical_cores')} cores; {flags}), load average "
           f"{results.get('load_before', ['?'])[0]} before and {results.get('load_after', ['?'])[0]} after"
           if mc else "CPU not recorded")
    got = [r["disk_mb_s"] for r in results["runs"] if r.get("ram_cap") is not None and r.get("disk_mb_s")]
    probes = (f", {min(got):.0f}-{max(got):.0f} MB/s probed before each capped group (its runs' I/O bound)"
              if got else "")
    head = (f"Model: {m.get('params', 0) / 1e9:.2f} B parameters (hidden {shape.get('hidden')}, {shape.get('layers')} "
            f"layers, {shape.get('experts')} experts of width {shape.get('ff')}, top-{shape.get('top_k')}), GGUFs by "
            f"llama.cpp's own tools: {sizes}. {results.get('threads')} threads; {cpu}; "
            f"disk {m.get('disk_mb_s', 0):.0f} MB/s (O_DIRECT, 4 threads){probes}; {results['repeats']} alternating rounds, "
            f"medians; a {results.get('prompt_tokens', '?')}-token prompt, then up to "
            f"{results.get('decode_tokens', '?')} {results.get('decode_input', 'greedy tokens')} or "
            f"{results.get('decode_seconds', 'no')} s "
            f"of decode; trace: {Path(results['trace']).name if results.get('trace') else 'none'}.")
    return dated(results, f"{head}\n\n{markdown(results)}")


def write_readme(results: dict, page: Path, source: str, block: str = "memory") -> None:
    """Replace a page's generated memory block (between its markers) with this run's."""
    replace_generated(page, block, source, memory_block(results))


def run_line(r: dict) -> str:
    """One run as the bench prints it while the matrix goes on."""
    if "error" in r:
        return f"{r['engine']:>9} cap={r.get('ram_cap')}: {r['error']}"
    extra = ""
    if r["engine"] == "colibri":
        acc = r["prefetch_accuracy"]
        extra = (f" cache {r['cache']}/8 budget {r.get('budget_mb', 0):.0f} MB hit {r['hit_rate']:.2f} no-wait "
                 f"{r['served_without_wait']:.2f} prefetch {'-' if acc is None else f'{acc:.2f}'} read "
                 f"{r['read_mb_per_token']:.1f} MB/token, missed {r['missed_mb_per_token']:.1f} MB/token, I/O bound "
                 f"{r.get('io_bound_tok_s', float('inf')):.1f} tok/s")
    elif "read_mb_total" in r:
        extra = f" read {r['read_mb_total']:.0f} MB over {r['tokens_run']} tokens, load mode {r['variant']}"
    if "cgroup_peak_mb" in r:
        extra += f", cgroup peak {r['cgroup_peak_mb']:.0f} of {r['cap_mb']:.0f} MB"
    if r.get("cpu_ms_per_token") is not None:
        extra += f", CPU {r['cpu_ms_per_token']:.0f} ms/token"
    if r.get("room_after_mb") is not None:
        extra += (f", cgroup room after {r['room_after_mb']:.0f} MB"
                  f", read ways {r.get('read_ways_mb')}")
    return (f"{r['engine']:>9} {r.get('preset', '')} {r.get('routing', '')} ram_cap={r['ram_cap']}: peak RSS {r['peak_rss_mb']:.0f} MB, prefill "
            f"{r['prefill_tok_s']:.1f} tok/s, decode {r['decode_tok_s']:.2f} tok/s{extra}")
