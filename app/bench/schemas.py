"""colibri-bench schemas: replies held to JSON schemas through colibri-serve, and what the mask costs.

    colibri-bench schemas [--model FOLDER] [--max_tokens 1024] [--threads 2] [--json FILE]

Each schema of app/bench/schema_set.py is asked for through the real server and the official
openai client, streamed, with response_format json_schema (strict): the reply is valid when it
parses and validates (jsonschema). Then the same request without response_format, cut at the
constrained reply's length: the time per token of each (first to last streamed token) gives the
decode cost of the mask (their ratio, median over the schemas). Greedy, so a rerun gives the same
text. A reply still inside its schema at --max_tokens (a small model repeating inside an unbounded
string) counts as not valid, and as "cut".
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SYSTEM = "You answer with JSON only."


def _ask(client, model: str, messages: list[dict], max_tokens: int, response_format: dict | None) -> dict:
    """One streamed reply: its text, finish reason, tokens and its time per token (first to last streamed)."""
    extra = {"response_format": response_format} if response_format else {}
    times, text, finish, tokens = [], "", None, 0
    for c in client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, **extra):
        if c.usage is not None:
            tokens = c.usage.completion_tokens
        if c.choices and c.choices[0].delta.content:
            times.append(time.perf_counter())
            text += c.choices[0].delta.content
        if c.choices and c.choices[0].finish_reason:
            finish = c.choices[0].finish_reason
    # per token, not per chunk: a chunk waits for whole characters (an emoji is several byte tokens)
    gap = (times[-1] - times[0]) / (tokens - 1) if len(times) > 2 and tokens > 2 else None
    return {"text": text, "finish": finish, "tokens": tokens, "gap_s": gap}


def _valid(text: str, schema: dict) -> str | None:
    """None when `text` is JSON that validates against `schema`, else why not."""
    import jsonschema
    try:
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    except json.JSONDecodeError as e:
        return f"not JSON: {e}"
    except jsonschema.ValidationError as e:
        return f"invalid: {e.message}"
    return None


def run(model: Path, threads: int, max_tokens: int) -> dict:
    import openai

    from app import server
    from app.bench.schema_set import SCHEMAS
    from engine.api import Engine
    eng = Engine(model, threads=threads, context_length=2048)
    handle = server.start(eng, "127.0.0.1", 0)
    try:
        if not handle.service.scheduler.warmed.wait(900):
            raise SystemExit("the server did not warm up in 900 s")
        client = openai.OpenAI(base_url=handle.url, api_key="unused", max_retries=0, timeout=900)
        rows = []
        _ask(client, handle.model_id, [{"role": "user", "content": "Hi"}], 8, {"type": "json_object"})  # the
        # tokenizer view is built on the first constrained request, the thread tuner settles: not measured
        for name, what, schema in SCHEMAS:
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"Give {what} as JSON matching this schema: {json.dumps(schema)}"}]
            fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
            held = _ask(client, handle.model_id, messages, max_tokens, fmt)
            free = _ask(client, handle.model_id, messages, max(held["tokens"], 4), None)
            why = _valid(held["text"], schema)
            ratio = held["gap_s"] / free["gap_s"] if held["gap_s"] and free["gap_s"] else None
            rows.append({"schema": name, "valid": why is None, "why": why, "finish": held["finish"],
                         "tokens": held["tokens"], "text": held["text"], "held_ms_per_token": (held["gap_s"] or 0) * 1e3,
                         "free_ms_per_token": (free["gap_s"] or 0) * 1e3, "free_tokens": free["tokens"], "ratio": ratio})
            print(f"{name:>16}: {'valid' if why is None else why[:60]:<12} {held['tokens']:>4} tok  "
                  f"{rows[-1]['held_ms_per_token']:6.1f} vs {rows[-1]['free_ms_per_token']:6.1f} ms/token  {held['text'][:70]!r}",
                  flush=True)
    finally:
        handle.stop()
        eng.close()
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    return {"schemas": len(rows), "valid": sum(r["valid"] for r in rows),
            "cut": sum(r["finish"] == "length" for r in rows),  # still inside the grammar at max_tokens
            "valid_share": sum(r["valid"] for r in rows) / len(rows),
            "median_ratio": statistics.median(ratios) if ratios else None,
            "median_held_ms_per_token": statistics.median(r["held_ms_per_token"] for r in rows),
            "median_free_ms_per_token": statistics.median(r["free_ms_per_token"] for r in rows), "rows": rows}


def main(args: argparse.Namespace) -> int:
    from app.bench.report import describe_machine, machine, stamp
    from app.model_library import ensure_default_model
    model = Path(args.model) if args.model else ensure_default_model()
    print(f"machine: {describe_machine(machine())}; {args.threads} threads; model: {model.name}")
    out = run(model, args.threads, args.max_tokens) | {"machine": machine(), "model": model.name,
                                                         "threads": args.threads} | stamp()
    cost = out["median_ratio"]
    print(f"schema-valid: {out['valid']}/{out['schemas']} ({out['valid_share']:.0%}), {out['cut']} cut at "
          f"--max_tokens {args.max_tokens}; decode with the mask: "
          f"{out['median_held_ms_per_token']:.1f} ms/token, without: {out['median_free_ms_per_token']:.1f} (median); "
          f"cost {'-' if cost is None else f'{(cost - 1) * 100:+.1f}%'} (median of per-schema ratios)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("schemas", help="replies held to 50+ JSON schemas through colibri-serve: share valid, "
                                       "decode cost of the mask")
    p.add_argument("--model", help="a converted model folder (default: the default model)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max_tokens", type=int, default=1024)
    p.add_argument("--json", help="also write the results to this file")
    p.set_defaults(func=main)
