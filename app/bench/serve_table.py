"""colibri-bench serve's generated block (docs/bench/serve.md), made from its saved JSON report: the throughput and latency
table at each number of clients beside llama-server, the ratios the targets name, expert grouping and
the soak. Nothing here measures; it only formats what a run wrote."""
from __future__ import annotations

from pathlib import Path

from app.bench.report import dated, describe_machine, replace_generated


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{1000 * v:,.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{a / b:.2f}×"


def markdown(report: dict) -> str:
    """The block's text: how the run was made, one row per number of clients, then the targets."""
    levels = {int(n): v for n, v in report["levels"].items()}
    m = report.get("machine")
    per = (f"{report['requests']} requests per client" if report.get("requests")
           else f"{report.get('duration_s') or '?'} s per level")
    if (report.get("rounds") or 1) > 1:
        per += f"; each level's median of {report['rounds']} rounds (the levels in turn; errors summed over all)"
    load = "".join(f"; load average {report[k]:.1f} {w}" for k, w in (("load_before", "before"), ("load_after", "after"))
                   if report.get(k) is not None)
    out = [f"Model: `{Path(report['gguf']).name}`, {report['max_tokens']} tokens per reply, temperature "
           f"{report.get('temperature', 0.7)}, seeded; {report.get('threads', '?')} threads each; {per}; "
           + (f"machine: {describe_machine(m)}" if m else "machine not recorded") + load + ".", "",
           "| clients | colibri-serve tok/s | TTFT p50 / p99 (ms) | llama-server tok/s | TTFT p50 / p99 (ms) "
           "| colibri / llama-server | errors, lost, garbled (Colibri) |",
           "|---:|---:|---:|---:|---:|---:|---|"]
    for n in sorted(levels):
        c, ll = levels[n].get("colibri"), levels[n].get("llama")
        cells = [str(n)]
        for r in (c, ll):
            cells += ["—", "—"] if r is None else [f"{r['tok_s']:.1f}", f"{_ms(r['ttft_p50_s'])} / {_ms(r['ttft_p99_s'])}"]
        cells.append(_ratio(c and c["tok_s"], ll and ll["tok_s"]))
        cells.append("—" if c is None else f"{c['errors']}, {c['lost']}, {'—' if c['garbled'] is None else c['garbled']}")
        out.append("| " + " | ".join(cells) + " |")
    ns = sorted(n for n in levels if levels[n].get("colibri"))
    notes = []
    if len(ns) > 1 and levels[ns[0]]["colibri"]["tok_s"]:
        for n in ns[1:]:
            if n == 8 or n == ns[-1]:
                a, b = levels[n]["colibri"], levels[ns[0]]["colibri"]
                each = [f"{x / y:.2f}" for x, y in zip(a.get("rounds_tok_s", []), b.get("rounds_tok_s", []))]
                notes.append(f"{n} clients / {ns[0]}: {a['tok_s'] / b['tok_s']:.2f}×"
                             + (f" (round by round: {', '.join(each)})" if len(each) > 1 else ""))
    g = report.get("expert_grouping")
    if g:
        notes.append(f"expert bytes per decode step at {g['clients']} sequences on `{Path(g['model']).name}`: "
                     f"{g['grouped_mb_per_step']:.1f} MB grouped against {g['ungrouped_mb_per_step']:.1f} MB without "
                     f"grouping ({g['ratio']:.2f}×, median of {g['steps']} steps)")
    for who in ("colibri", "llama"):
        s = report.get(f"soak_{who}")
        if s:
            notes.append(f"soak ({'colibri-serve' if who == 'colibri' else 'llama-server'}): {s['requests']} requests, "
                         f"{s['errors']} errors, {s['lost']} lost; RSS {s['rss_after_50_mb']:.1f} MB after 50, "
                         f"{s['rss_end_mb']:.1f} MB at the end ({s['growth_after_50_pct']:+.1f}%)")
    if notes:
        out += [""] + [f"- {n}" for n in notes]
    return "\n".join(out)


def serve_block(report: dict) -> str:
    return dated(report, markdown(report))


def write_readme(report: dict, page: Path, source: str, block: str = "serve") -> None:
    replace_generated(page, block, source, serve_block(report))
