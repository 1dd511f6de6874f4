"""Make tiny GGUFs with llama.cpp's own tools, one per quantization preset, and record
llama.cpp's greedy runs on them (tests/fixtures/llamacpp_presets/, read by
tests/test_llamacpp_presets.py).

Why: Colibri must import every weight type that llama.cpp's presets write, as llama.cpp lays
them out (including its fallbacks: a row that is not a multiple of 256 gets Q5_0 under Q4_K_M,
Q5_1 under Q5_K_M, Q8_0 under Q6_K, IQ4_NL under IQ4_XS, Q4_0 under Q2_K/Q3_K), and compute
with them as llama.cpp does. Our own fixture writer (tests/gguf_fixtures.py) cannot make
K-quant or IQ blocks the way llama-quantize does; these files are the real thing.

Steps:
1. a tiny random Llama in Hugging Face form (numpy + safetensors; the tokenizer of
   tests/fixtures/hf/llama): hidden 256 (rows that K-quants take) and FFN width 160 (ffn_down's
   rows of 160: the fallbacks), 2 layers, 4 heads of 64, 2 KV heads, untied output; and a
   one-layer Mixtral of 4 experts (top 2) for MXFP4, which llama.cpp writes only for experts;
2. llama.cpp's convert_hf_to_gguf.py -> f16 GGUF (needs torch: run this script in a venv that
   has it, never the project's);
3. llama-quantize f16 -> each preset in PRESETS (the imatrix-only presets IQ1_*, IQ2_*, IQ3_XXS
   are skipped: llama-quantize refuses them without an importance matrix, and Colibri refuses
   their types anyway);
4. for each preset, llama.cpp's greedy continuation of each prompt in PROMPTS through the
   llama-cpp-python ctypes binding over the same build's libllama.so (LLAMA_CPP_LIB_PATH),
   with the top-1/top-2 margin of each step (the teacher-forced test skips tiny margins) and the
   TOP largest logits of the last prompt position; prompts are tokenized with special tokens
   matched, no BOS (the fixture tokenizer adds none).

Re-run by hand (nothing in the suite needs llama.cpp, torch or a network)::

    python3 -m venv /tmp/venv-convert
    /tmp/venv-convert/bin/pip install torch==2.13.0 numpy safetensors transformers sentencepiece \\
        "protobuf<5" jinja2 diskcache typing_extensions
    /tmp/venv-convert/bin/python tests/make_llamacpp_presets.py \\
        --llama-cpp llama_cpp_python-0.3.36 --bin .llama.cpp/build/bin

The tokenizer's pre-tokenizer is not one llama.cpp knows by hash, so the converter is run with
its pre-tokenizer name set to "smollm" (the same regex, GPT-2 byte-level BPE).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "llamacpp_presets"
TOKENIZER = REPO / "tests" / "fixtures" / "hf" / "llama"
PRESETS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS"]
SKIPPED = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS"}  # need an imatrix
CONFIG = {"hidden_size": 256, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 384}
# MXFP4 is written only for experts (the MXFP4_MOE preset; gpt-oss): a one-layer Mixtral of 4 experts
MOE_CONFIG = {**CONFIG, "num_hidden_layers": 1, "num_local_experts": 4, "num_experts_per_tok": 2}
MOE_PRESETS = ["MXFP4_MOE"]
PROMPTS = ["def fibonacci(n):", "The capital of France is", "1, 2, 3, 4, 5,", "Hello, world! What is 2+3?",
           "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n", "return fibonacci(n - 1)"]
MAX_NEW = 32
TOP = 20  # logits of the last prompt position kept: the TOP largest
SEED = 15


def make_hf(folder: Path, c: dict) -> None:
    """A random Llama (Mixtral if `c` has experts) in Hugging Face form; weights scaled so logits
    spread over a few units."""
    from safetensors.numpy import save_file
    h, ff, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    rng = np.random.default_rng(SEED)

    def w(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1 + 0.2 * rng.standard_normal(h)).astype(np.float32)

    t = {"model.embed_tokens.weight": rng.standard_normal((c["vocab_size"], h)).astype(np.float32),
         "model.norm.weight": norm(), "lm_head.weight": w(c["vocab_size"], h, 3.0)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm(),
              p + "self_attn.q_proj.weight": w(c["num_attention_heads"] * hd, h),
              p + "self_attn.k_proj.weight": w(c["num_key_value_heads"] * hd, h),
              p + "self_attn.v_proj.weight": w(c["num_key_value_heads"] * hd, h),
              p + "self_attn.o_proj.weight": w(h, c["num_attention_heads"] * hd)}
        if "num_local_experts" not in c:
            t |= {p + "mlp.gate_proj.weight": w(ff, h), p + "mlp.up_proj.weight": w(ff, h),
                  p + "mlp.down_proj.weight": w(h, ff)}
            continue
        t[p + "block_sparse_moe.gate.weight"] = w(c["num_local_experts"], h, 4.0)
        for e in range(c["num_local_experts"]):
            q = f"{p}block_sparse_moe.experts.{e}."
            t |= {q + "w1.weight": w(ff, h), q + "w3.weight": w(ff, h), q + "w2.weight": w(h, ff)}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    moe = "num_local_experts" in c
    config = {"architectures": ["MixtralForCausalLM" if moe else "LlamaForCausalLM"],
              "model_type": "mixtral" if moe else "llama", "hidden_act": "silu",
              "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 2, "torch_dtype": "float32",
              "attention_bias": False, "mlp_bias": False, **c}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, folder / name)


CONVERT = """
import sys
sys.argv = sys.argv[1:]
sys.path.insert(0, {src!r})
import convert_hf_to_gguf as c
from conversion import base
def pre(self, tokenizer):
    return "smollm"  # the fixture tokenizer's regex is SmolLM's; llama.cpp knows pre-tokenizers by hash
for cls in (getattr(c, "TextModel", None), getattr(base, "TextModel", None)):
    if cls is not None:
        cls.get_vocab_base_pre = pre
c.main()
"""


def convert_f16(hf: Path, out: Path, src: Path) -> None:
    code = CONVERT.format(src=str(src))
    subprocess.run([sys.executable, "-c", code, "convert_hf_to_gguf.py", str(hf), "--outtype", "f16",
                    "--outfile", str(out)], check=True)


def quantize(f16: Path, out: Path, preset: str, bindir: Path) -> str:
    r = subprocess.run([str(bindir / "llama-quantize"), str(f16), str(out), preset, "2"],
                       capture_output=True, text=True, check=True)
    return r.stdout + r.stderr


def greedy(path: Path) -> list[dict]:
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=256, n_threads=2, n_threads_batch=2, logits_all=True, seed=0,
                type_k=0, type_v=0, flash_attn=False, verbose=False)  # an f32 KV cache: less noise
    runs = []
    for text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        gen, margins, top2 = [], [], []
        for _ in range(MAX_NEW):
            logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            o = np.argsort(-logits, kind="stable")[:2]
            gen.append(int(o[0]))
            top2.append(int(o[1]))
            margins.append(round(float(logits[o[0]] - logits[o[1]]), 5))
            llm.eval([int(o[0])])
        last = np.asarray(llm.scores[len(ids) - 1], dtype=np.float32)
        top = np.argsort(-last, kind="stable")[:TOP]
        runs.append({"text": text, "prompt_ids": [int(i) for i in ids], "generated_ids": gen, "top2_ids": top2,
                     "margins": margins, "last_prompt_top": {"ids": [int(i) for i in top],
                                                             "logits": [round(float(last[i]), 5) for i in top]}})
    llm.close()
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama-cpp-python source (holds vendor/llama.cpp)")
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp build's bin folder (llama-quantize, libllama.so)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    os.environ["LLAMA_CPP_LIB_PATH"] = str(args.bin)
    sys.path.insert(0, str(args.llama_cpp))
    src = args.llama_cpp / "vendor" / "llama.cpp"
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"config": CONFIG, "moe_config": MOE_CONFIG, "seed": SEED, "skipped_presets": sorted(SKIPPED),
            "presets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, config, presets in (("tiny", CONFIG, PRESETS), ("tiny-moe", MOE_CONFIG, MOE_PRESETS)):
            hf, f16 = Path(tmp) / kind, Path(tmp) / f"{kind}-f16.gguf"
            make_hf(hf, config)
            convert_f16(hf, f16, src)
            for preset in presets:
                path = args.out / f"{kind}-{preset.lower()}.gguf"
                log = quantize(f16, path, preset, args.bin)
                meta["presets"][preset] = {
                    "file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                    "fallbacks": [line.strip() for line in log.splitlines() if "falling back" in line],
                    "runs": greedy(path)}
                print(f"{preset:9s} {path.stat().st_size / 1024:7.1f} KiB, "
                      f"{len(meta['presets'][preset]['fallbacks'])} fallbacks")
    (args.out / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
