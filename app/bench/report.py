"""colibri-bench speed's report: the machine (CPU and the flags the kernels depend on), the tables, and
the generated blocks of the documentation (docs/bench/*.md), regenerated from a saved JSON report.
"""
from __future__ import annotations

from pathlib import Path


# The instruction-set flags that decide which kernels run (ours and llama.cpp's), as /proc/cpuinfo names them
KERNEL_FLAGS = ("sse4_2", "avx", "f16c", "fma", "avx2", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
                "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_int8", "amx_bf16")


def cpu_info(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, list[str]]:
    """The CPU's model name and which of KERNEL_FLAGS it has."""
    name, flags = "unknown", set()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown":
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return name, [f for f in KERNEL_FLAGS if f in flags]


def machine() -> dict:
    import platform

    import psutil
    cpu, flags = cpu_info()
    info = {"cpu": cpu, "flags": flags, "physical_cores": psutil.cpu_count(logical=False),
            "logical_cpus": psutil.cpu_count(), "memory_gb": psutil.virtual_memory().total / 1e9,
            "system": platform.platform()}
    try:
        from engine.kernels import isa_run
        info["colibri_dot_path"] = isa_run.in_effect()  # the integer-dot path Colibri's kernels run, how chosen, width
    except ImportError:
        pass
    return info


def describe_machine(m: dict) -> str:
    """One line naming the CPU and the flags every figure depends on."""
    return (f"{m['cpu']}, {m['physical_cores']} cores, {m['memory_gb']:.0f} GB; flags: {' '.join(m.get('flags', []))}"
            + (f"; Colibri's dot path: {m['colibri_dot_path']}" if m.get("colibri_dot_path") else ""))


def figure(v: float | None, fmt: str) -> str:
    """A figure in `fmt`, or a dash where an engine does not report it (llama-bench's load time)."""
    return "–" if v is None else format(v, fmt)


def table(report: dict, model: str | None = None) -> str:
    rows = [r for r in report["results"] if model is None or r["model"] == model]
    ref = next((m.get("reference", "llama.cpp") for m in report["models"] if model in (None, m["name"])), "llama.cpp")
    head = ("| engine | threads | decode tok/s | prefill tok/s | TTFT s | load s | start→1st token s | peak RSS MB "
            f"| decode/bandwidth limit | decode vs {ref} | prefill vs {ref} | decode vs transformers |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    order = {e: i for i, e in enumerate(dict.fromkeys(r["engine"] for r in report["results"]))}  # as run
    for r in sorted(rows, key=lambda r: (r["threads"], order[r["engine"]])):
        vs, hf = r.get("vs_llama_cpp"), r.get("vs_transformers")
        lines.append(f"| {r['engine']} | {r['threads']} | {r['decode_tok_s']:.1f} | {r['prefill_tok_s']:.0f} | "
                     f"{figure(r['ttft_s'], '.2f')} | {figure(r['load_s'], '.2f')} | {figure(r['first_token_s'], '.2f')} | "
                     f"{figure(r['peak_rss_mb'], '.0f')} | {100 * r['bandwidth_fraction']:.0f}% | "
                     + (f"{vs['decode']:.2f}× | {vs['prefill']:.2f}× | " if vs else "– | – | ")
                     + (f"{hf['decode']:.2f}× |" if hf else "– |"))
    return "\n".join(lines)


def markdown(report: dict) -> str:
    """The whole report as Markdown: the machine (CPU, flags), the bandwidth, one table per model."""
    m = report["machine"]
    by_t = ", ".join(f"{t} thread(s) {b:.1f}" for t, b in report["bandwidth_by_threads_gb_s"].items())
    probes = ", ".join(f"{b:.1f}" for b in report["bandwidth_probes_gb_s"])
    out = [f"Machine: {describe_machine(m)}.", "",
           f"Read bandwidth {report['bandwidth_gb_s']:.1f} GB/s ({by_t}; the best of the probes {probes}). "
           f"pp{report['prompt_tokens']} / tg{report['decode_tokens']}, medians of "
           f"{max((r['runs'] for r in report['results']), default=0)} runs, engines alternating"
           + (f"; run {report['date']}" if report.get("date") else "") + "."]
    for info in report["models"]:
        s = info["decode_scaling_vs_1_thread"]
        scaling = "; ".join(f"{e} ×{v[max(v, key=int)]:.2f}" for e, v in s.items())
        top = max((int(k) for v in s.values() for k in v), default=0)
        out += ["", f"**{info['name']}** ({info['weight_bytes_per_token'] / 1e6:.1f} MB of weights and "
                f"{info.get('kv_bytes_per_token', 0) / 1e6:.1f} MB of KV cache read per token)"
                + (f" — decode scaling 1 → {top} threads: {scaling}" if scaling else ""), "", table(report, info["name"])]
        f = info.get("fidelity")
        if f and f.get("compared"):
            out += ["", f"Teacher-forced on {f['positions']} tokens of {f['text']}: Colibri's argmax equals llama.cpp's "
                    f"at {f['agreed']} of the {f['compared']} positions where llama.cpp's top-1 leads by ≥ {f['margin']} "
                    f"({100 * f['rate']:.1f}%; {100 * f['agreed_all']:.1f}% of all positions)"
                    + _floor(f) + "."]
    for what, why in report["skipped"].items():
        out += ["", f"{what}: skipped ({why})"]
    return "\n".join(out)


def _floor(f: dict) -> str:
    """llama.cpp against itself (one token at a time vs batched): how far two correct paths agree."""
    own = f.get("llama_cpp_self")
    if not own or not own.get("compared"):
        return ""
    return (f"; llama.cpp's own one-token path agrees with its batched run at {own['agreed']} of {own['compared']} "
            f"({100 * own['rate']:.1f}%), Colibri with that one-token run at {100 * f['vs_llama_cpp_one_by_one']:.1f}%")


BEGIN, END = "<!-- colibri-bench speed: begin (generated from {json}; do not edit) -->", "<!-- colibri-bench speed: end -->"


def stamp() -> dict:
    """When and at which commit a run was made, for its JSON: a figure is only as good as the code it measured."""
    import subprocess
    import time
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit}


def provenance(report: dict) -> str:
    """The line above every generated table: date, commit and CPU, as the JSON recorded them (never guessed)."""
    dates = sorted({str(r["measured"]) for r in report.get("rows", []) if r.get("measured")})
    date = (report.get("date") or report.get("finished")
            or (f"per row: {'; '.join(dates)}" if len(dates) > 1 else dates[0] if dates else None))
    m = report.get("machine") or {}
    cpu = m.get("cpu") or report.get("cpu")
    if cpu and m.get("physical_cores"):
        cpu += f", {m['physical_cores']} cores"
    return (f"Date: {date or 'not recorded'}; commit: {report.get('commit') or 'not recorded'}; "
            f"CPU: {cpu or 'not recorded'}.")


def dated(report: dict, body: str) -> str:
    """A generated block's text: its provenance line, then what the report's renderer made of it."""
    return f"{provenance(report)}\n\n{body.strip()}"


def speed_block(report: dict) -> str:
    """The generated speed block of a `speed --json` report."""
    return dated(report, markdown(report))


def replace_block(text: str, bench: str, source: str, body: str, where: str = "the page") -> str:
    """`text` with the block `colibri-bench <bench>` generated (between its begin and end markers)
    replaced by `body`, naming the JSON it came from: documented figures come from a saved report."""
    begin = f"<!-- colibri-bench {bench}: begin"
    end_mark = f"<!-- colibri-bench {bench}: end -->"
    start, end = text.find(begin), text.find(end_mark)
    if start < 0 or end < start:
        raise SystemExit(f"{where}: no generated {bench} block (a line starting {begin!r} ... {end_mark!r})")
    block = f"{begin} (generated from {source}; do not edit) -->\n\n{body.strip()}\n\n{end_mark}"
    return text[:start] + block + text[end + len(end_mark):]


def replace_generated(page: Path, bench: str, source: str, body: str) -> None:
    """Replace the block `colibri-bench <bench>` generated in the Markdown file `page`."""
    page.write_text(replace_block(page.read_text(), bench, source, body, str(page)))


def write_readme(report: dict, page: Path, source: str, block: str = "speed") -> None:
    """Replace a page's generated speed block (or another block of speed tables) with this report's."""
    replace_generated(page, block, source, speed_block(report))
