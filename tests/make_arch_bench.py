"""Moderately sized random models of the 2026 MoE architectures, for `colibri-bench speed` against
llama-bench (not committed: a few hundred MB each; kept in ~/.cache/colibri/bench/arch/ by default).

Why: the tiny fixtures (make_arch_fixtures.py) hold the forward pass to transformers, but at widths
of 72 they time nothing but Python. These have hidden 1024, 8 layers of every kind the architecture
has and experts of a few hundred rows, so a decoded token's time is spent in the kernels as in the
released models, while converting and quantizing in minutes. Weights are drawn as the fixtures draw
them (make_arch_fixtures.redraw, bfloat16); the tokenizer is the fixture's tiny BPE (320 tokens: the
output head costs almost nothing, for both engines alike).

Each architecture gets <out>/<arch>-hf (transformers' save_pretrained), <arch>-f16.gguf (llama.cpp's own
convert_hf_to_gguf.py) and <arch>-Q8_0.gguf, <arch>-Q4_K_M.gguf (llama-quantize). Then::

    colibri-bench speed --model ~/.cache/colibri/bench/arch/gpt_oss-Q8_0.gguf,... --engines colibri,llama-bench

Re-run (the torch venv; no network)::

    .venv-fixtures/bin/python tests/make_arch_bench.py --out ~/.cache/colibri/bench/arch \\
        --llama-cpp llama_cpp_python-0.3.36 --bin .llama.cpp/build/bin [--only gpt_oss]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_arch_fixtures as fx  # noqa: E402
import make_arch_llamacpp as lc  # noqa: E402

# hidden 1024, 8 layers, each architecture's layer pattern and router; expert widths multiples of 256
# (Q4_K_M's super-blocks)
SHAPES = {
    "gpt_oss": {  # 16 experts, top-4, sliding 128 / full alternating, sinks, yarn
        "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
        "head_dim": 64, "intermediate_size": 512, "num_local_experts": 16, "num_experts_per_tok": 4,
        "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 4,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
    },
    "qwen3_5_moe": {  # 3 DeltaNet : 1 gated full attention, 32 experts top-8 + a shared expert
        "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 128, "layer_types": ["linear_attention"] * 3 + ["full_attention"] +
        ["linear_attention"] * 3 + ["full_attention"],
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 4, "linear_num_value_heads": 8, "moe_intermediate_size": 256,
        "shared_expert_intermediate_size": 512, "num_experts": 32, "num_experts_per_tok": 8,
        "max_position_embeddings": 4096,
    },
    "lfm2_moe": {  # conv and GQA layers, 1 dense leading layer, 16 experts top-4, sigmoid router
        "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
        "intermediate_size": 2048, "moe_intermediate_size": 512, "num_experts": 16, "num_experts_per_tok": 4,
        "num_dense_layers": 1, "layer_types": ["conv", "conv", "full_attention"] * 2 + ["conv", "full_attention"],
        "max_position_embeddings": 4096,
    },
    "gemma4": {  # sliding 128 / full, a dense MLP beside 32 experts top-4, softcap
        "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 128, "global_head_dim": 256, "num_global_key_value_heads": 2, "intermediate_size": 1024,
        "num_experts": 32, "top_k_experts": 4, "moe_intermediate_size": 256, "sliding_window": 128,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 +
        ["full_attention"], "max_position_embeddings": 4096,
    },
}
PRESETS = ("Q8_0", "Q4_K_M")


def build(arch: fx.Arch, out: Path) -> Path:
    """The random transformers checkpoint of `arch` at SHAPES[arch.name], saved in bfloat16."""
    import torch
    hf = out / f"{arch.name}-hf"
    if (hf / "config.json").exists():
        return hf
    big = replace(arch, config={**arch.config, **SHAPES[arch.name]})
    tok = fx.train_tokenizer(big)
    _, model = fx.build_model(big, tok, big.seed)
    hf.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(hf, safe_serialization=True)
    (hf / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n")
    (hf / "tokenizer_config.json").write_text(json.dumps(fx.tokenizer_config(big), indent=2) + "\n")
    (hf / "reference.json").write_text(json.dumps({"gguf_pre_tokenizer": fx.GGUF_PRE[big.tokenizer]}) + "\n")
    return hf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "colibri" / "bench" / "arch")
    ap.add_argument("--llama-cpp", type=Path, default=Path("llama_cpp_python-0.3.36"))  # docs/bench/README.md
    ap.add_argument("--bin", type=Path, default=Path(".llama.cpp/build/bin"))
    ap.add_argument("--only", default=",".join(SHAPES))
    a = ap.parse_args()
    src = a.llama_cpp / "vendor" / "llama.cpp"
    for arch in (x for x in fx.ARCHS if x.name in a.only.split(",")):
        hf = build(arch, a.out)
        f16 = a.out / f"{arch.name}-f16.gguf"
        if not f16.exists():
            lc.convert_f16(hf, f16, src, lc.CONVERT_FLAGS.get(arch.name, []))
        for p in PRESETS:
            q = a.out / f"{arch.name}-{p}.gguf"
            if not q.exists():
                subprocess.run([str(a.bin / "llama-quantize"), str(f16), str(q), p], check=True,
                               capture_output=True)
            print(f"{q} {q.stat().st_size / 1e6:.0f} MB", flush=True)


if __name__ == "__main__":
    main()
