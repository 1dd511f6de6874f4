"""The tiny architecture fixtures (tests/fixtures/arch/<arch>/) through llama.cpp's own converter and
runtime: an f16 GGUF per architecture (tests/fixtures/arch_llamacpp/<arch>-f16.gguf) and llama.cpp's
argmax runs on it (tests/fixtures/arch/<arch>/llamacpp.json).

Why: Colibri must run the GGUFs people download, laid out as llama.cpp lays them out (its tensor
names, its fused or split weights, its rope and norm conventions), and agree with llama.cpp. The
json records llama.cpp's tokenization of a few texts with the GGUF's own tokenizer and, for the
fixture prompt and for the fixture's long random sequence, llama.cpp's
teacher-forced argmax at every position with its top-1/top-2 margin, and a greedy continuation of
the prompt; it also records how often llama.cpp's teacher-forced argmax equals transformers'
(reference.npz), which says whether llama.cpp itself runs the tiny shapes right. An architecture
the converter or the runtime refuses is recorded with the reason instead of failing the script.

What llama.cpp refuses at tiny shapes (found making these): qwen3_5_moe's converter asserts a
multi-token-prediction layer count unless run with --no-mtp (transformers does not write
mtp_num_hidden_layers); its runtime takes both DeltaNet head dims from ssm.state_size, so a model whose
linear value head dim differs from the key head dim does not load ("blk.0.attn_qkv.weight has wrong
shape") -- the fixture uses equal dims, as the real models do. gemma4's converter reads only a
SentencePiece-style BPE vocabulary and marks as control tokens only those the tokenizer config names.
gpt_oss, lfm2_moe: converted and run as they are.

Re-run by hand (the torch venv; nothing in the suite needs llama.cpp, torch or a network)::

    .venv-fixtures/bin/python tests/make_arch_llamacpp.py \\
        --llama-cpp llama_cpp_python-0.3.36 --bin .llama.cpp/build/bin

Each fixture tokenizer uses its family's pre-tokenizer regex, which llama.cpp knows by the hash of
the real vocabulary, not of these tiny ones: the converter is run with the pre-tokenizer name set to
the family's (reference.json's gguf_pre_tokenizer: "gpt-4o", "qwen35", "lfm2"; gemma4's
SentencePiece-style tokenizer needs none). The GGUFs are then what llama.cpp writes for each family,
tokenizer included.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "arch"
GGUF_DIR = REPO / "tests" / "fixtures" / "arch_llamacpp"
ARCHS = ["gpt_oss", "qwen3_5_moe", "lfm2_moe", "gemma4", "gemma4_e2b"]
MAX_NEW = 16
# texts llama.cpp tokenizes with the GGUF's own tokenizer (special tokens matched, no BOS added), so a
# GGUF tokenizer import can be held to llama.cpp's: mixed case, contractions, digits, whitespace runs,
# CJK, a combining mark, and each fixture's prompt (added in run_one)
TEXTS = ["Hello, world! What's 2+3? And 12*7?", "The QUICK brown fox's 1234567 jumps... over\n\n  the lazy dog",
         "  leading spaces,\ttabs and\r\nnew lines\n", "你好，世界！今天天气很好。", "cafe\u0301 na\u00efve",
         "def fibonacci(n: int) -> list[int]:\n    return values[:n]"]
# qwen3_5_moe: the converter asserts a multi-token-prediction layer count (mtp_num_hidden_layers, which
# real Qwen3.5 configs carry and transformers does not write) unless told to leave MTP out
CONVERT_FLAGS = {"qwen3_5_moe": ["--no-mtp"]}

CONVERT = """
import sys
sys.argv = sys.argv[1:]
sys.path.insert(0, {src!r})
import convert_hf_to_gguf as c
from conversion import base
def pre(self, tokenizer):
    return {pre!r}
for cls in (getattr(c, "TextModel", None), getattr(base, "TextModel", None)):
    if cls is not None:
        cls.get_vocab_base_pre = pre
c.main()
"""


def convert_f16(hf: Path, out: Path, src: Path, extra: list[str]) -> str:
    pre = json.loads((hf / "reference.json").read_text())["gguf_pre_tokenizer"]
    r = subprocess.run([sys.executable, "-c", CONVERT.format(src=str(src), pre=pre), "convert_hf_to_gguf.py", str(hf),
                        "--outtype", "f16", "--outfile", str(out), *extra], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("convert_hf_to_gguf.py failed:\n" + r.stderr[-3000:])
    return r.stderr


def teacher_forced(llm, ids: list[int]) -> tuple[list[int], list[float], np.ndarray]:
    """argmax and top-1/top-2 margin after each position of `ids` (one batch, logits for all)."""
    llm.reset()
    llm.eval(ids)
    scores = np.asarray(llm.scores[:len(ids)], dtype=np.float32)
    order = np.argsort(-scores, axis=-1, kind="stable")[:, :2]
    top = np.take_along_axis(scores, order, axis=-1)
    return order[:, 0].tolist(), np.round(top[:, 0] - top[:, 1], 5).tolist(), scores


def greedy(llm, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    llm.reset()
    llm.eval(ids)
    gen, margins = [], []
    for _ in range(n):
        logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        o = np.argsort(-logits, kind="stable")[:2]
        gen.append(int(o[0]))
        margins.append(round(float(logits[o[0]] - logits[o[1]]), 5))
        llm.eval([int(o[0])])
    return gen, margins


def run_one(arch: str, src: Path, gguf_dir: Path) -> dict:
    folder = FIXTURES / arch
    ref = np.load(folder / "reference.npz")
    long = np.load(folder / "long.npz")
    out = gguf_dir / f"{arch}-f16.gguf"
    rec: dict = {"arch": arch, "gguf": str(out.relative_to(REPO)), "outtype": "f16"}
    try:
        log = convert_f16(folder, out, src, CONVERT_FLAGS.get(arch, []))
    except Exception as e:  # noqa: BLE001 -- recorded: which step refuses and why
        rec["refused"] = {"step": "convert_hf_to_gguf.py", "reason": str(e)[-2000:]}
        return rec
    rec["sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
    rec["convert_warnings"] = [ln for ln in log.splitlines() if "WARNING" in ln][:20]
    from llama_cpp import Llama
    try:
        llm = Llama(model_path=str(out), n_ctx=256, n_batch=256, n_threads=2, n_threads_batch=2, logits_all=True,
                    seed=0, type_k=0, type_v=0, flash_attn=False, verbose=False)  # an f32 KV cache
    except Exception as e:  # noqa: BLE001
        rec["refused"] = {"step": "llama.cpp load", "reason": f"{type(e).__name__}: {e}"}
        return rec
    try:
        runs = {}
        for name, ids, hf_logits in (("prompt", ref["input_ids"], ref["logits"]), ("long", long["input_ids"], None)):
            ids = [int(i) for i in ids]
            am, margins, scores = teacher_forced(llm, ids)
            run = {"ids": ids, "argmax": am, "margins": margins}
            if hf_logits is not None:
                hf_am = hf_logits.argmax(-1)
                run["agree_with_transformers"] = float(np.mean(np.array(am) == hf_am))
                run["max_abs_logit_diff_vs_transformers"] = float(np.abs(scores - hf_logits).max())
                run["max_abs_transformers_logit"] = float(np.abs(hf_logits).max())
            runs[name] = run
        gen, gm = greedy(llm, [int(i) for i in ref["input_ids"]], MAX_NEW)
        runs["prompt"]["greedy_ids"], runs["prompt"]["greedy_margins"] = gen, gm
        runs["prompt"]["greedy_agrees_with_transformers_8"] = gen[:8] == [int(i) for i in ref["greedy_ids"]]
        rec["runs"] = runs
        texts = TEXTS + [str(ref["text"])]
        rec["tokenize"] = [{"text": t, "ids": [int(i) for i in llm.tokenize(t.encode(), add_bos=False, special=True)]}
                           for t in texts]
    except Exception as e:  # noqa: BLE001
        rec["refused"] = {"step": "llama.cpp eval", "reason": f"{type(e).__name__}: {e}",
                          "trace": traceback.format_exc()[-1500:]}
    finally:
        llm.close()
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama-cpp-python source (holds vendor/llama.cpp)")
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp build's bin folder (libllama.so)")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.environ["LLAMA_CPP_LIB_PATH"] = str(args.bin)
    sys.path.insert(0, str(args.llama_cpp))
    src = args.llama_cpp / "vendor" / "llama.cpp"
    GGUF_DIR.mkdir(parents=True, exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    for arch in ARCHS:
        if only and arch not in only:
            continue
        rec = run_one(arch, src, GGUF_DIR)
        (FIXTURES / arch / "llamacpp.json").write_text(json.dumps(rec, indent=1) + "\n")
        if "refused" in rec:
            print(f"{arch:12s} REFUSED at {rec['refused']['step']}: {rec['refused']['reason'][-300:]}")
            continue
        p = rec["runs"]["prompt"]
        print(f"{arch:12s} {Path(rec['gguf']).stat().st_size / 1024:.0f} KiB; teacher-forced argmax = transformers' at "
              f"{p['agree_with_transformers']:.0%}, max|dlogit| {p['max_abs_logit_diff_vs_transformers']:.2e} "
              f"(of {p['max_abs_transformers_logit']:.1f}); greedy 8 = transformers': "
              f"{p['greedy_agrees_with_transformers_8']}")


if __name__ == "__main__":
    main()
