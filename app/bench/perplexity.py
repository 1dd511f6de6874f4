"""colibri-bench perplexity: what a quantization costs in quality, measured as llama.cpp does.

    colibri-bench perplexity --model M --text FILE [--ctx 512] [--chunks N] [--reference M2]
                             [--quantize int4] [--reference_quantize f16] [--json F]

llama.cpp's conventions (tools/perplexity/perplexity.cpp): the whole text is tokenized once (with
BOS in front if the model's vocabulary asks for one; special tokens written in the text are plain
text), cut into len // ctx chunks of `ctx` tokens, each chunk evaluated from an empty context with
its first token replaced by BOS (when the model adds one), and only the second half of each chunk
scored: positions ctx/2 .. ctx-2 predict the next token, so a chunk gives ctx - ctx/2 - 1 NLLs.
PPL = exp(mean NLL); its error is PPL * sqrt(var(NLL) / (n - 1)).

With --reference (a higher-precision version of the same model) the same chunks also go through
it, and the tool reports, as llama-perplexity --kl-divergence does: the mean KL divergence
KL(reference || model) per scored position with its error, its 99th percentile (linear
interpolation), the share of positions where both models' most likely token is the same, and
ln(PPL/PPL_ref) with its error (the two NLL series are correlated: their covariance enters).
llama.cpp stores the reference's log-probabilities as 16-bit integers; here both are exact.

A model is a Colibri model folder or a GGUF file; a GGUF is converted on first use (engine.convert,
`--quantize` as colibri-convert's) into the cache folder, keyed by the file's path, size, time
and the target. When the model is a GGUF and llama.cpp's llama-perplexity is found
(--llama_perplexity PATH or $COLIBRI_LLAMA_PERPLEXITY), it runs on the same file and text and its
figure is reported beside ours (skipped with the reason otherwise); with a GGUF --reference too,
llama.cpp's KL divergence is run as well (its base log-probabilities go to a temporary file).

Memory: one chunk's logits at a time, ctx x vocab float32 (512 x 49152: 100 MB), twice with a
reference; the scored half is reduced in blocks of rows.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

ROWS = 64  # scored positions reduced at once: ROWS x vocab float64 of scratch
LLAMA_ENV = "COLIBRI_LLAMA_PERPLEXITY"


# --- the arithmetic (numpy; no engine needed) --------------------------------------------------

def chunk_tokens(tokens: Sequence[int], ctx: int, n_chunks: int | None = None,
                 bos: int | None = None) -> Iterator[np.ndarray]:
    """The chunks llama-perplexity evaluates: len // ctx windows of `ctx` tokens, the first token
    of each replaced by `bos` when the model adds one (the text token there is context lost)."""
    if ctx < 4:
        raise ValueError(f"--ctx {ctx}: needs at least 4 tokens")
    if len(tokens) < 2 * ctx:
        raise ValueError(f"the text tokenizes to only {len(tokens)} tokens; a context of {ctx} needs "
                         f"at least {2 * ctx} (give a longer text or a smaller --ctx)")
    n = len(tokens) // ctx
    n = n if n_chunks is None or n_chunks < 0 else min(n, n_chunks)
    for i in range(n):
        c = np.asarray(tokens[i * ctx:(i + 1) * ctx], np.int64).copy()
        if bos is not None:
            c[0] = bos
        yield c


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    x = rows.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x


@dataclass
class Accumulator:
    """Per scored position: the NLL, and with a reference its NLL, KL and whether the top tokens agree."""
    nll: list[np.ndarray] = field(default_factory=list)
    nll_ref: list[np.ndarray] = field(default_factory=list)
    kld: list[np.ndarray] = field(default_factory=list)
    p_diff: list[np.ndarray] = field(default_factory=list)
    same_top: list[np.ndarray] = field(default_factory=list)

    def add_chunk(self, logits: np.ndarray, chunk: np.ndarray, ref_logits: np.ndarray | None = None) -> None:
        """`logits` (ctx, vocab) of one chunk; positions ctx/2 .. ctx-2 are scored."""
        ctx = len(chunk)
        first = ctx // 2
        for a in range(first, ctx - 1, ROWS):
            b = min(a + ROWS, ctx - 1)
            target = chunk[a + 1:b + 1]
            lp = _log_softmax(logits[a:b])
            rows = np.arange(b - a)
            nll = -lp[rows, target]
            self.nll.append(nll)
            if ref_logits is None:
                continue
            lq = _log_softmax(ref_logits[a:b])
            nll_ref = -lq[rows, target]
            self.nll_ref.append(nll_ref)
            self.kld.append((np.exp(lq) * (lq - lp)).sum(axis=1))
            self.p_diff.append(np.exp(-nll) - np.exp(-nll_ref))
            self.same_top.append(lp.argmax(axis=1) == lq.argmax(axis=1))

    def running_ppl(self) -> float:
        return math.exp(float(np.concatenate(self.nll).mean()))


def _mean_err(x: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error, as llama.cpp: sqrt((E[x^2] - E[x]^2) / (n - 1))."""
    n = len(x)
    m = float(x.mean())
    var = float((x * x).mean()) - m * m
    return m, math.sqrt(var / (n - 1)) if var > 0 and n > 1 else 0.0


def summarize(acc: Accumulator) -> dict[str, float]:
    """The figures llama-perplexity prints (and with a reference, its --kl-divergence ones)."""
    nll = np.concatenate(acc.nll)
    m, e = _mean_err(nll)
    out = {"positions": len(nll), "ppl": math.exp(m), "ppl_err": math.exp(m) * e, "mean_nll": m}
    if not acc.kld:
        return out
    nll_ref = np.concatenate(acc.nll_ref)
    kld = np.concatenate(acc.kld)
    p_diff = np.concatenate(acc.p_diff)
    same = np.concatenate(acc.same_top)
    n = len(nll)
    mr, er = _mean_err(nll_ref)
    cov = (float((nll * nll_ref).mean()) - m * mr) / (n - 1)
    ln_ratio_err = math.sqrt(max(e * e + er * er - 2 * cov, 0.0))
    km, ke = _mean_err(kld)
    top = float(same.mean())
    rms = math.sqrt(float((p_diff ** 2).mean()))
    out |= {"ppl_ref": math.exp(mr), "ppl_ref_err": math.exp(mr) * er,
            "ln_ppl_ratio": m - mr, "ln_ppl_ratio_err": ln_ratio_err,
            "delta_ppl_pct": 100 * (math.exp(m - mr) - 1), "delta_ppl_pct_err": 100 * math.exp(m - mr) * ln_ratio_err,
            "kld_mean": km, "kld_err": ke, "kld_p99": float(np.percentile(kld, 99)),
            "kld_median": float(np.median(kld)), "kld_max": float(kld.max()),
            "same_top_pct": 100 * top, "same_top_err": 100 * math.sqrt(top * (1 - top) / (n - 1)),
            "rms_dp_pct": 100 * rms}
    return out


# --- models -----------------------------------------------------------------------------------

def _cache_root() -> Path:
    from app.paths import cache_dir
    return cache_dir() / "perplexity"


def prepare_model(path: str | Path, quantize: str | None = None, workdir: Path | None = None) -> Path:
    """A Colibri model folder for `path`: itself, or a GGUF converted once into the work folder."""
    p = Path(path).expanduser()
    if p.is_dir():
        if quantize:
            raise ValueError(f"{p}: --quantize applies to GGUF files; this is already a model folder")
        return p
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such model folder or GGUF file")
    st = p.stat()
    key = hashlib.sha1(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}|{quantize}".encode()).hexdigest()[:12]
    out = (workdir or _cache_root()) / f"{p.stem}-{quantize or 'keep'}-{key}"
    if not (out / "manifest.json").exists():  # written last: a folder with it is complete
        from engine.convert.convert import convert
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"converting {p.name} ({quantize or 'keep'}) -> {out}", file=sys.stderr)
        convert(p, out, quantize, force=True)
    return out


def open_engine(model_dir: Path, ctx: int, threads: int | None, params: dict[str, Any] | None = None):
    from engine import kernels
    kernels.setup()  # (also run as python -m app.bench.perplexity: before engine.api)
    from engine.api import Engine
    return Engine(model_dir, **{**(params or {}), "context_length": ctx, **({"threads": threads} if threads else {})})


def parse_params(pairs: Sequence[str]) -> dict[str, Any]:
    """NAME=VALUE engine parameters (engine/params.py), e.g. int8_activations=false."""
    from engine import params as P
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in P.PARAMS:
            raise ValueError(f"--param {pair!r}: give NAME=VALUE with NAME one of the engine parameters")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out[name] = P.check(name, value)
    return out


def text_tokens(engine, text: str) -> list[int]:
    """The text as llama-perplexity sees it: one tokenization, BOS first if the model adds one."""
    ids = engine.codec.tok.encode(text, add_special_tokens=False).ids  # special tokens stay text
    if engine.codec.add_bos and engine.codec.bos_id is not None:
        ids = [engine.codec.bos_id] + ids
    return ids


def evaluate(model: Path, text: str, ctx: int = 512, n_chunks: int | None = None,
             reference: Path | None = None, threads: int | None = None, params: dict[str, Any] | None = None,
             progress: Callable[[int, int, float], None] | None = None) -> dict[str, Any]:
    """Perplexity of `model` on `text` (and KL etc. against `reference`), llama.cpp's way."""
    t0 = time.perf_counter()
    eng = open_engine(model, ctx, threads, params)
    ref = open_engine(reference, ctx, threads, params) if reference is not None else None
    try:
        tokens = text_tokens(eng, text)
        if ref is not None and text_tokens(ref, text) != tokens:
            raise ValueError(f"{reference}: its tokenizer splits the text differently from {model}'s; "
                             f"a reference must be the same model")
        bos = eng.codec.bos_id if eng.codec.add_bos else None
        chunks = list(chunk_tokens(tokens, ctx, n_chunks, bos))
        acc = Accumulator()
        for i, c in enumerate(chunks):
            logits = eng.logits(c)
            ref_logits = ref.logits(c) if ref is not None else None
            acc.add_chunk(logits, c, ref_logits)
            del logits, ref_logits
            if progress:
                progress(i + 1, len(chunks), acc.running_ppl())
    finally:
        eng.close()
        if ref is not None:
            ref.close()
    return {"model": str(model), "reference": str(reference) if reference else None, "ctx": ctx,
            "params": params or {},
            "tokens": len(tokens), "chunks": len(chunks), **summarize(acc),
            "seconds": time.perf_counter() - t0}


# --- llama.cpp's llama-perplexity --------------------------------------------------------------

def find_llama_perplexity(flag: str | None) -> tuple[str | None, str]:
    """The llama-perplexity executable, or None and why not."""
    path = flag or os.environ.get(LLAMA_ENV)
    if not path:
        return None, f"no llama-perplexity given (--llama_perplexity PATH or ${LLAMA_ENV})"
    if not (Path(path).is_file() and os.access(path, os.X_OK)):
        return None, f"{path}: not an executable file"
    return path, ""


_FLOAT = r"([-+]?[0-9.]+(?:e[-+]?\d+)?)"


def run_llama_perplexity(exe: str, gguf: Path, text_file: Path, ctx: int, threads: int,
                         n_chunks: int | None = None, extra: Sequence[str] = ()) -> dict[str, Any]:
    """Run llama-perplexity and read back its final figures (PPL, or the KL statistics)."""
    cmd = [exe, "-m", str(gguf), "-f", str(text_file), "-c", str(ctx), "-t", str(threads),
           *(["--chunks", str(n_chunks)] if n_chunks and n_chunks > 0 else []), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace")
    log = proc.stdout + proc.stderr
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log[-2000:]}")
    out: dict[str, Any] = {"command": " ".join(cmd), "seconds": time.perf_counter() - t0}
    pm = r"\s*(?:±|\+/-)\s*"  # llama.cpp writes "+/-" in the PPL line and "±" in the KL table
    patterns = {"ppl": rf"Final estimate: PPL = {_FLOAT}{pm}{_FLOAT}",
                "chunks": r"over (\d+) chunks",
                "ppl_q": rf"Mean PPL\(Q\)\s*:\s*{_FLOAT}{pm}{_FLOAT}",
                "ppl_ref": rf"Mean PPL\(base\)\s*:\s*{_FLOAT}{pm}{_FLOAT}",
                "ln_ppl_ratio": rf"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*{_FLOAT}{pm}{_FLOAT}",
                "kld_mean": rf"Mean\s+KLD:\s*{_FLOAT}{pm}{_FLOAT}",
                "kld_p99": rf"99\.0%\s+KLD:\s*{_FLOAT}",
                "same_top_pct": rf"Same top p:\s*{_FLOAT}{pm}{_FLOAT}"}
    for key, pat in patterns.items():
        m = re.search(pat, log)
        if not m:
            continue
        if key == "chunks":
            out[key] = int(m.group(1))
            continue
        out[key] = float(m.group(1))
        if m.lastindex and m.lastindex > 1:
            out[key + "_err"] = float(m.group(2))
    if "ppl_q" in out:  # the KL run: our names for its figures
        out["ppl"], out["ppl_err"] = out.pop("ppl_q"), out.pop("ppl_q_err")
        out["kld_err"], out["same_top_err"] = out.pop("kld_mean_err", 0.0), out.pop("same_top_pct_err", 0.0)
    if "ppl" not in out:
        raise RuntimeError(f"{' '.join(cmd)}: no final figure in its output:\n{log[-2000:]}")
    return out


def llama_side(exe: str, model: Path, text_file: Path, ctx: int, threads: int, n_chunks: int | None,
               reference: Path | None) -> dict[str, Any]:
    """llama.cpp on the same GGUF(s): its PPL, and its KL divergence when the reference is a GGUF."""
    if reference is None or not reference.is_file():
        return run_llama_perplexity(exe, model, text_file, ctx, threads, n_chunks)
    with tempfile.TemporaryDirectory(prefix="colibri-kld-") as tmp:
        base = Path(tmp) / "base.kld"
        ref = run_llama_perplexity(exe, reference, text_file, ctx, threads, n_chunks,
                                   ["--kl-divergence-base", str(base)])
        out = run_llama_perplexity(exe, model, text_file, ctx, threads, n_chunks,
                                   ["--kl-divergence-base", str(base), "--kl-divergence"])
    # its KL table's PPL(base) comes from the stored 16-bit log-probs, clipped 16 below each
    # position's top logit, which lowers it (13.99 against 14.03 on the default model's f16):
    # the change is taken against the reference's own plain run
    out["ppl_ref_kl_table"] = out.pop("ppl_ref", None)
    out["ppl_ref"] = ref["ppl"]
    out["delta_ppl_pct"] = 100 * (out["ppl"] / ref["ppl"] - 1)
    out["seconds"] += ref["seconds"]
    return out


# --- the command --------------------------------------------------------------------------------

def _show(label: str, r: dict[str, Any]) -> None:
    line = f"{label:>10}: PPL = {r['ppl']:.4f} +/- {r['ppl_err']:.5f}"
    if "chunks" in r:
        line += f"  ({r['chunks']} chunks"
        line += f", {r['positions']} positions)" if "positions" in r else ")"
    print(line)
    if "kld_mean" in r:
        ref = f"PPL_ref = {r['ppl_ref']:.4f}, " if "ppl_ref" in r else ""
        dp = f"dPPL = {r['delta_ppl_pct']:+.3f}%, " if "delta_ppl_pct" in r else ""
        print(f"{'':>10}  {ref}{dp}KLD = {r['kld_mean']:.6f} +/- {r.get('kld_err', 0):.6f} "
              f"(99%: {r.get('kld_p99', float('nan')):.6f}), same top = {r['same_top_pct']:.2f}%")


def cmd_perplexity(args: argparse.Namespace) -> int:
    text_file = Path(args.text)
    text = text_file.read_text(encoding="utf-8")
    workdir = Path(args.workdir) if args.workdir else None
    model = prepare_model(args.model, args.quantize, workdir)
    reference = prepare_model(args.reference, args.reference_quantize, workdir) if args.reference else None

    def progress(i: int, n: int, ppl: float) -> None:
        print(f"[{i}/{n}] {ppl:.4f}", file=sys.stderr, flush=True)

    ours = evaluate(model, text, args.ctx, args.chunks, reference, args.threads, parse_params(args.param), progress)
    result: dict[str, Any] = {"text": str(text_file), "colibri": ours}
    _show("colibri", ours)
    exe, why = find_llama_perplexity(args.llama_perplexity)
    src = Path(args.model)
    if not src.is_file():
        why = f"{src} is a model folder, not a GGUF"
    elif args.quantize:
        why = f"--quantize {args.quantize}: Colibri ran its own conversion, not the GGUF as it is"
    if exe and not why:
        ref_src = Path(args.reference) if args.reference and not args.reference_quantize else None
        peer = llama_side(exe, src, text_file, args.ctx, args.threads or 2, args.chunks, ref_src)
        result["llama.cpp"] = peer
        _show("llama.cpp", peer)
        diff = 100 * (ours["ppl"] / peer["ppl"] - 1)
        result["ppl_diff_pct"] = diff
        print(f"{'':>10}  Colibri - llama.cpp: {diff:+.3f}% of PPL")
    else:
        result["llama.cpp"] = {"skipped": why}
        print(f"{'llama.cpp':>10}: skipped: {why}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("perplexity", help="perplexity, KL divergence and top-1 agreement, as llama-perplexity",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a Colibri model folder or a GGUF file")
    p.add_argument("--text", required=True, help="a UTF-8 text file")
    p.add_argument("--ctx", type=int, default=512, help="tokens per chunk (llama-perplexity -c)")
    p.add_argument("--chunks", type=int, default=None, help="evaluate at most this many chunks (--chunks)")
    p.add_argument("--reference", help="a higher-precision version of the same model: KL and top-1 against it")
    p.add_argument("--quantize", help="convert a GGUF --model with this target (f32, f16, int8, int4)")
    p.add_argument("--reference_quantize", help="the same for --reference (e.g. f16)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="an engine parameter for both models, e.g. int8_activations=false (repeatable)")
    p.add_argument("--llama_perplexity", help=f"llama.cpp's llama-perplexity (default ${LLAMA_ENV})")
    p.add_argument("--workdir", help="where converted GGUFs are kept (default: the cache folder)")
    p.add_argument("--json", help="also write the figures to this file")
    p.set_defaults(func=cmd_perplexity)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    add_parser(ap.add_subparsers(dest="command", required=True))
    a = ap.parse_args()
    sys.exit(a.func(a))
