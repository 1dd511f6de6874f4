"""colibri-bench profile: where a decoded token's time goes, by kernel and by tensor.

One process, one model: a prompt, a few untimed tokens, then `--tokens` decode steps as a user
gets them (with the fused kernel that runs every layer of a token in one call, where it applies:
engine.models.fused), the time inside that kernel, and the same steps on the layer-by-layer
path. Kernels cannot be timed inside the fused call, so the breakdown comes from the
layer-by-layer path, which does the same arithmetic: every kernel call timed through the engine's timing hook
(engine.timing: a perf_counter pair around each, about a microsecond), matmuls grouped by the tensor they read (`attn_qkv`,
`attn_output`, `ffn_gate+up`, `ffn_down`, `ffn_gate_inp`, `output`; a MoE token's experts take
one call per layer). Whatever the kernels do not account for is the Python around them
(routing, the expert cache, buffers, the KV cache writes) — what the fused kernel removes.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

KERNELS = {"rmsnorm": "rmsnorm", "rope": "rope", "attention": "attention", "swiglu": "swiglu",
           "gather_rows": "gather_rows", "softmax_top_k": "softmax_top_k",
           "moe_int": "experts (gate, up, down: one call per layer)"}


def _group(name: str) -> str:
    """A matrix name (`blk.3.ffn_down.5.weight`, `output.weight`) -> its row in the profile."""
    for key, group in (("attn_q", "attn_qkv"), ("attn_k", "attn_qkv"), ("attn_v", "attn_qkv"),
                       ("attn_output", "attn_output"), ("ffn_gate_inp", "ffn_gate_inp (router)"),
                       ("ffn_gate", "ffn_gate+up"), ("ffn_up", "ffn_gate+up"), ("ffn_down", "ffn_down"),
                       ("output", "output"), ("token_embd", "output")):
        if f".{key}" in f".{name}":
            return group
    return name


def profile(model: str, threads: int, prompt_tokens: int, tokens: int) -> dict:
    from engine.api import Engine
    from engine.model_dir import open_model_dir
    from engine.timing import OpTimer
    cfg = open_model_dir(model).config
    eng = Engine(model, threads=threads, context_length=prompt_tokens + 4 * tokens + 16,
                 **({"expert_cache_size": cfg.num_experts} if cfg.is_moe else {}))
    eng.warmup()
    rng = np.random.default_rng(0)
    prompt = [int(i) for i in rng.integers(cfg.vocab_size // 4, cfg.vocab_size // 2, prompt_tokens)]
    nxt = eng.forward(prompt)
    for _ in range(4):
        nxt = eng.forward([nxt])
    if eng.net.fused is not None:  # room for every expert: the rest are loaded (ready() waits for them)
        eng.net.fused.ready()

    def decode() -> float:
        nonlocal nxt
        t0 = time.perf_counter()
        for _ in range(tokens):
            nxt = eng.forward([nxt])
        return (time.perf_counter() - t0) / tokens

    untimed = decode()  # four passes of `tokens` below: the context is sized for them
    timer = OpTimer()  # the engine's timing hook (engine.timing): nothing is replaced
    eng.net.timer = timer
    decode()
    fused_label = "decode_layers (fused)"
    in_kernel = (timer.spent.get(fused_label, 0.0), timer.calls.get(fused_label, 0))
    eng.net.timer = None
    eng.net.fused_decode = False
    layered = decode()
    timer.reset()
    eng.net.timer = timer
    try:
        t0 = time.perf_counter()
        for _ in range(tokens):
            nxt = eng.forward([nxt])
        total = (time.perf_counter() - t0) / tokens
    finally:
        eng.net.timer = None
        eng.close()
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for label, seconds in timer.spent.items():
        group = KERNELS.get(label) or _group(label)
        spent[group] += seconds
        calls[group] += timer.calls[label]
    rows = {k: {"ms_per_token": 1e3 * v / tokens, "calls_per_token": calls[k] / tokens}
            for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if calls[k]}
    rows["python and the rest"] = {"ms_per_token": 1e3 * (total - sum(spent.values()) / tokens),
                                   "calls_per_token": 0}
    fused = in_kernel[1] == tokens  # every step took the fused kernel
    return {"model": model, "threads": threads, "untimed_ms_per_token": 1e3 * untimed,
            "fused_kernel_ms_per_token": 1e3 * in_kernel[0] / tokens if fused else None,
            "layered_ms_per_token": 1e3 * layered, "timed_ms_per_token": 1e3 * total, "rows": rows}


def main(args: argparse.Namespace) -> int:
    from app.bench.speed import MOE_DIR, model_paths
    work = Path(args.workdir).expanduser() if args.workdir else MOE_DIR
    work.mkdir(parents=True, exist_ok=True)
    spec = args.model
    paths = model_paths(spec, work, Path(args.moe_dir).expanduser() if args.moe_dir else None)
    report = profile(paths["colibri"][0], args.threads, args.prompt_tokens, args.tokens)
    fused = report["fused_kernel_ms_per_token"]
    how = f"one kernel call per token, {fused:.2f} ms in it" if fused is not None else "layer by layer"
    print(f"{spec}: {report['untimed_ms_per_token']:.2f} ms per token ({how}; {args.threads} threads)\n"
          f"layer by layer: {report['layered_ms_per_token']:.2f} ms untimed, "
          f"{report['timed_ms_per_token']:.2f} ms with every kernel timed:\n")
    print("| part | ms per token | share | calls per token |\n|---|---|---|---|")
    for name, r in report["rows"].items():
        share = 100 * r["ms_per_token"] / report["timed_ms_per_token"]
        print(f"| {name} | {r['ms_per_token']:.2f} | {share:.0f}% | {r['calls_per_token']:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="where a decoded token's time goes, by kernel and tensor")
    p.add_argument("--model", default="default", help="a GGUF, HF folder, Colibri directory or named model "
                                                      "(default, moe-q8_0, moe-q4_0)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt_tokens", type=int, default=64)
    p.add_argument("--tokens", type=int, default=32, help="decode steps timed")
    p.add_argument("--workdir", help="where a converted copy is kept (default ~/.cache/colibri/bench)")
    p.add_argument("--moe_dir", help="where the MoE benchmark models are (default ~/.cache/colibri/bench)")
    p.add_argument("--json", help="also write the figures to this file")
    p.set_defaults(func=main)
