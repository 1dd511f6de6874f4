"""The generated parts of README.md and docs/: every measured table is made whole from its JSON in
app/bench/results (with the date, commit and CPU the JSON recorded), and the README's table of
architectures and formats from engine/arch.py and engine/kernels/table.py. A figure typed by hand
drifts from the run it came from; a block regenerated from its source cannot.

    colibri-bench docs            regenerate every block
    colibri-bench docs --check    regenerate nothing; exit 1 naming each block that is out of date

tests/test_docs.py runs the check, so a changed JSON, spec row or kernel-table row fails the suite
until its page is regenerated.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
RESULTS = "app/bench/results"


@dataclass(frozen=True)
class Block:
    """One generated block: the page it sits in, its marker name, its source (repository paths) and
    how its text is made from that source."""
    page: str
    name: str
    source: str
    render: Callable[[], str]


def _json(name: str) -> dict:
    return json.loads((ROOT / RESULTS / name).read_text(encoding="utf-8"))


def _speed(name: str) -> Callable[[], str]:
    from app.bench.report import speed_block
    return lambda: speed_block(_json(name))


def _serve(name: str) -> Callable[[], str]:
    from app.bench.serve_table import serve_block
    return lambda: serve_block(_json(name))


def _memory(name: str) -> Callable[[], str]:
    from app.bench.memory_report import memory_block
    return lambda: memory_block(_json(name))


def _quality(name: str) -> Callable[[], str]:
    def render() -> str:
        from app.bench.quality import table
        from app.bench.report import dated
        doc = _json(name)
        how = (f"Model `{Path(doc['model']).name}`, {doc.get('chunks')} chunks of {doc.get('ctx')} tokens of "
               f"`{Path(doc['text']).name}`; measured with {doc.get('measured_with', 'colibri')}.")
        return dated(doc, f"{how}\n\n{table(doc)}")
    return render


DUELS = ("duel-q4_k_m-random.json", "duel-q4_k_m-random-2.json", "duel-q4_k_m-trace.json", "duel-q8_0-random.json",
         "duel-q8_0-trace.json", "duel-q4_k_m-self-colibri.json", "duel-q4_k_m-self-llama.json",
         "duel-default-baseline-63b36d6.json", "duel-default-baseline-63b36d6-2.json",
         "duel-default-baseline-63b36d6-3.json", "duel-moe-q4_k_m-baseline-63b36d6.json")


def duel_table() -> str:
    """One row per saved duel: who against whom, on what, and the median ratio with its quartiles."""
    from app.bench.report import provenance
    lines = ["| JSON | sides | model | threads | routing | pairs of slices | median ratio | quartiles | date; commit; CPU |",
             "|---|---|---|---:|---|---:|---:|---|---|"]
    for name in DUELS:
        d = _json(name)
        a, b = d["sides"]
        q1, q3 = d["quartiles"]
        lines.append(f"| {name} | {a} / {b} | `{Path(d['model']).name}` | {d['threads']} | "
                     f"{'trace ' + Path(d['trace']).name if d.get('trace') else 'random'} | {len(d['ratios'])} × "
                     f"{d['slice_s']:g} s | {d['median_ratio']:.3f} | {q1:.3f}–{q3:.3f} | "
                     f"{provenance(d).rstrip('.')} |")
    return "\n".join(lines)


def architectures() -> str:
    """The README's table: each architecture and where it converts from, then each weight format and
    the kernel that multiplies it. Imports the spec, the format declarations and the kernel table
    only: nothing is compiled."""
    from engine import quant
    from engine.arch import SPECS
    from engine.kernels.table import ALL, lookup
    lines = ["| architecture | Hugging Face class | GGUF `general.architecture` | feed-forward | layer kinds it may have |",
             "|---|---|---|---|---|"]
    for s in SPECS.values():
        gguf = s.gguf_arch or (f"{s.gguf_experts} with experts" if s.gguf_experts else "—")
        ffn = f"MoE ({s.router} router" + (f", {s.shared_expert} shared expert" if s.shared_expert != "none" else "") \
            + ")" if s.moe else "dense"
        lines.append(f"| {s.name} | {', '.join(f'`{c}`' for c in s.hf_classes)} | {gguf if gguf == '—' else f'`{gguf}`'} "
                     f"| {ffn} | {', '.join(s.layer_kinds)} |")
    lines += ["", "Every architecture runs every format below: the kernels depend on the format, not on the "
              "architecture.", "",
              "| format | bits per weight | weights per block | matmul kernel (engine/kernels/) | layouts | activations |",
              "|---|---:|---:|---|---|---|"]
    for t in sorted((quant.get(f) for f in ALL), key=lambda t: t.type_id):
        k = lookup("matmul", t.name)
        floats = k.twin == "engine.kernels.reference:matmul"
        lines.append(f"| {t.name} | {8 * t.type_size / t.block_size:.4g} | {t.block_size} | "
                     f"{k.inner.rsplit('.', 1)[-1]}.py | {', '.join(k.layouts)} | "
                     f"{'float' if floats else 'int8 (float with int8_activations off)'} |")
    return "\n".join(lines)


def headline() -> str:
    """The README's one table of measured figures: a row per benchmark, each from its JSON, with the
    date and CPU of that run and a link to the page that has the whole table and the command."""
    from app.bench.report import provenance
    rows = []
    speed = _json("speed.json")
    for model in ("default", "moe-small:Q4_K_M"):
        r = next(r for r in speed["results"] if r["model"] == model and r["engine"] == "colibri")
        rows.append((f"decode, {model}, {r['threads']} threads", f"{r['decode_tok_s']:.0f} tok/s, "
                     f"{r['vs_llama_cpp']['decode']:.2f}× llama-bench", speed, "docs/bench/speed.md"))
    duel = _json("duel-q4_k_m-random.json")
    rows.append(("decode in turns, bench MoE Q4_K_M (duel)", f"{duel['median_ratio']:.2f}× llama.cpp (median of "
                 f"{len(duel['ratios'])} pairs)", duel, "docs/bench/duel.md"))
    serve = _json("serve.json")
    level = serve["levels"]["8"]
    rows.append(("colibri-serve, 8 streaming clients", f"{level['colibri']['tok_s']:.0f} tok/s, "
                 f"{level['colibri']['tok_s'] / level['llama']['tok_s']:.2f}× llama-server", serve, "docs/bench/serve.md"))
    memory = _json("memory.json")
    ours = {(m["preset"], m["variant"], m["routing"]): m for m in memory["medians"]
            if m["ram_cap"] == 0.5 and m["engine"] == "colibri"}
    peer = next(m for m in memory["medians"] if m["ram_cap"] == 0.5 and m["preset"] == "q8_0"
                and m["engine"] == "llama.cpp" and m["variant"] == "mmap")
    mine = ours[("q8_0", "auto", "random")]  # both engines fed the same seeded random tokens
    rows.append(("1.75 B MoE q8_0 capped at half its size (memory cgroup)", f"{mine['decode_tok_s']:.1f} tok/s against "
                 f"llama.cpp mmap's {peer['decode_tok_s']:.1f}", memory, "docs/bench/memory.md"))
    quality = _json("quality.json")
    q = next(r for r in quality["rows"] if r["format"] == "q4_k_m" and r["by"] == "colibri" and r["calibrated"])
    rows.append(("Q4_K_M calibrated, default model", f"ΔPPL {q['delta_ppl_pct']:+.1f}%, top-1 same "
                 f"{q['same_top_pct']:.0f}% (bytes = llama-quantize's)", quality | {"rows": [q]}, "docs/bench/quality.md"))
    lines = ["| measured | figure | date; commit; CPU | page |", "|---|---|---|---|"]
    for what, figure, report, page in rows:
        lines.append(f"| {what} | {figure} | {provenance(report).rstrip('.')} | [{Path(page).stem}]({page}) |")
    return "\n".join(lines)


BLOCKS: tuple[Block, ...] = (
    Block("README.md", "headline", f"{RESULTS}/speed.json, duel-q4_k_m-random.json, serve.json, memory.json and "
          "quality.json", headline),
    Block("README.md", "architectures", "engine/arch.py, engine/quant.py and engine/kernels/table.py", architectures),
    Block("docs/bench/speed.md", "speed", f"{RESULTS}/speed.json", _speed("speed.json")),
    Block("docs/bench/speed.md", "speed-arch", f"{RESULTS}/speed-arch.json", _speed("speed-arch.json")),
    Block("docs/bench/serve.md", "serve", f"{RESULTS}/serve.json", _serve("serve.json")),
    Block("docs/bench/serve.md", "serve-soak", f"{RESULTS}/serve-soak.json", _serve("serve-soak.json")),
    Block("docs/bench/memory.md", "memory", f"{RESULTS}/memory.json", _memory("memory.json")),
    Block("docs/bench/memory.md", "memory-uncapped", f"{RESULTS}/memory-uncapped.json", _memory("memory-uncapped.json")),
    Block("docs/bench/memory.md", "memory-q4_k_m-cap0.5", f"{RESULTS}/memory-q4_k_m-cap0.5.json",
          _memory("memory-q4_k_m-cap0.5.json")),
    Block("docs/bench/memory.md", "memory-zen1-q8_0", f"{RESULTS}/memory-zen1-q8_0.json", _memory("memory-zen1-q8_0.json")),
    Block("docs/bench/memory.md", "memory-large", f"{RESULTS}/memory-large.json", _memory("memory-large.json")),
    Block("docs/bench/quality.md", "quality", f"{RESULTS}/quality.json", _quality("quality.json")),
    Block("docs/bench/quality.md", "quality-moefied", f"{RESULTS}/quality_moefied.json", _quality("quality_moefied.json")),
    Block("docs/bench/duel.md", "duel", f"{RESULTS}/duel-*.json", duel_table),
)


def regenerate(root: Path = ROOT, write: bool = True) -> list[str]:
    """Regenerate every block in its page; returns the blocks that were out of date ("page: name")."""
    from app.bench.report import replace_block
    stale, pages = [], {}
    for b in BLOCKS:
        old = pages.get(b.page)
        if old is None:
            old = pages[b.page] = (root / b.page).read_text(encoding="utf-8")
        new = replace_block(old, b.name, b.source, b.render(), b.page)
        if new != old:
            stale.append(f"{b.page}: {b.name}")
            pages[b.page] = new
    if write:
        for page, text in pages.items():
            (root / page).write_text(text, encoding="utf-8")
    return stale


def main(args: argparse.Namespace) -> int:
    import os
    os.environ.setdefault("COLIBRI_SIMD_BENCH", "0")  # the kernel table is read, never run: no dot-path measurement
    stale = regenerate(write=not args.check)
    for s in stale:
        print(f"{s}: {'out of date (colibri-bench docs regenerates it)' if args.check else 'regenerated'}")
    return 1 if args.check and stale else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("docs", help="regenerate the generated blocks of README.md and docs/ from their sources",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block is out of date")
    p.set_defaults(func=main)
