"""Teacher-forced agreement with llama.cpp on the files `colibri-bench speed` times (its --fidelity).

Speed is only worth something if the tokens are llama.cpp's: the same GGUF, the same prompt ids
fed to both engines in one pass (teacher forcing), and at each position where llama.cpp is
confident (its top-1 logit leads its top-2 by at least MARGIN) Colibri's argmax must be llama.cpp's.
Positions with a smaller margin are a coin toss between two tokens for any two correct engines
(int8 activations, another summation order) and are not counted.

How close two correct engines can agree is measured, not assumed: llama.cpp is also run one token
at a time (n_batch 1: its decode path, the same int8 activations but other kernels and summation
orders) and that run's agreement with its batched run is reported beside Colibri's as the floor
(`llama_cpp_self`). On SmolLM2-135M its two paths agree at 97-98% of the confident positions:
int8 activations move its logits by ~0.6 (on a scale of ~27) from a float64 forward of the same
dequantized weights, and Colibri's by as much, independently.

Each engine runs in its own process (as the speed workers do): `python -m app.bench.fidelity
--worker ENGINE --model PATH --tokens FILE --out NPY` writes the logits of every position;
the parent compares them. llama.cpp is its Python binding (`llama_cpp`, logits_all) over the
libllama built beside llama-bench; Colibri is Engine.logits with every expert resident.
This module's top level imports only the standard library and numpy (the binding's interpreter
need not have Colibri's dependencies).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
# held-out passages (not the moefy calibration text), each teacher-forced from an empty context: 1,024
# positions in all (at 256, one position moved the rate by 0.4 points)
TEXTS = tuple(ROOT / "tests" / "fixtures" / "texts" / n for n in ("en_python_docs.txt", "code_cpython.txt"))
MARGIN = 0.05  # llama.cpp's top-1 minus top-2 logit below this: not counted (a tie for any engine)
TOKENS = 512  # per passage


def _colibri_logits(model: str, passages: list[list[int]], threads: int) -> np.ndarray:
    from app.bench.workers import open_colibri  # (the engine as the speed runs open it: every expert resident)
    engine = open_colibri(model, threads, max(map(len, passages)) + 8)
    return np.concatenate([engine.logits(tokens) for tokens in passages])


def _llamacpp_logits(model: str, passages: list[list[int]], threads: int, batch: int | None = None) -> np.ndarray:
    from llama_cpp import Llama
    n = max(map(len, passages)) + 8
    llm = Llama(model_path=model, n_ctx=n, n_batch=batch or n, n_ubatch=batch or n, n_threads=threads,
                n_threads_batch=threads, logits_all=True, verbose=False)
    out = []
    for tokens in passages:
        llm.reset()  # (an empty context for each passage, as Engine.logits starts one)
        llm.eval(tokens)
        out.append(np.array(llm.scores[:len(tokens)], np.float32))  # (a copy: the next passage reuses scores)
    return np.concatenate(out)


def _llamacpp_one_by_one(model: str, passages: list[list[int]], threads: int) -> np.ndarray:
    return _llamacpp_logits(model, passages, threads, batch=1)


WORKERS = {"colibri": _colibri_logits, "llama.cpp": _llamacpp_logits, "llama.cpp-1": _llamacpp_one_by_one}


def worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    for flag in ("--worker", "--model", "--tokens", "--out"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    tokens = json.loads(Path(a.tokens).read_text())
    np.save(a.out, WORKERS[a.worker](a.model, tokens, a.threads))
    return 0


def agreement(ours: np.ndarray, theirs: np.ndarray, margin: float = MARGIN) -> dict:
    """Argmax agreement at the positions where `theirs` leads by at least `margin`."""
    top2 = np.sort(theirs, axis=1)[:, -2:]
    confident = (top2[:, 1] - top2[:, 0]) >= margin
    same = ours.argmax(axis=1) == theirs.argmax(axis=1)
    compared, agreed = int(confident.sum()), int((same & confident).sum())
    return {"positions": int(len(theirs)), "compared": compared, "agreed": agreed, "margin": margin,
            "rate": agreed / compared if compared else None, "agreed_all": float(same.mean())}


def prompt_tokens(model: str, count: int = TOKENS) -> list[list[int]]:
    """The first `count` tokens of each held-out passage, by the model's own tokenizer (with its BOS
    where the model adds one, as llama.cpp does)."""
    from engine.model_dir import open_model_dir
    from engine.tokenizer import TextCodec
    codec = TextCodec.from_model(open_model_dir(model))
    return [[int(i) for i in codec.encode(t.read_text(encoding="utf-8"))[:count]] for t in TEXTS]


def measure(colibri_path: str, gguf: str, colibri_py: str, llama_py: str, workdir: Path, threads: int = 2,
            count: int = TOKENS) -> dict:
    """Teacher-force `count` tokens of each passage through both engines (fresh processes, which find the binding's
    libllama as cmd_speed pointed it: llamacpp.use_binding_beside) and compare their argmax;
    `llama_cpp_self`: llama.cpp one token at a time against its own batched run (the floor)."""
    tokens = prompt_tokens(colibri_path, count)
    tfile = workdir / "fidelity-tokens.json"
    tfile.write_text(json.dumps(tokens))
    logits = {}
    for engine, py, model in (("colibri", colibri_py, colibri_path), ("llama.cpp", llama_py, gguf),
                              ("llama.cpp-1", llama_py, gguf)):
        out = workdir / f"fidelity-{engine}.npy"
        cmd = [py, "-m", "app.bench.fidelity", "--worker", engine, "--model", model, "--tokens", str(tfile),
               "--out", str(out), "--threads", str(threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
        if proc.returncode:
            raise RuntimeError(f"fidelity: the {engine} worker failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        logits[engine] = np.load(out)
        out.unlink()
    floor = agreement(logits["llama.cpp-1"], logits["llama.cpp"])
    return agreement(logits["colibri"], logits["llama.cpp"]) | {
        "text": " and ".join(t.name for t in TEXTS), "tokens_per_text": count,
        "llama_cpp_self": {k: floor[k] for k in ("compared", "agreed", "rate")},
        "vs_llama_cpp_one_by_one": agreement(logits["colibri"], logits["llama.cpp-1"])["rate"]}


if __name__ == "__main__":
    if "--worker" in sys.argv:
        sys.exit(worker_main(sys.argv[1:]))
    sys.exit("run through colibri-bench speed --fidelity")
