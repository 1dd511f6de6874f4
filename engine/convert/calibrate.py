"""Calibration for importance-weighted rounding (colibri-convert --calibration_data FILE).

Why: a weight's rounding error costs in proportion to the energy of the activation it multiplies.
The text is run through the source model (float32 numpy, layer by layer, weights dequantized one
layer at a time) and, for each matrix, the mean squared activation of each input column is kept,
as llama.cpp's llama-imatrix does. Experts no calibration token is routed to get no entry (the
summary says how many). Covered: the Llama-family shapes ModelConfig describes, dense or softmax
top-k MoE with a shared expert (plain RoPE: the statistics need the activations' sizes, not the
last digit). Layout: hidden states h (C chunks, T tokens, D), weights (out, in) as stored.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from engine import quant
from engine.arch import spec
from engine.errors import ConversionError
from engine.model_dir import ModelConfig

log = logging.getLogger("colibri.calibrate")
CTX = 512  # tokens per chunk, as llama-imatrix's default
MAX_TOKENS = 32 * CTX
CACHE: dict[tuple, "Calibration"] = {}  # (source, text) identity -> result, for this process


def cache_key(source: Path, text: str | Path) -> tuple:
    """Which source and text (path, size, mtime of each): a changed file is a new calibration."""
    def ident(p: str | Path) -> tuple:
        p = Path(p).expanduser().resolve()
        st = p.stat()
        return str(p), st.st_size, st.st_mtime_ns
    try:
        return ident(source) + ident(text)
    except OSError:
        return (object(),)  # unreadable: never a hit (the read reports the error)


@dataclass
class Calibration:
    energies: dict[str, np.ndarray]  # tensor name -> mean squared input activation per column (n,)
    tokens: int
    chunks: int
    unrouted: list[str] = field(default_factory=list)  # expert matrices no token reached
    expert_matrices: int = 0

    def summary(self) -> dict:
        return {"tokens": self.tokens, "chunks": self.chunks, "weighted_matrices": len(self.energies),
                "expert_matrices": self.expert_matrices, "unrouted_expert_matrices": len(self.unrouted)}

    def describe(self) -> str:
        s = (f"calibration: {self.tokens} tokens in {self.chunks} chunks; "
             f"{len(self.energies)} matrices importance-weighted")
        if self.expert_matrices:
            s += (f"; {len(self.unrouted)} of {self.expert_matrices} expert matrices never routed to "
                  f"(rounded from their weights alone)")
        return s


def token_chunks(text: str, tokenizer_json: str, bos_id: int | None, ctx: int = CTX,
                 max_tokens: int = MAX_TOKENS) -> list[np.ndarray]:
    """The text tokenized once, cut into chunks of `ctx` tokens (BOS first where the model uses
    one, as llama-imatrix does); a text shorter than one chunk is one short chunk."""
    from tokenizers import Tokenizer
    ids = Tokenizer.from_str(tokenizer_json).encode(text, add_special_tokens=False).ids[:max_tokens]
    if len(ids) < 16:
        raise ConversionError(f"calibration text has {len(ids)} tokens; give at least a paragraph")
    n = max(1, len(ids) // ctx)
    size = min(ctx, len(ids))
    chunks = [np.array(ids[i * size:(i + 1) * size], np.int64) for i in range(n)]
    if bos_id is not None:
        for c in chunks:
            c[0] = bos_id
    return chunks


def read_text(path: str | Path) -> str:
    p = Path(path).expanduser()
    try:
        return p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConversionError(f"--calibration_data {p}: {e.strerror or e}") from e


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))).astype(np.float32) * w


def _rope_tables(cfg: ModelConfig, T: int, factors: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    hd = cfg.head_dim
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    if factors is not None:
        inv = inv / factors
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    # x (T, H, hd), Hugging Face order: the first half of each head pairs with the second
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int | None) -> np.ndarray:
    # q (T, H, hd), k/v (T, Hkv, hd) -> (T, H * hd), causal
    T, H, hd = q.shape
    rep = H // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    qh, kh, vh = (np.ascontiguousarray(a.transpose(1, 0, 2)) for a in (q, k, v))  # (H, T, hd)
    s = np.stack([a @ b.T for a, b in zip(qh, kh)]) / np.float32(np.sqrt(hd))  # (H, T, T); 2-D BLAS per head
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    mask = j > i
    if window:
        mask |= j <= i - window
    s = np.where(mask[None], np.float32(-np.inf), s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.stack([a @ b for a, b in zip(p, vh)]).transpose(1, 0, 2).reshape(T, H * hd).astype(np.float32)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1) + np.exp(-x))


class _Energy:
    def __init__(self) -> None:
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}

    def add(self, names: tuple[str, ...], x: np.ndarray) -> None:
        x = x.reshape(-1, x.shape[-1]).astype(np.float64)
        s = np.einsum("ti,ti->i", x, x)
        for n in names:
            self.sums[n] = self.sums.get(n, 0) + s
            self.counts[n] = self.counts.get(n, 0) + x.shape[0]

    def means(self) -> dict[str, np.ndarray]:
        return {n: (s / self.counts[n]).astype(np.float32) for n, s in self.sums.items()}


def collect(read: Callable[[str], np.ndarray], cfg: ModelConfig, chunks: list[np.ndarray],
            has: Callable[[str], bool] = lambda n: True,
            progress: Callable[[int, int], None] | None = None) -> Calibration:
    """Run `chunks` through the model whose float32 weights `read(name)` gives; the energies of every
    matrix's inputs. All chunks pass a layer together (its weights dequantized once); `progress(layers
    done, layers)` after each layer, `has(name)`: whether an optional tensor exists."""
    if cfg.qk_norm not in ("none", "head", "full"):
        raise ConversionError(f"calibration does not know qk_norm {cfg.qk_norm!r}")
    E = _Energy()
    emb = read("token_embd.weight")
    h = np.stack([emb[c] for c in chunks]).astype(np.float32)  # (C, T, D)
    out_w = emb if cfg.tie_word_embeddings else None
    del emb
    C, T, D = h.shape
    factors = read("rope_freqs.weight") if cfg.rope_freq_factors else None
    cos, sin = _rope_tables(cfg, T, factors)
    hd, H, Hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    eps = cfg.rms_norm_eps
    unrouted: list[str] = []
    renorm = spec(cfg.architecture).renormalises(cfg)
    for L in range(cfg.num_layers):
        b = f"blk.{L}."
        x = _rmsnorm(h, read(b + "attn_norm.weight"), eps)
        E.add((b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"), x)
        proj = {}
        for part in ("q", "k", "v"):
            y = x @ read(f"{b}attn_{part}.weight").T
            if cfg.attention_bias:
                y = y + read(f"{b}attn_{part}.bias")
            if cfg.clip_qkv:
                y = np.clip(y, -cfg.clip_qkv, cfg.clip_qkv)
            proj[part] = y.astype(np.float32)
        q, k, v = proj["q"], proj["k"], proj["v"]
        if cfg.qk_norm == "full":
            q, k = _rmsnorm(q, read(b + "attn_q_norm.weight"), eps), _rmsnorm(k, read(b + "attn_k_norm.weight"), eps)
        q, k, v = q.reshape(C, T, H, hd), k.reshape(C, T, Hkv, hd), v.reshape(C, T, Hkv, hd)
        if cfg.qk_norm == "head":
            q, k = _rmsnorm(q, read(b + "attn_q_norm.weight"), eps), _rmsnorm(k, read(b + "attn_k_norm.weight"), eps)
        att = np.stack([_attention(_rope(q[c], cos, sin), _rope(k[c], cos, sin), v[c], cfg.sliding_window)
                        for c in range(C)])
        E.add((b + "attn_output.weight",), att)
        h = h + att @ read(b + "attn_output.weight").T
        x = _rmsnorm(h, read(b + "ffn_norm.weight"), eps).reshape(C * T, D)
        if cfg.is_moe:
            logits = x @ read(b + "ffn_gate_inp.weight").T
            p = np.exp(logits - logits.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            top = np.argsort(-p, axis=-1, kind="stable")[:, :cfg.top_k]
            wts = np.take_along_axis(p, top, axis=-1)
            if renorm:
                wts /= wts.sum(axis=-1, keepdims=True)
            out = np.zeros_like(x)
            for e in range(cfg.num_experts):
                names = [f"{b}ffn_{part}.{e}.weight" for part in ("gate", "up", "down")]
                rows, slot = np.nonzero(top == e)
                if rows.size == 0:
                    unrouted += names
                    continue
                out[rows] += wts[rows, slot][:, None] * _mlp(E, x[rows], read, names)
            if has(b + "ffn_gate_inp_shexp.weight"):
                w = read(b + "ffn_gate_inp_shexp.weight").reshape(-1)  # (1, D) or (D,): one gate logit
                g = 1 / (1 + np.exp(-(x @ w)))
                shared = [f"{b}ffn_{part}_shexp.weight" for part in ("gate", "up", "down")]
                out += g[:, None].astype(np.float32) * _mlp(E, x, read, shared)
        else:
            out = _mlp(E, x, read, [f"{b}ffn_{part}.0.weight" for part in ("gate", "up", "down")])
        h = h + out.reshape(C, T, D)
        if progress:
            progress(L + 1, cfg.num_layers)
    x = _rmsnorm(h, read("output_norm.weight"), eps)
    E.add(("token_embd.weight" if out_w is not None else "output.weight",), x)
    experts = 3 * cfg.num_experts * cfg.num_layers if cfg.is_moe else 0
    return Calibration(E.means(), int(C * T), C, unrouted, experts)


def _mlp(E: _Energy, x: np.ndarray, read: Callable[[str], np.ndarray], names: list[str]) -> np.ndarray:
    gate, up, down = names
    E.add((gate, up), x)
    act = (_silu(x @ read(gate).T) * (x @ read(up).T)).astype(np.float32)
    E.add((down,), act)
    return act @ read(down).T


def calibration_of(items: list, cfg: ModelConfig, src, text_path: str | Path,
                   src_path: Path | None = None,
                   progress: Callable[[int, int, int, int], None] | None = None) -> Calibration:
    """Activation energies of every matrix's inputs on the calibration text, for convert()'s plan
    `items` of the source `src`; kept for the process (several targets run the text once)."""
    key = cache_key(src_path, text_path) if src_path is not None else None
    if key in CACHE:
        return CACHE[key]
    by_name = {it.name: it.source for it in items}

    def read(name: str) -> np.ndarray:
        t = by_name[name]
        return quant.dequantize(t.read(), t.qtype).reshape(t.shape)
    meta = src.tokenizer.meta
    bos = meta.get("bos_token_id") if meta.get("add_bos_token") else None
    chunks = token_chunks(read_text(text_path), src.tokenizer.tokenizer_json, bos)
    tokens = sum(len(c) for c in chunks)
    cal = collect(read, cfg, chunks, has=lambda n: n in by_name,
                  progress=(lambda done, total: progress(done, total, len(chunks), tokens)) if progress else None)
    log.info("%s", cal.describe())
    if key is not None:
        CACHE[key] = cal
    return cal


def write_llama_imatrix(cal: Calibration, path: str | Path, num_experts: int = 1) -> Path:
    """The energies as llama.cpp's legacy imatrix file (count, then per entry name, ncall 1, n,
    float32 values), under GGUF tensor names, for llama-quantize --imatrix. Dense models only."""
    import struct
    if num_experts > 1:
        raise ConversionError("an imatrix file for llama.cpp is written for dense models only")
    entries = {n.replace(".0.weight", ".weight"): v for n, v in cal.energies.items()}
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, v in entries.items():
            b = name.encode()
            f.write(struct.pack("<i", len(b)) + b + struct.pack("<ii", 1, v.size))
            f.write(np.ascontiguousarray(v, np.float32).tobytes())
        f.write(struct.pack("<i", 1) + struct.pack("<i", 6) + b"colibr")
    return Path(path)
