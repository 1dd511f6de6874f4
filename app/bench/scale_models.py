"""colibri-bench make-scale: random-weight GGUFs of a real MoE's exact shape, written straight in a
llama.cpp preset mix (no f16 intermediate: a 30B f16 file would not fit the disk).

    colibri-bench make-scale --shape qwen3-30b-a3b --preset Q4_K_M [--layers 4] --out FILE [--json F]
    colibri-bench make-scale --measure FILE [--entropy_tokens 256]     (the routing entropy of a file)

Why: every speed and cache figure at the size users bring needs a model of that size, and what a
cache can do depends on how evenly the router spreads tokens over the experts. So the file is
shape-faithful (llama-bench reads it as the real architecture and size), its routers are balanced,
and the routing entropy of each layer is measured on the written file and reported beside it.

The mix: each tensor gets the type llama.cpp's llama-quantize gives it. The rules followed are
llama_tensor_get_type / llama_tensor_get_type_impl in llama.cpp's src/llama-quant.cpp (use_more_bits
for attn_v and ffn_down, the output head at Q6_K, the 8-expert rules, the fallback for rows that do
not divide into 256), as engine/convert/kquant_export.preset_type restates them, plus its
tensor_allows_quantization: 1-D tensors, *_norm.weight and ffn_gate_inp.weight stay as
convert_hf_to_gguf.py wrote them (F32). tests/test_scale_models.py holds the plan to what the real
llama-quantize does on a small f16 file of the same architecture.

The data: blocks of the target type quantized once from N(0, 1/fan_in) floats (a pool per type and
fan-in), then drawn at random for every block of every tensor, so each expert differs, every scale
is finite and a projection keeps its input's magnitude. Norms are ones; routers are random rows of
equal norm (no expert favoured by its row's length).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import quant
from engine.convert import kquant_export as K


@dataclass(frozen=True)
class MoeShape:
    """A model's hyper-parameters as its Hugging Face config.json states them."""
    arch: str  # general.architecture (the key of LAYOUTS)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    expert_rows: int  # moe_intermediate_size
    top_k: int
    vocab: int
    rope_theta: float
    rms_eps: float
    context: int
    dense_rows: int = 0  # intermediate_size (metadata only for an all-MoE model)
    shared_rows: int = 0  # a shared expert's rows (Qwen3.5/3.6)
    tied: bool = False


# Qwen/Qwen3-30B-A3B config.json. Not built yet (they need their own LAYOUTS rows): Qwen3.5/3.6-35B-A3B
# (qwen35moe: Gated DeltaNet and full-attention layers, 40 layers, 256 experts of 512 rows, top-8, a
# shared expert) and gpt-oss-20b (gpt-oss: 24 layers, 32 experts top-4, sliding-window layers, MXFP4).
SHAPES = {
    "qwen3-30b-a3b": MoeShape("qwen3moe", layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128,
                              experts=128, expert_rows=768, top_k=8, vocab=151936, rope_theta=1e6,
                              rms_eps=1e-6, context=40960, dense_rows=6144),
}


# --- the tensors of each architecture (GGUF names, numpy-order shapes, file order) -------------

def _qwen3moe(s: MoeShape, layers: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    D, q, kv, E, F = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.experts, s.expert_rows
    yield "token_embd.weight", (s.vocab, D)
    for i in range(layers):
        b = f"blk.{i}."
        yield from ((b + "attn_norm.weight", (D,)), (b + "attn_q.weight", (q, D)), (b + "attn_k.weight", (kv, D)),
                    (b + "attn_v.weight", (kv, D)), (b + "attn_output.weight", (D, q)),
                    (b + "attn_q_norm.weight", (s.head_dim,)), (b + "attn_k_norm.weight", (s.head_dim,)),
                    (b + "ffn_norm.weight", (D,)), (b + "ffn_gate_inp.weight", (E, D)),
                    (b + "ffn_gate_exps.weight", (E, F, D)), (b + "ffn_down_exps.weight", (E, D, F)),
                    (b + "ffn_up_exps.weight", (E, F, D)))
    yield "output_norm.weight", (D,)
    if not s.tied:
        yield "output.weight", (s.vocab, D)


LAYOUTS = {"qwen3moe": _qwen3moe}
KEPT = ("ffn_gate_inp.weight",)  # matrices llama-quantize never quantizes (F32 from the converter)
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@dataclass(frozen=True)
class Planned:
    name: str
    shape: tuple[int, ...]  # numpy order: (..., row length)
    qtype: str  # engine.quant name

    @property
    def nbytes(self) -> int:
        return quant.get(self.qtype).nbytes(self.shape)

    @property
    def params(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def plan(s: MoeShape, preset: str, layers: int | None = None) -> list[Planned]:
    """Every tensor with the type llama-quantize `preset` gives it (preset F16: what
    convert_hf_to_gguf.py --outtype f16 writes, the quantizer's input)."""
    if s.arch not in LAYOUTS:
        raise ValueError(f"no tensor layout for architecture {s.arch!r} (have: {', '.join(LAYOUTS)})")
    p = preset.lower()
    if p != "f16" and p not in K.PRESETS:
        raise ValueError(f"preset {preset!r} is not one this maker writes (F16, {', '.join(K.PRESETS).upper()})")
    n = layers or s.layers
    out = []
    for name, shape in LAYOUTS[s.arch](s, n):
        if len(shape) == 1 or name.endswith(KEPT):
            t = "f32"
        elif p == "f16":
            t = "f16"
        else:
            t = K.preset_type(name, shape, p, n, s.experts, s.tied)
        out.append(Planned(name, shape, t))
    return out


def totals(s: MoeShape, preset: str, layers: int | None = None) -> dict:
    """Tensor bytes (llama-bench's "size"), parameters, and those a token uses (top_k of the experts)."""
    p = plan(s, preset, layers)
    expert = sum(t.params for t in p if any(e in t.name for e in EXPERT_TENSORS))
    params = sum(t.params for t in p)
    return {"layers": layers or s.layers, "tensor_bytes": sum(t.nbytes for t in p), "params": params,
            "active_params": params - expert + expert * s.top_k // s.experts}


# --- tokenizer metadata (llama.cpp's byte-level BPE loader needs tokens, types and merges) -----

def _byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the rest are
    shifted above 255, so that every token is a printable string."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(shifted)) for b in range(256)]


SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen's, last in the list here


def vocab(n: int) -> tuple[list[str], list[int], list[str]]:
    """`n` distinct tokens (the 256 bytes, pairs of them with a merge each, then triples) ending in
    SPECIALS: tokens, token types (1 normal, 3 control), merges."""
    if n < 256 + len(SPECIALS):
        raise ValueError(f"a byte-level vocabulary needs at least {256 + len(SPECIALS)} tokens, not {n}")
    a = _byte_alphabet()
    room = n - 256 - len(SPECIALS)
    pairs = [(x, y) for x in a for y in a][:room]
    triples = (x + y + z for x in a for y in a for z in a)
    rest = [next(triples) for _ in range(room - len(pairs))]
    tokens = [*a, *(x + y for x, y in pairs), *rest, *SPECIALS]
    return tokens, [1] * (n - len(SPECIALS)) + [3] * len(SPECIALS), [f"{x} {y}" for x, y in pairs]


def _metadata(w, s: MoeShape, layers: int, preset: str, name: str) -> None:
    import gguf
    a = s.arch
    w.add_string("general.name", name)
    w.add_uint32("general.file_type", int(gguf.LlamaFileType[f"MOSTLY_{preset.upper()}"]))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    for key, v in (("context_length", s.context), ("embedding_length", s.hidden), ("block_count", layers),
                   ("feed_forward_length", s.dense_rows or s.expert_rows), ("attention.head_count", s.heads),
                   ("attention.head_count_kv", s.kv_heads), ("attention.key_length", s.head_dim),
                   ("attention.value_length", s.head_dim), ("expert_count", s.experts),
                   ("expert_used_count", s.top_k), ("expert_feed_forward_length", s.expert_rows)):
        w.add_uint32(f"{a}.{key}", v)
    w.add_float32(f"{a}.rope.freq_base", s.rope_theta)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", s.rms_eps)
    tokens, types, merges = vocab(s.vocab)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    eot, eos = s.vocab - 3, s.vocab - 1
    w.add_uint32("tokenizer.ggml.eos_token_id", eos)
    w.add_uint32("tokenizer.ggml.padding_token_id", eot)
    w.add_uint32("tokenizer.ggml.bos_token_id", eot)
    w.add_bool("tokenizer.ggml.add_bos_token", False)


# --- the data ------------------------------------------------------------------------------------

POOL_BLOCKS = 1 << 13  # distinct blocks a (type, fan-in) pool holds
CHUNK_BYTES = 32 << 20  # written at a time: memory stays flat whatever the tensor's size


class _Blocks:
    """Stored blocks of each (type, fan-in), quantized once and drawn at random afterwards."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.pools = rng, {}

    def pool(self, t: quant.QuantType, fan_in: int) -> np.ndarray:
        key = (t.name, fan_in)
        if key not in self.pools:
            x = self.rng.standard_normal((POOL_BLOCKS, t.block_size), dtype=np.float32) / np.float32(np.sqrt(fan_in))
            self.pools[key] = K.quantize(x, t).reshape(POOL_BLOCKS, t.type_size)
        return self.pools[key]

    def rows(self, p: Planned, rows: int) -> np.ndarray:
        """`rows` rows of `p` as stored: random blocks, or (f16/f32) N(0, 1/fan_in) values, ones for
        a norm, equal-norm rows for a router."""
        t, n = quant.get(p.qtype), p.shape[-1]
        if len(p.shape) == 1:
            return np.ones(p.shape, np.float32)
        if p.name.endswith(KEPT):
            r = self.rng.standard_normal((rows, n), dtype=np.float32)
            return r / np.linalg.norm(r, axis=1, keepdims=True)  # logits ~ N(0, 1) for an RMS-1 input
        if not t.is_block:
            return (self.rng.standard_normal((rows, n), dtype=np.float32) / np.float32(np.sqrt(n))).astype(t.storage)
        idx = self.rng.integers(0, POOL_BLOCKS, rows * (n // t.block_size), dtype=np.int32)
        return np.take(self.pool(t, n), idx, axis=0).reshape(rows, t.row_bytes(n))


def make(s: MoeShape, preset: str, out: Path, layers: int | None = None, seed: int = 0,
         name: str = "colibri-bench random") -> dict:
    """Write the GGUF tensor by tensor; returns its figures (bytes, params, seconds)."""
    import gguf
    n = layers or s.layers
    p = plan(s, preset, n)
    t0 = time.perf_counter()
    w = gguf.GGUFWriter(out, s.arch)
    _metadata(w, s, n, preset, name)
    for t in p:
        q = quant.get(t.qtype)
        if q.is_block:
            w.add_tensor_info(t.name, q.stored_shape(t.shape), np.dtype(np.uint8), t.nbytes, gguf.GGMLQuantizationType(q.type_id))
        else:
            w.add_tensor_info(t.name, t.shape, q.storage, t.nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    w.write_padding(f, f.tell())
    blocks = _Blocks(np.random.default_rng(seed))
    with ThreadPoolExecutor(1) as disk:  # one writer, in order: the next chunk is drawn while one is written
        queued: deque = deque()

        def put(fn, *a) -> None:
            if len(queued) > 1:
                queued.popleft().result()
            queued.append(disk.submit(fn, *a))
        for t in p:
            total = int(np.prod(t.shape[:-1], dtype=np.int64)) if len(t.shape) > 1 else 1
            step = max(1, CHUNK_BYTES // max(1, t.nbytes // total))
            for a in range(0, total, step):
                put(f.write, memoryview(np.ascontiguousarray(blocks.rows(t, min(step, total - a)))).cast("B"))
            put(w.write_padding, f, t.nbytes)
        for q in queued:
            q.result()
    f.flush()
    os.fsync(f.fileno())
    w.close()
    seconds = time.perf_counter() - t0
    size = out.stat().st_size
    return {"path": str(out), "arch": s.arch, "preset": preset.upper(), "file_bytes": size,
            **totals(s, preset, n), "write_s": round(seconds, 2), "write_gb_s": round(size / seconds / 1e9, 3),
            "types": {q: sum(1 for t in p if t.qtype == q) for q in sorted({t.qtype for t in p})}}


# --- routing entropy, measured on the written file -----------------------------------------------

def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def routing_entropy(path: Path, tokens: int = 256, seed: int = 1,
                    progress: Callable[[int, float], None] | None = None) -> dict:
    """Per layer, the normalised entropy of the expert-use histogram (1.0: every expert picked
    equally often) of `tokens` random tokens, each run as a one-token sequence through the file's
    own weights (read with Colibri's GGUF reader): at one position attention is exactly
    o_proj(v_proj(x)), so the hidden state each router sees is the model's own, the experts'
    outputs and the residual stream included. Beside it: the busiest expert's share against the
    uniform share (max_share), and the entropy uniform picks of the same count reach (`uniform`),
    which a finite sample keeps below 1. `progress(layer, entropy)` follows a long run."""
    from engine.convert.gguf_file import GGUFModel
    m = GGUFModel(Path(path))
    try:
        if m.fields.get("general.architecture") not in LAYOUTS:
            raise ValueError(f"{path}: the routing measure runs {', '.join(LAYOUTS)} blocks, not "
                             f"{m.fields.get('general.architecture')!r}")
        cfg, ts = m.config(), m.tensors

        def deq(name: str, expert: int | None = None) -> np.ndarray:
            t = ts[name] if expert is None else ts[name].expert(expert)
            return quant.dequantize(t.read(), t.qtype).astype(np.float32, copy=False)

        L, E, k, eps, hd = cfg.num_layers, cfg.num_experts, cfg.top_k, cfg.rms_norm_eps, cfg.head_dim
        group = cfg.num_heads // cfg.num_kv_heads
        rng = np.random.default_rng(seed)
        emb = ts["token_embd.weight"]
        x = np.stack([quant.dequantize(emb.read(i, i + 1), emb.qtype)[0] for i in rng.integers(0, emb.rows, tokens)])
        entropy, max_share = [], []
        for i in range(L):
            b = f"blk.{i}."
            v = _rms(x, deq(b + "attn_norm.weight"), eps) @ deq(b + "attn_v.weight").T
            v = np.repeat(v.reshape(tokens, -1, hd), group, axis=1).reshape(tokens, -1)  # q head h reads kv head h // group
            x = x + v @ deq(b + "attn_output.weight").T
            h = _rms(x, deq(b + "ffn_norm.weight"), eps)
            logits = h @ deq(b + "ffn_gate_inp.weight").T
            pick = np.argsort(-logits, axis=1, kind="stable")[:, :k]  # a tie goes to the lower index
            top = np.take_along_axis(logits, pick, axis=1)
            gate = np.exp(top - top.max(axis=1, keepdims=True))
            gate /= gate.sum(axis=1, keepdims=True)  # softmax, then the top-k renormalised (norm_topk_prob)
            y = np.zeros_like(x)
            for e in np.unique(pick):
                rows, slot = np.nonzero(pick == e)
                g, u = h[rows] @ deq(b + "ffn_gate_exps.weight", e).T, h[rows] @ deq(b + "ffn_up_exps.weight", e).T
                y[rows] += gate[rows, slot, None] * ((g / (1 + np.exp(-g)) * u) @ deq(b + "ffn_down_exps.weight", e).T)
            x = x + y
            entropy.append(_entropy(pick, E))
            if progress:
                progress(i, entropy[-1])
            max_share.append(round(float(np.bincount(pick.ravel(), minlength=E).max() * E / pick.size), 2))
    finally:
        m.close()
    uniform = _entropy(np.argsort(rng.random((tokens, E)), axis=1)[:, :k], E)
    return {"tokens": tokens, "per_layer": entropy, "min": min(entropy), "mean": round(float(np.mean(entropy)), 4),
            "uniform": uniform, "max_share": max_share, "residual_rms": round(float(np.sqrt(np.mean(x * x))), 3)}


def _entropy(pick: np.ndarray, experts: int) -> float:
    p = np.bincount(pick.ravel(), minlength=experts) / pick.size
    p = p[p > 0]
    return round(float(-(p * np.log(p)).sum() / np.log(experts)), 4)


# --- the command -----------------------------------------------------------------------------------

def add_parser(sub) -> None:
    p = sub.add_parser("make-scale", help="a random-weight GGUF of a real MoE's shape in a llama.cpp preset mix")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    p.add_argument("--preset", default="Q4_K_M", help=f"F16 or a llama.cpp preset: {', '.join(K.PRESETS).upper()}")
    p.add_argument("--layers", type=int, help="fewer layers for a quick run (default: the model's own count)")
    p.add_argument("--out", type=Path, help="the GGUF to write")
    p.add_argument("--measure", type=Path, metavar="GGUF", help="write nothing: measure this file's routing "
                   "entropy (one this command wrote, or any qwen3moe GGUF)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--entropy_tokens", type=int, default=256, help="random tokens routed to measure the "
                   "entropy (0: skip)")
    p.add_argument("--json", type=Path, help="also write the figures as JSON")
    p.set_defaults(func=main)


def _measure(path: Path, tokens: int) -> dict:
    t0 = time.perf_counter()
    ent = routing_entropy(path, tokens, progress=lambda i, e: print(f"  layer {i}: routing entropy {e}", flush=True))
    ent["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"routing entropy over {ent['tokens']} random tokens (1.0 = uniform): min {ent['min']}, "
          f"mean {ent['mean']} (uniform picks of that count: {ent['uniform']}); busiest expert x uniform share, "
          f"per layer: {ent['max_share']}")
    return ent


def main(args: argparse.Namespace) -> int:
    if args.measure:
        result = {"path": str(args.measure), "routing_entropy": _measure(args.measure, args.entropy_tokens or 256)}
        if args.json:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
        return 0
    if args.out is None:
        raise SystemExit("make-scale: --out FILE (the GGUF to write) or --measure GGUF")
    s = SHAPES[args.shape]
    full = totals(s, args.preset)
    print(f"{args.shape} {args.preset.upper()}, full size ({s.layers} layers): {full['tensor_bytes'] / 1e9:.2f} GB "
          f"of tensors, {full['params'] / 1e9:.2f} B parameters, {full['active_params'] / 1e9:.2f} B active")
    result = {"shape": args.shape, "full": full, **make(s, args.preset, args.out, args.layers, args.seed,
                                                      name=f"{args.shape} random ({args.preset.upper()})")}
    print(f"wrote {args.out}: {result['layers']} layers, {result['file_bytes'] / 1e9:.2f} GB in {result['write_s']} s "
          f"({result['write_gb_s']} GB/s), types {result['types']}")
    if args.entropy_tokens:
        result["routing_entropy"] = _measure(args.out, args.entropy_tokens)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0
