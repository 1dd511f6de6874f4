"""colibri-bench routing: an MoE's real routing on text, and cache policies replayed on it.

    colibri-bench routing --model M [--text FILE] [--tokens 2048] [--trace OUT.npz] [--json F]

Runs the model over the text (chunks of 512 tokens from an empty context), records each token's
top-k experts per layer (the trace, saved with --trace for `colibri-bench memory --trace`), and
reports what decides whether streaming experts can beat mmap:
  - the hit rate against cache size (slots per layer) for LRU, a frequency-aware policy (LFU with
    aging), a learned hot set (the hottest experts of the first half's routing pinned, LRU for the
    rest, measured on the second half) and Belady's optimum, all replayed on the same trace, and
    the engine's own policy (one LRU over all layers with as many slots in all: "global_lru");
  - consecutive-token overlap: the share of a token's k experts the previous token also used;
  - one-layer-ahead predictability: the share of layer L+1's picks that layer L+1's router
    picks from layer L's FFN input (what the prefetcher guesses with).
Published figures for real MoEs are printed beside ours (PUBLISHED).
"""
from __future__ import annotations

import argparse
import json
from collections import OrderedDict
from pathlib import Path

import numpy as np

# (model, experts, top_k, what): published per-layer figures to compare against
PUBLISHED = (
    ("OLMoE-1B-7B", 64, 8, "LRU hit rate 27.7% at 8 slots; Belady's optimum 84% at 24 slots"),
    ("Qwen3-30B-A3B", 128, 8, "LRU hit rate 37/74/89/96% at 24/73/146/244 slots"),
    ("several MoEs", 0, 0, "one-layer-ahead routing 72-97% predictable"),
)
POLICIES = ("lru", "lfu", "hot", "belady")  # every miss admitted (Belady's the optimum of these)
# the engine's cache with room to spare: a miss colder than its victim is served from the page cache
# and not admitted (so it can beat Belady-with-admission)
BYPASS_POLICIES = ("lfu_admit",)
LFU_DECAY = 0.98  # per token: a frequency that forgets (half-life about 34 tokens)


# --- recording ---------------------------------------------------------------------------------

def record_trace(model_path: str | Path, text: str, tokens: int = 2048, chunk: int = 512) -> dict:
    """{"ids": (T, L, k) experts picked, "ahead": (T, L-1, k) layer L+1's picks guessed from layer
    L's FFN input by layer L+1's router}, over the first `tokens` tokens of `text`."""
    from engine.api import Engine
    from engine.convert.moefy import ffn_inputs
    eng = Engine(model_path, context_length=chunk, prefetch_window=0, log_level="WARN")
    try:
        cfg = eng.cfg
        if not cfg.is_moe:
            raise ValueError(f"{model_path}: a dense model has no routing (MoEfy it first: colibri-convert --moefy)")
        ids = eng.codec.tok.encode(text, add_special_tokens=False).ids[:tokens]
        L, k = cfg.num_layers, cfg.top_k
        routers = [eng.model.tensor_file(f"router/layer_{i}.bin").dequantize(f"blk.{i}.ffn_gate_inp.weight")
                   for i in range(L)]
        norms = [eng.model.tensor_file(f"attention/layer_{i}.bin").dequantize(f"blk.{i}.ffn_norm.weight")
                 for i in range(L)]
        picks, ahead = [], []
        chunk = min(chunk, eng.context_limit)
        for a in range(0, len(ids), chunk):
            dump: dict = {}
            eng.logits(ids[a:a + chunk], dump=dump)
            picks.append(np.stack([dump[f"blk.{i}.expert_ids"] for i in range(L)], axis=1))
            hs = [ffn_inputs(dump, i, norms[i], cfg.rms_norm_eps) for i in range(L - 1)]
            ahead.append(np.stack([np.argsort(-(hs[i] @ routers[i + 1].T), axis=1)[:, :k] for i in range(L - 1)],
                                  axis=1))
        return {"ids": np.concatenate(picks).astype(np.int16), "ahead": np.concatenate(ahead).astype(np.int16),
                "num_experts": cfg.num_experts}
    finally:
        eng.close()


# --- replaying (pure Python: the reference for the engine's own counters) ----------------------

def _next_use(stream: np.ndarray, n: int) -> np.ndarray:
    """(T, n): for each token, the next token at or after it that uses each expert (T if none)."""
    T = len(stream)
    out = np.full((T + 1, n), T)
    for t in range(T - 1, -1, -1):
        out[t] = out[t + 1]
        out[t, stream[t]] = t
    return out[:T]


def replay(stream: np.ndarray, slots: int, policy: str, n: int, hot: np.ndarray | None = None) -> tuple[int, int]:
    """One layer's picks (T, k) through a cache of `slots` experts: (hits, requests). A token's own
    picks are never evicted for each other. `hot` (policy "hot"): experts pinned from the start."""
    T, k = stream.shape
    if slots < k:
        raise ValueError(f"{slots} slots cannot hold a token's {k} experts")
    cache: OrderedDict[int, None] = OrderedDict()  # least recently used first
    freq = np.zeros(n)
    pinned = {int(e) for e in hot[:slots - k]} if policy == "hot" and hot is not None else set()
    loaded: set[int] = set()
    nxt = _next_use(stream, n) if policy == "belady" else None
    hits = 0
    for t, row in enumerate(stream.tolist()):
        if policy in ("lfu", "lfu_admit"):
            freq *= LFU_DECAY
        for e in row:
            freq[e] += 1
            if e in pinned and e not in loaded:  # a pinned expert's first use loads it (as Belady's)
                loaded.add(e)
                continue
            if e in pinned or e in cache:
                hits += 1
                if e in cache:
                    cache.move_to_end(e)
                continue
            if len(pinned) + len(cache) >= slots:
                if policy in ("lfu", "lfu_admit"):  # the first of the least frequent: LRU among ties
                    victim = min((c for c in cache if c not in row), key=lambda c: freq[c])
                    if policy == "lfu_admit" and freq[e] <= freq[victim]:
                        continue  # served from the page cache for this use; the hotter expert stays
                elif policy == "belady":
                    later = nxt[t + 1] if t + 1 < T else np.full(n, T)
                    victim = max((c for c in cache if c not in row), key=lambda c: later[c])
                else:
                    victim = next(c for c in cache if c not in row)
                del cache[victim]
            cache[e] = None
    return hits, T * k


def hit_curve(ids: np.ndarray, policy: str, slot_counts: list[int], n: int) -> dict[int, float]:
    """Hit rate over all layers for each per-layer cache size. "hot": heat from the first half
    of the trace, replayed on the second half (as a heat table persisted from earlier turns)."""
    T, L, _ = ids.shape
    out = {}
    for s in slot_counts:
        h = r = 0
        for layer in range(L):
            stream = ids[:, layer]
            hot = None
            if policy == "hot":
                heat = np.bincount(stream[:T // 2].ravel(), minlength=n)
                hot, stream = np.argsort(-heat, kind="stable"), stream[T // 2:]
            a, b = replay(stream, s, policy, n, hot)
            h, r = h + a, r + b
        out[s] = h / max(1, r)
    return out


def global_lru_curve(ids: np.ndarray, slot_counts: list[int], n: int) -> dict[int, float]:
    """The engine's own policy: one LRU over every layer's experts, `s` x layers slots in all,
    visiting the layers in order for each token."""
    T, L, k = ids.shape
    stream = (ids + n * np.arange(L)[None, :, None]).reshape(T * L, k)  # (token, layer) -> layer * n + expert
    return {s: replay(stream, s * L, "lru", n * L)[0] / (T * L * k) for s in slot_counts}


def overlap(ids: np.ndarray) -> float:
    """Mean share of a token's k experts (per layer) that the previous token used too."""
    a, b = ids[1:], ids[:-1]
    same = (a[..., :, None] == b[..., None, :]).any(axis=-1)
    return float(same.mean())


def predictability(ids: np.ndarray, ahead: np.ndarray) -> float:
    """Mean share of layer L+1's picks that were guessed one layer ahead."""
    real = ids[:, 1:]
    hit = (real[..., :, None] == ahead[..., None, :]).any(axis=-1)
    return float(hit.mean())


def report(trace: dict) -> dict:
    ids, n = trace["ids"], int(trace["num_experts"])
    k = ids.shape[2]
    slots = list(range(k, n + 1))
    heat = np.stack([np.bincount(ids[:, L].ravel(), minlength=n) for L in range(ids.shape[1])])
    share = heat / heat.sum(axis=1, keepdims=True)
    return {"tokens": int(ids.shape[0]), "layers": int(ids.shape[1]), "experts": n, "top_k": k,
            "hit_rate": {p: hit_curve(ids, p, slots, n) for p in POLICIES + BYPASS_POLICIES} | {"global_lru": global_lru_curve(ids, slots, n)},
            "consecutive_overlap": overlap(ids), "one_layer_ahead": predictability(ids, trace["ahead"]),
            "hottest_share": float(np.sort(share, axis=1)[:, -k:].sum(axis=1).mean()),
            "published": [list(p) for p in PUBLISHED]}


def format_report(r: dict) -> str:
    lines = [f"routing on {r['tokens']} tokens: {r['layers']} layers, top-{r['top_k']} of {r['experts']} experts",
             "hit rate by slots per layer (share of the layer's experts):",
             "  slots   " + "  ".join(f"{p:>10}" for p in r["hit_rate"])]
    for s in r["hit_rate"]["lru"]:
        lines.append(f"  {s:>2} ({s / r['experts']:4.0%})" + "".join(f"  {c[s]:10.1%}" for c in r["hit_rate"].values()))
    lines += [f"consecutive-token overlap {r['consecutive_overlap']:.1%}; one-layer-ahead predictable "
              f"{r['one_layer_ahead']:.1%}; the top-{r['top_k']} hottest experts take {r['hottest_share']:.1%}",
              "published (real MoEs):"] + [f"  {m}: {what}" for m, _, _, what in PUBLISHED]
    return "\n".join(lines)


def add_parser(sub) -> None:
    p = sub.add_parser("routing", help="an MoE's routing on text: hit rate per cache policy, overlap, look-ahead")
    p.add_argument("--model", required=True, help="a Colibri MoE model folder (e.g. one colibri-convert --moefy wrote)")
    p.add_argument("--text", type=Path, help="text to route (default: tests/fixtures/texts/en_python_docs.txt)")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--trace", type=Path, help="save the trace (.npz) for colibri-bench memory --trace")
    p.add_argument("--json", type=Path, help="write the figures as JSON")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    text = args.text or Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "texts" / "en_python_docs.txt"
    trace = record_trace(args.model, text.read_text(encoding="utf-8"), args.tokens)
    if args.trace:
        np.savez_compressed(args.trace, **trace)
    r = report(trace)
    print(format_report(r))
    if args.json:
        args.json.write_text(json.dumps(r, indent=1) + "\n")
    return 0
