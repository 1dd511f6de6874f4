"""colibri-bench spec: speculative decoding (engine.speculative) against plain decoding.

For each model: the decode rate of greedy replies with speculation off and on (ngram, auto), runs
alternating, on prompts that repeat their input (a code edit, a paragraph rewritten, a summary
quoting the text) and on ordinary chat prompts, the same prompts for every row; whether the tokens
are the same; what one verify step of 4 positions costs against one decoded token; and how often a
batched step's argmax differs from the plain decoder's (the near-ties it may flip)."""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

CODE = '''def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for v in values:
        total += (v - m) ** 2
    return total / len(values)
'''
PARAGRAPH = ("The committee met on Tuesday to review the budget for the coming year. After a long discussion it "
             "agreed to fund the new library, to repair the bridge on Mill Street before the winter, and to hire "
             "two more teachers for the primary school. The mayor thanked the volunteers who had organised the "
             "summer festival, which raised more money than in any previous year.")
REPEATING = {
    "code edit": f"Rename the function mean to average everywhere in this code and show the whole code:\n\n{CODE}",
    "rewrite": f"Rewrite this paragraph, keeping every sentence, with 'council' instead of 'committee':\n\n{PARAGRAPH}",
    "summary quoting": f"Quote the first two sentences of this text exactly, then summarise the rest:\n\n{PARAGRAPH}",
}
CHAT = {
    "hello": "Hi! How are you today?",
    "explain": "Explain in a few sentences why the sky is blue.",
    "ideas": "Give me three ideas for a birthday present for my sister who likes hiking.",
}


def add_parser(sub) -> None:
    p = sub.add_parser("spec", help="speculative decoding (n-gram drafts) against plain decoding: rates, "
                                    "identical output, verify cost, near-tie flips")
    p.add_argument("--model", action="append", help="a Colibri model folder (repeatable; default: the default "
                   "model, and the bench MoE where colibri-bench speed built it)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=96, help="tokens per reply")
    p.add_argument("--runs", type=int, default=3, help="runs of each mode per prompt (alternating)")
    p.add_argument("--prompts", choices=("all", "repeating", "chat"), default="all")
    p.add_argument("--json", type=Path, help="write the figures as JSON")
    p.set_defaults(func=main)


def default_models() -> list[str]:
    base = Path.home() / ".cache" / "colibri" / "bench"
    found = [str(p) for p in (base / "colibri-SmolLM2-135M-Instruct.Q4_1", base / "colibri-mixtral-hf-Q4_K_M")
             if (p / "manifest.json").exists()]
    if not found:
        raise SystemExit("no model given and none built: colibri-bench speed --model default builds the default "
                         "one; or pass --model")
    return found


def reply(e, prompt: str, mode: str, tokens: int) -> tuple[list[int], float]:
    """(tokens, decode tok/s) of a greedy reply from an empty conversation."""
    e.reset()
    toks, rate = [], 0.0
    for s in e.generate([{"role": "user", "content": prompt}], temperature=0, max_tokens=tokens, speculative=mode):
        if s.token_id is not None:
            toks.append(s.token_id)
        rate = s.decode_tok_s or rate
    return toks, rate


def rates(e, prompts: dict[str, str], tokens: int, runs: int) -> dict:
    """Per prompt: median decode tok/s of off, ngram and auto (runs alternating), and same tokens."""
    out = {}
    for name, prompt in prompts.items():
        got: dict[str, list[float]] = {"off": [], "ngram": [], "auto": []}
        same = True
        for _ in range(runs):
            ref, _ = None, None
            for mode in got:
                toks, r = reply(e, prompt, mode, tokens)
                got[mode].append(r)
                ref = toks if ref is None else ref
                same &= toks == ref
        med = {m: statistics.median(v) for m, v in got.items()}
        out[name] = {"tok_s": med, "ngram_x": med["ngram"] / med["off"], "auto_x": med["auto"] / med["off"],
                     "same_tokens": same, "tokens": len(ref)}
    return out


def verify_cost(e, positions: int = 4, repeats: int = 15) -> dict:
    """Median seconds of one decoded token and of one verify step of `positions` tokens, on a
    conversation of a short prompt, alternating; the cache put back after each."""
    e.reset()
    ids = e.prompt_ids([{"role": "user", "content": PARAGRAPH}])
    e.forward(ids)
    c, n = e.cache, e.cache.length
    one, many = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        e.decode([ids[-1]], [c])
        one.append(time.perf_counter() - t)
        c.length = n
        t = time.perf_counter()
        e.verify(ids[-positions:], c)
        many.append(time.perf_counter() - t)
        c.length = n
    d, v = statistics.median(one), statistics.median(many)
    out = {"decode_s": d, "verify_s": v, "ratio": v / d, "positions": positions}
    if e.cfg.is_moe:  # the batch union: distinct experts a layer reads for the positions, against top_k for one
        routes: list = []
        with e._lock:
            e.net.forward(np.asarray(ids[-positions:], np.int64), c, n, all_logits=True, routes=routes)
            c.length = n
        out["experts_per_layer"] = float(np.mean([len(np.unique(r)) for _, r in routes]))
        out["top_k"] = e.cfg.top_k
    return out


def flips(e, prompts: dict[str, str], tokens: int, width: int = 5) -> dict:
    """Positions where a batched step's argmax differs from the plain greedy token (teacher-forced
    over each plain reply in steps of `width`), out of all positions compared."""
    diff = total = 0
    for prompt in prompts.values():
        toks, _ = reply(e, prompt, "off", tokens)
        e.reset()
        e.forward(e.prompt_ids([{"role": "user", "content": prompt}]))
        for a in range(0, len(toks) - width, width):
            logits = e.verify(toks[a:a + width], e.cache)
            e.cache.length += width - 1  # the whole chunk is kept: the next one follows it
            e.tokens += toks[a:a + width]
            pred = np.argmax(logits, axis=-1)
            diff += int((pred[:-1] != np.asarray(toks[a + 1:a + width])).sum())
            total += width - 1
    return {"flipped": diff, "positions": total}


def show(kind: str, name: str, row: dict) -> None:
    t = row["tok_s"]
    print(f"{kind:9} {name:16} off {t['off']:6.1f}  ngram {t['ngram']:6.1f} ({row['ngram_x']:.2f}x)  "
          f"auto {t['auto']:6.1f} ({row['auto_x']:.2f}x)  same tokens: {row['same_tokens']} "
          f"({row['tokens']} tokens)", flush=True)


def main(args: argparse.Namespace) -> int:
    from engine.api import Engine
    results = {}
    sets = {"repeating": REPEATING, "chat": CHAT}
    sets = {k: v for k, v in sets.items() if args.prompts in (k, "all")}
    for path in args.model or default_models():
        with Engine(path, threads=args.threads) as e:
            e.warmup()
            print(f"== {Path(path).name} ({e.cfg.architecture}, {e.cfg.num_experts} experts), "
                  f"{args.threads} threads", flush=True)
            r: dict = {"verify": verify_cost(e)}
            v = r["verify"]
            print(f"verify {v['positions']} positions: {v['verify_s'] * 1e3:.1f} ms against one decoded token "
                  f"{v['decode_s'] * 1e3:.1f} ms ({v['ratio']:.2f}x)" + (
                      f"; experts read per layer {v['experts_per_layer']:.2f} against {v['top_k']} for one token"
                      if "top_k" in v else ""), flush=True)
            for kind, prompts in sets.items():
                r[kind] = {}
                for name, prompt in prompts.items():
                    r[kind][name] = rates(e, {name: prompt}, args.tokens, args.runs)[name]
                    show(kind, name, r[kind][name])
                xs = [row["ngram_x"] for row in r[kind].values()]
                ys = [row["auto_x"] for row in r[kind].values()]
                print(f"{kind:9} median over prompts: ngram {statistics.median(xs):.2f}x, "
                      f"auto {statistics.median(ys):.2f}x", flush=True)
            r["flips"] = f = flips(e, {n: p for s in sets.values() for n, p in s.items()}, args.tokens)
            print(f"near-tie flips of a batched step: {f['flipped']} of {f['positions']} positions", flush=True)
            r["speculative"] = e.stats().speculative
        results[str(path)] = r
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0
