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

`--prefill`: the same for a prompt (pp512 by default): per prompt token, each kernel and each
group of matrices by format (`ffn_gate+up q5_k`: a MoE prompt's experts take one call per expert
and matrix), and the process CPU time beside the wall time (on a shared machine, 1-thread CPU
time is the steadier figure).
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


def _formats(eng) -> dict[str, str]:
    """Matrix name -> its format's name (`q5_k`), over every layer's matrices and experts."""
    from engine import quant
    from engine.kernels import cpu
    from engine.weight_types import Matrix

    def fmt(m: Matrix) -> str:
        try:
            return quant.get(m.code % cpu.PACKED).name
        except Exception:  # noqa: BLE001 (a float code the quant table does not list)
            return str(m.code)
    out: dict[str, str] = {}
    w = eng.net.w
    for obj in [w, *w.layers]:
        for m in vars(obj).values():
            if isinstance(m, Matrix):
                out[m.name] = fmt(m)
    cfg = eng.net.cfg
    for L in range(len(w.layers)):
        for e in range(max(1, cfg.num_experts if cfg.is_moe else 1)):
            try:
                with w.experts.use(L, e) as ew:
                    for m in (ew.gate, ew.up, ew.down):
                        out[m.name] = fmt(m)
            except Exception:  # noqa: BLE001 (a dense layer without experts)
                break
    return out


def profile_prefill(model: str, threads: int, prompt_tokens: int, runs: int = 3) -> dict:
    """Where a prompt token's time goes: `runs` untimed prefills (median wall and CPU time),
    then one with every kernel call timed, grouped by kernel and by matrix kind and format."""
    from engine.api import Engine
    from engine.model_dir import open_model_dir
    from engine.timing import OpTimer
    cfg = open_model_dir(model).config
    eng = Engine(model, threads=threads, context_length=prompt_tokens + 16,
                 **({"expert_cache_size": cfg.num_experts} if cfg.is_moe else {}))
    eng.warmup()
    rng = np.random.default_rng(0)
    prompt = [int(i) for i in rng.integers(cfg.vocab_size // 4, cfg.vocab_size // 2, prompt_tokens)]
    eng.forward(prompt)
    eng.reset()
    walls, cpus = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        eng.forward(prompt)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        eng.reset()
    formats = _formats(eng)
    timer = OpTimer()
    eng.net.timer = timer
    try:
        t0 = time.perf_counter()
        eng.forward(prompt)
        total = time.perf_counter() - t0
    finally:
        eng.net.timer = None
        eng.close()
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for label, seconds in timer.spent.items():
        group = KERNELS.get(label) or _group(label)
        if label in formats:
            group = f"{group} {formats[label]}"
        spent[group] += seconds
        calls[group] += timer.calls[label]
    per = 1e6 / prompt_tokens
    rows = {k: {"us_per_token": per * v, "calls": calls[k]} for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}
    rows["python and the rest"] = {"us_per_token": per * (total - sum(spent.values())), "calls": 0}
    return {"model": model, "threads": threads, "prompt_tokens": prompt_tokens,
            "prefill_tok_s": prompt_tokens / sorted(walls)[len(walls) // 2],
            "cpu_us_per_token": per * sorted(cpus)[len(cpus) // 2], "timed_us_per_token": per * total, "rows": rows}


def main_prefill(args: argparse.Namespace, model: str) -> int:
    r = profile_prefill(model, args.threads, args.prompt_tokens or 512)
    print(f"{args.model}: prefill of {r['prompt_tokens']} tokens, {r['prefill_tok_s']:.0f} tok/s "
          f"({args.threads} threads; process CPU {r['cpu_us_per_token']:.0f} us per token); "
          f"{r['timed_us_per_token']:.0f} us per token with every kernel timed:\n")
    _print_parts(r["rows"], "us_per_token", r["timed_us_per_token"], "us per prompt token", "calls", "{:.1f}",
                 "{}")
    _write_json(args.json, r)
    return 0


def _print_parts(rows: dict, key: str, total: float, unit: str, calls: str, fmt: str, calls_fmt: str) -> None:
    """The Markdown table of where the time goes: a row per part, its time, share and calls."""
    print(f"| part | {unit} | share | {calls.replace('_', ' ')} |\n|---|---|---|---|")
    for name, row in rows.items():
        share = 100 * row[key] / total
        print(f"| {name} | {fmt.format(row[key])} | {share:.0f}% | {calls_fmt.format(row[calls])} |")


def _write_json(path: str | None, report: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=1) + "\n")


def main(args: argparse.Namespace) -> int:
    from app.bench.speed import MOE_DIR, model_paths, resolve_spec
    work = Path(args.workdir).expanduser() if args.workdir else MOE_DIR
    work.mkdir(parents=True, exist_ok=True)
    spec = args.model
    moe_dir = Path(args.moe_dir).expanduser() if args.moe_dir else None
    source = resolve_spec(spec, moe_dir or MOE_DIR)  # `moe-small:Q5_K_M`: llama.cpp's GGUF of that preset
    paths = model_paths(source, work, moe_dir)
    if args.prefill:
        return main_prefill(args, paths["colibri"][0])
    report = profile(paths["colibri"][0], args.threads, args.prompt_tokens or 64, args.tokens)
    fused = report["fused_kernel_ms_per_token"]
    how = f"one kernel call per token, {fused:.2f} ms in it" if fused is not None else "layer by layer"
    print(f"{spec}: {report['untimed_ms_per_token']:.2f} ms per token ({how}; {args.threads} threads)\n"
          f"layer by layer: {report['layered_ms_per_token']:.2f} ms untimed, "
          f"{report['timed_ms_per_token']:.2f} ms with every kernel timed:\n")
    _print_parts(report["rows"], "ms_per_token", report["timed_ms_per_token"], "ms per token", "calls_per_token",
                 "{:.2f}", "{:.0f}")
    _write_json(args.json, report)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="where a decoded token's time goes, by kernel and tensor")
    p.add_argument("--model", default="default", help="a GGUF, HF folder, Colibri directory or named model "
                                                      "(default, moe-q8_0, moe-q4_0)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt_tokens", type=int, default=None, help="default 64 (512 with --prefill)")
    p.add_argument("--prefill", action="store_true", help="where a prompt token's time goes (pp512) instead")
    p.add_argument("--tokens", type=int, default=32, help="decode steps timed")
    p.add_argument("--workdir", help="where a converted copy is kept (default ~/.cache/colibri/bench)")
    p.add_argument("--moe_dir", help="where the MoE benchmark models are (default ~/.cache/colibri/bench)")
    p.add_argument("--json", help="also write the figures to this file")
    p.set_defaults(func=main)
