"""colibri-bench quality: what each quantization choice costs, ours next to llama.cpp's.

    colibri-bench quality [--model GGUF] [--text FILE] [--calibration FILE] [--chunks 4] [--formats A,B] [--json F]
    colibri-bench quality --table F     (the Markdown table of docs/bench/quality.md from a JSON written before)

The reference is the model converted to f16 (for the default model: its Q4_1 blocks dequantized),
exported back to an f16 GGUF: the one source of every re-rounding, ours (colibri-convert
--quantize X [--calibration_data FILE]) and llama.cpp's (llama-quantize F16.gguf X [--imatrix],
imported block for block). Each is measured against the reference on held-out text as
colibri-bench perplexity --reference does (ΔPPL, mean/99% KL, top-1 agreement; float activations,
so the figure is the weights' cost). Default texts: the first `--chunks` x 512 tokens of
tests/fixtures/texts/en_python_docs.txt are scored, its last 10 KB (never scored) calibrate.
llama.cpp's --imatrix row is given our calibration's energies (llama.cpp's imatrix tool is not
built here): its bytes must equal our calibrated Q4_K_M's, and the report says whether they do;
any llama.cpp row whose bytes equal ours takes our row's figures instead of being measured again.
`--formats int8,q4_k_m` keeps only those rows; `--llama_perplexity EXE` measures every row with
llama-perplexity --kl-divergence on its GGUF (ours exported block for block by export_gguf)
instead of the engine: the same weights on llama.cpp's forward, fast enough for every chunk of
the text (rows say "measured_with"), but llama.cpp's CPU forward rounds the activations of
quantized matrices to 8-bit blocks, so its figures include that cost on top of the weights'. A MoE (the MoEfied default model) gets no --imatrix rows:
the legacy imatrix file is written for dense models only.

The JSON (app/bench/results/quality.json) is what the wizard reads for each choice's quality cost
(app/quality_table.py's `expected_cost`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.bench.report import stamp
from app.quality_table import RESULTS  # noqa: F401  (where --json output is committed; the wizard reads it)
TEXTS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "texts"
CALIBRATION_BYTES = 10_000
# (our --quantize choice, calibrated); llama.cpp's presets beside them
# (by, format, calibrated), in the order measured: the 4-bit rows first
JOBS = [(by, fmt if by == "colibri" else fmt.upper(), cal) for fmt in ("q4_k_m", "q5_k_m", "q6_k")
        for by in ("colibri", "llama.cpp") for cal in (False, True)] + \
    [("colibri", "int4", False), ("colibri", "int4", True), ("colibri", "int8", False), ("colibri", "int8", True)]
LLAMA_QUANTIZE_ENV = "COLIBRI_LLAMA_QUANTIZE"


def _llama_quantize(flag: str | None) -> str | None:
    from app.bench.llamacpp import bin_dir
    path = flag or os.environ.get(LLAMA_QUANTIZE_ENV) or str(bin_dir() / "llama-quantize")
    return path if Path(path).is_file() else None


def _size_mb(model_dir: Path) -> float:
    return sum(p.stat().st_size for p in model_dir.rglob("*.bin")) / 1e6


def run(model: Path, text: Path, calibration: Path | None, chunks: int, workdir: Path,
        llama_quantize: str | None, ctx: int = 512, formats: tuple[str, ...] | None = None,
        llama_perplexity: str | None = None) -> dict:
    from app.bench import perplexity as P
    from engine.convert import calibrate
    from engine.convert.convert import calibration_for, convert
    from engine.convert.gguf_export import export_gguf
    t0 = time.perf_counter()
    full = text.read_text(encoding="utf-8")
    if calibration is None:  # the text's tail: never among the scored chunks
        calibration = workdir / "calibration.txt"
        calibration.write_text(full[-CALIBRATION_BYTES:], encoding="utf-8")
        full = full[:-CALIBRATION_BYTES]
    imatrix_done = workdir / "imatrix.dat"
    def converted(src: Path, name: str, target: str, cal: Path | None = None) -> tuple[Path, dict | None]:
        """A conversion in the work folder, reused when a finished one is there (manifest written last)."""
        out = workdir / name
        if (out / "manifest.json").exists():
            meta = json.loads((out / "config.json").read_text())
            return out, meta.get("quantization", {}).get("calibration")
        r = convert(src, out, target, force=True, calibration_data=cal)
        return r.path, r.calibration

    ref, _ = converted(model, "f16", "f16")
    f16 = workdir / "f16.gguf"
    if not f16.exists():
        export_gguf(ref, f16)
    params = {"int8_activations": False}
    rows = []
    reference: dict = {}  # the f16's chunks and logits, computed once for every row

    def evaluate(model_dir: Path) -> dict:
        if not reference:
            eng = P.open_engine(ref, ctx, 2, params)
            try:
                tokens = P.text_tokens(eng, full)
                bos = eng.codec.bos_id if eng.codec.add_bos else None
                reference["chunks"] = list(P.chunk_tokens(tokens, ctx, chunks, bos))
                reference["logits"] = [eng.logits(c) for c in reference["chunks"]]
                reference["tokens"] = tokens
            finally:
                eng.close()
        eng = P.open_engine(model_dir, ctx, 2, params)
        try:
            if P.text_tokens(eng, full) != reference["tokens"]:
                raise ValueError(f"{model_dir}: its tokenizer splits the text differently from the reference's")
            acc = P.Accumulator()
            for c, r in zip(reference["chunks"], reference["logits"]):
                acc.add_chunk(eng.logits(c), c, r)
        finally:
            eng.close()
        return P.summarize(acc)

    def evaluate_llama(model_dir: Path) -> dict:
        """The same figures from llama-perplexity --kl-divergence on the folder exported block for block."""
        if not reference:
            scored = workdir / "scored.txt"
            scored.write_text(full, encoding="utf-8")
            reference["text"], reference["base"] = scored, workdir / f"f16-{chunks}.kld"
            try:
                reference["run"] = P.run_llama_perplexity(llama_perplexity, f16, scored, ctx, 2, chunks,
                                                          ["--kl-divergence-base", str(reference["base"])])
            except RuntimeError:  # (it does not always print its figures while it saves the log-probs)
                reference["run"] = P.run_llama_perplexity(llama_perplexity, f16, scored, ctx, 2, chunks)
        gguf = workdir / f"{model_dir.name}.gguf"
        if not gguf.exists():
            export_gguf(model_dir, gguf)
        r = P.run_llama_perplexity(llama_perplexity, gguf, reference["text"], ctx, 2, chunks,
                                   ["--kl-divergence-base", str(reference["base"]), "--kl-divergence"])
        ppl_ref = reference["run"]["ppl"]  # the plain run's (the KL table's base PPL is from clipped log-probs)
        return {"positions": r["chunks"] * (ctx - ctx // 2 - 1), "ppl": r["ppl"], "ppl_ref": ppl_ref,
                "delta_ppl_pct": (r["ppl"] / ppl_ref - 1) * 100, "delta_ppl_pct_err": r["ln_ppl_ratio_err"] * 100,
                "kld_mean": r["kld_mean"], "kld_p99": r["kld_p99"], "same_top_pct": r["same_top_pct"],
                "same_top_pct_err": r["same_top_err"]}

    def measure(label: str, by: str, fmt: str, calibrated: bool, model_dir: Path) -> None:
        tool = "-llama" if llama_perplexity else ""
        done = model_dir.parent / f"{model_dir.name}.quality-{chunks}{tool}.json"  # an earlier run's figures
        if done.exists():
            rows.append(json.loads(done.read_text()))
            print(f"{label:28s} (measured before)", file=sys.stderr)
            return
        r = evaluate_llama(model_dir) if llama_perplexity else evaluate(model_dir)
        row = {"format": fmt, "by": by, "calibrated": calibrated, "size_mb": round(_size_mb(model_dir), 2),
               **{k: r[k] for k in ("positions", "ppl", "ppl_ref", "delta_ppl_pct", "delta_ppl_pct_err",
                                    "kld_mean", "kld_p99", "same_top_pct")}, "measured": time.strftime("%Y-%m-%d"),
               "measured_with": "llama-perplexity" if llama_perplexity else "colibri"}
        if "same_top_pct_err" in r:
            row["same_top_pct_err"] = r["same_top_pct_err"]
        rows.append(row)
        done.write_text(json.dumps(row))
        print(f"{label:28s} ΔPPL {row['delta_ppl_pct']:+7.3f}%  KLD {row['kld_mean']:.5f}  "
              f"top-1 {row['same_top_pct']:6.2f}%  {row['size_mb']:7.1f} MB", file=sys.stderr)

    cal_summary = None
    identical: dict[str, str] = {}  # llama.cpp's file -> how many of its tensors equal ours
    from engine.model_dir import open_model_dir
    moe = open_model_dir(ref).config.is_moe
    for by, fmt, calibrated in JOBS:
        if formats and fmt.lower() not in formats:
            continue
        if by == "colibri":
            path, summary = converted(f16, f"ours-{fmt}{'-cal' if calibrated else ''}", fmt,
                                      calibration if calibrated else None)
            cal_summary = summary or cal_summary
            measure(f"colibri {fmt}{' +cal' if calibrated else ''}", "colibri", fmt, calibrated, path)
            continue
        if not llama_quantize or (calibrated and moe):  # (an imatrix file is written for dense models only)
            continue
        gguf = workdir / f"llama-{fmt}{'-imatrix' if calibrated else ''}.gguf"
        if not gguf.exists():
            extra = []
            if calibrated:  # our calibration's energies (the same text), as llama.cpp's imatrix file
                imatrix = imatrix_done if imatrix_done.exists() else \
                    calibrate.write_llama_imatrix(calibration_for(f16, calibration), imatrix_done)
                extra = ["--imatrix", str(imatrix)]
            subprocess.run([llama_quantize, *extra, str(f16), str(gguf), fmt, "2"], check=True, capture_output=True)
        path, _ = converted(gguf, gguf.stem, "keep")
        ours = workdir / f"ours-{fmt.lower()}{'-cal' if calibrated else ''}"
        label = f"{fmt}{' +imatrix' if calibrated else ''}"
        if ours.exists():
            identical[label] = _same_tensors(ours, path)
            same = identical[label].split(" of ")
            if same[0] == same[1]:  # the same bytes as ours: the same figures, not measured twice
                mine = next(r for r in rows if r["by"] == "colibri" and r["format"] == fmt.lower()
                            and r["calibrated"] == calibrated)
                rows.append({**mine, "by": "llama.cpp"})
                print(f"llama.cpp {label}: {identical[label]} tensors identical to ours", file=sys.stderr)
                continue
        measure(f"llama.cpp {fmt}{' +imatrix' if calibrated else ''}", "llama.cpp", fmt.lower(), calibrated, path)
    return {"model": model.name, "text": text.name, "calibration": str(calibration.name), "ctx": ctx, "chunks": chunks,
            "calibration_summary": cal_summary, "llama_bytes_identical": identical,
            "q4_k_m_imatrix_bytes_identical": identical.get("Q4_K_M +imatrix"),
            "measured_with": "llama-perplexity --kl-divergence" if llama_perplexity else "colibri",
            "cpu": _cpu(), "seconds": round(time.perf_counter() - t0, 1), "rows": rows} | stamp()


def _same_tensors(a: Path, b: Path) -> str:
    """How many tensors two model folders store byte for byte alike ("N of M")."""
    from engine.model_dir import open_model_dir
    ma, mb = open_model_dir(a), open_model_dir(b)
    same = total = 0
    for rel, names in ma.files().items():
        ta, tb = ma.tensor_file(rel), mb.tensor_file(rel)
        for n in names:
            total += 1
            same += bool((ta.tensor(n) == tb.tensor(n)).all()) if ta.infos[n].qtype is tb.infos[n].qtype else 0
    return f"{same} of {total}"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def table(doc: dict) -> str:
    """The quality table (docs/bench/quality.md): one row per format, ours and llama.cpp's, without and with calibration."""
    lines = ["| format | by | calibrated | size MB | ΔPPL vs f16 | mean KL | 99% KL | top-1 same |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lines.append(f"| {r['format']} | {r['by']} | {'yes' if r['calibrated'] else 'no'} | {r['size_mb']:.1f} | "
                     f"{r['delta_ppl_pct']:+.2f}% ± {r['delta_ppl_pct_err']:.2f} | {r['kld_mean']:.4f} | "
                     f"{r['kld_p99']:.3f} | {r['same_top_pct']:.1f}%"
                     + (f" ± {r['same_top_pct_err']:.1f}" if r.get("same_top_pct_err") else "") + " |")
    return "\n".join(lines)


def cmd_quality(args: argparse.Namespace) -> int:
    if args.table:
        print(table(json.loads(Path(args.table).read_text(encoding="utf-8"))))
        return 0
    from engine.default_model import default_gguf_path
    model = Path(args.model) if args.model else default_gguf_path()
    with tempfile.TemporaryDirectory(prefix="colibri-quality-") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        doc = run(model, Path(args.text), Path(args.calibration) if args.calibration else None, args.chunks, work,
                  _llama_quantize(args.llama_quantize),
                  formats=tuple(f.strip().lower() for f in args.formats.split(",")) if args.formats else None,
                  llama_perplexity=args.llama_perplexity)
    print(table(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quality", help="each quantization's cost against f16, ours next to llama.cpp's",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a GGUF file (default: the default model)")
    p.add_argument("--text", default=str(TEXTS / "en_python_docs.txt"), help="held-out text (UTF-8)")
    p.add_argument("--calibration", help="calibration text (default: the last 10 KB of --text, then not scored)")
    p.add_argument("--chunks", type=int, default=4, help="chunks of 512 tokens scored")
    p.add_argument("--formats", help="only these rows, comma-separated (e.g. int8,q4_k_m; default: all)")
    p.add_argument("--llama_perplexity", metavar="EXE",
                   help="measure every row with llama.cpp's llama-perplexity --kl-divergence on its GGUF (ours "
                        "exported block for block) instead of the engine: much faster, so more chunks")
    p.add_argument("--llama_quantize", help=f"llama.cpp's llama-quantize (default ${LLAMA_QUANTIZE_ENV})")
    p.add_argument("--workdir", help="keep the converted models here")
    p.add_argument("--json", help="write the figures here (the wizard reads app/bench/results/quality.json)")
    p.add_argument("--table", metavar="JSON", help="print the Markdown table of an earlier --json and stop")
    p.set_defaults(func=cmd_quality)
