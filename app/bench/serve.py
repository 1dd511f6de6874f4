"""colibri-bench serve: colibri-serve under load, beside llama.cpp's llama-server on the same GGUF.

    colibri-bench serve [--gguf FILE] [--clients 1,2,4,8,16] [--requests 2 | --duration 120]
                        [--max_tokens 48] [--no_llama] [--soak 1000] [--json FILE]
                        [--experts MODEL [--expert_clients 8]]

Each server runs in its own process (its RSS is its own). For each number of concurrent
streaming clients (the official openai client, one thread each) it reports throughput (completion
tokens per second of wall time), p50/p99 time to first token, errors, lost streams (no finish
reason) and garbled streams: each request carries a seed, and its text must equal the same
request run alone (one client) on the same server. llama-server gets as many parallel slots
(-np) as there are clients. `--soak N` sends N short requests from 4 clients and reports the
server's RSS at the start, after the first 50 and at the end. colibri-serve gets as many slots
(sequences per decode step) as the largest number of clients. `--experts MODEL` (an MoE) then
reports the expert bytes one batched decode step reads, with expert grouping (each routed
expert once per step) and without (once per sequence that picked it), in this process.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.bench.llamacpp import bin_dir

LLAMA_SERVER = bin_dir("LLAMA_CPP_BIN") / "llama-server"
QUESTIONS = ("Write a Python function that reverses a string.", "What is the capital of France?",
             "Name three colours of the rainbow.", "Explain what a CPU cache is in two sentences.",
             "Write a haiku about the sea.", "How many legs does a spider have?",
             "Give me a short list of fruits.", "What does HTTP stand for?")
SLOT_CONTEXT = 1024  # llama-server's context per parallel slot (-c = this x slots)


@dataclass(frozen=True)
class Request:
    """One request of the load: which question and which seed (so its text is reproducible)."""
    question: int
    seed: int

    @property
    def messages(self) -> list[dict]:
        return [{"role": "user", "content": QUESTIONS[self.question % len(QUESTIONS)]}]


def request_at(i: int) -> Request:
    """The i-th request of a load: 16 distinct (question, seed) pairs, over and over."""
    return Request(i % len(QUESTIONS), 1000 + i % 16)


DISTINCT = [request_at(i) for i in range(16)]


@dataclass
class Outcome:
    request: Request
    ttft_s: float | None
    seconds: float
    tokens: int
    text: str
    finish: str | None
    error: str = ""


def stream_one(client, model: str, req: Request, max_tokens: int, temperature: float) -> Outcome:
    """One streamed chat request: its text, time to first token, completion tokens (usage)."""
    t0 = time.perf_counter()
    ttft, text, finish, tokens = None, "", None, 0
    try:
        for chunk in client.chat.completions.create(model=model, messages=req.messages, max_tokens=max_tokens,
                                                    temperature=temperature, seed=req.seed, stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            for choice in chunk.choices[:1]:
                if choice.delta.content:
                    ttft = time.perf_counter() - t0 if ttft is None else ttft
                    text += choice.delta.content
                finish = choice.finish_reason or finish
    except Exception as e:  # noqa: BLE001 - counted and reported
        return Outcome(req, ttft, time.perf_counter() - t0, tokens, text, finish, f"{type(e).__name__}: {e}"[:300])
    return Outcome(req, ttft, time.perf_counter() - t0, tokens, text, finish)


@dataclass
class LoadResult:
    clients: int
    requests: int
    seconds: float
    completion_tokens: int
    tok_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    errors: int
    lost: int  # ended without a finish reason
    garbled: int | None  # text differs from the same request run alone (None: not checked)
    first_errors: list[str] = field(default_factory=list)
    # CPU seconds during the level: the bench's own client threads (they share the cores with the
    # server), and the server process (set by main; None when not measured)
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def run_load(url: str, model: str, clients: int, requests_each: int | None = 2, duration_s: float | None = None,
             max_tokens: int = 48, temperature: float = 0.7, reference: dict[Request, str] | None = None,
             api_key: str = "none") -> tuple[LoadResult, list[Outcome]]:
    """`clients` threads stream requests at once: `requests_each` each, or as many as fit in
    `duration_s`. A reference (request -> text alone) makes garbled streams countable."""
    import openai
    outcomes: list[Outcome] = []
    lock, start = threading.Lock(), threading.Barrier(clients + 1)
    deadline: list[float] = [0.0]

    def client_loop(c: int) -> None:
        client = openai.OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=900)
        start.wait()
        k = 0
        while (requests_each is not None and k < requests_each) or \
                (duration_s is not None and time.perf_counter() < deadline[0]):
            req = request_at(c + clients * k)
            out = stream_one(client, model, req, max_tokens, temperature)
            with lock:
                outcomes.append(out)
            k += 1
        client.close()
    threads = [threading.Thread(target=client_loop, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    deadline[0] = time.perf_counter() + (duration_s or 0)
    t0, cpu0 = time.perf_counter(), time.process_time()
    start.wait()
    for t in threads:
        t.join()
    seconds, client_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    errors = [o for o in outcomes if o.error]
    lost = [o for o in outcomes if not o.error and o.finish is None]
    garbled = [o for o in outcomes if not o.error and o.request in reference and o.text != reference[o.request]] \
        if reference is not None else None
    ttfts = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    tokens = sum(o.tokens for o in outcomes)
    result = LoadResult(clients, len(outcomes), seconds, tokens, tokens / seconds if seconds else 0.0,
                        _percentile(ttfts, 0.5), _percentile(ttfts, 0.99), len(errors), len(lost),
                        None if garbled is None else len(garbled),
                        [o.error for o in errors[:3]], client_cpu)
    return result, outcomes


def references(url: str, model: str, reqs: list[Request], max_tokens: int, temperature: float = 0.7,
               api_key: str = "none") -> dict[Request, str]:
    """Each distinct request's text when it runs alone (one client, one at a time)."""
    import openai
    client = openai.OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=900)
    out = {}
    for req in dict.fromkeys(reqs):
        o = stream_one(client, model, req, max_tokens, temperature)
        if o.error:
            raise SystemExit(f"the reference run of {req} failed: {o.error}")
        out[req] = o.text
    client.close()
    return out


# --- the servers, each in its own process ------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server in a child process, its address, model id and RSS."""

    def __init__(self, name: str, cmd: list[str], port: int, ready_path: str, log: Path, api_key: str | None = None):
        self.name, self.url, self.log = name, f"http://127.0.0.1:{port}/v1", log
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
        self._wait(f"http://127.0.0.1:{port}{ready_path}")
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        with urllib.request.urlopen(urllib.request.Request(self.url + "/models", headers=auth), timeout=30) as r:
            self.model = json.loads(r.read())["data"][0]["id"]

    def _wait(self, url: str, seconds: float = 900) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited ({self.proc.returncode}); its log: {self.log}")
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise SystemExit(f"{self.name} did not answer {url} within {seconds:.0f} s; its log: {self.log}")

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server process has used so far."""
        import psutil
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def rss(self) -> int:
        import psutil
        return psutil.Process(self.proc.pid).memory_info().rss

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def colibri_server(gguf: str | None, threads: int, workdir: Path, max_queue: int = 64, slots: int = 8) -> ServerProcess:
    port = free_port()
    cmd = [sys.executable, "-m", "app.cli_serve", "--port", str(port), "--threads", str(threads),
           "--max_queue", str(max_queue), "--slots", str(slots)] + (["--model", gguf] if gguf else [])
    return ServerProcess("colibri-serve", cmd, port, "/v1/models", workdir / "colibri-serve.log")


def llama_server(gguf: str, threads: int, slots: int, workdir: Path) -> ServerProcess:
    port = free_port()
    cmd = [str(LLAMA_SERVER), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "-np", str(slots), "-c", str(SLOT_CONTEXT * slots), "--no-webui"]
    return ServerProcess(f"llama-server -np {slots}", cmd, port, "/health", workdir / f"llama-server-{slots}.log")


# --- the measurements --------------------------------------------------------------------------
def expert_grouping(model: str, clients: int = 8, steps: int = 8, threads: int = 2) -> dict:
    """Expert bytes per decode step of `clients` sequences (distinct questions) decoded together:
    as read with grouping, and as each sequence would read them alone; medians over `steps`."""
    import statistics

    from engine.api import Engine
    from engine.batch import Batcher
    with Engine(model, threads=threads, context_length=512) as eng:
        if not eng.cfg.is_moe:
            raise ValueError(f"{model} is not a mixture of experts: no expert grouping to measure")
        b = Batcher(eng, prefix_bytes=0)
        seqs = [b.open([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], temperature=0.7, seed=1000 + i,
                       max_tokens=steps + 1) for i in range(clients)]
        for s in seqs:
            s.feed(s.prefill())
        b.count_experts = True
        t0 = time.perf_counter()
        done = 0
        while done < steps and all(s.finish is None for s in seqs):
            logits = b.step(seqs)
            for i, s in enumerate(seqs):
                s.feed(logits[i])
            done += 1
        seconds = time.perf_counter() - t0
        grouped = statistics.median(g for g, _ in b.expert_bytes)
        each = statistics.median(e for _, e in b.expert_bytes)
        for s in seqs:
            s.close()
    return {"model": model, "clients": clients, "steps": done, "grouped_mb_per_step": grouped / 1e6,
            "ungrouped_mb_per_step": each / 1e6, "ratio": each / max(grouped, 1),
            "step_tok_s": clients * done / max(seconds, 1e-9)}


def soak(server: ServerProcess, total: int, clients: int = 4, max_tokens: int = 8) -> dict:
    """`total` short requests from `clients` threads; the server's RSS before, after 50, at the end."""
    rss_start = server.rss()
    first, _ = run_load(server.url, server.model, clients, requests_each=max(1, 50 // clients),
                        max_tokens=max_tokens, temperature=0.0)
    rss_50 = server.rss()
    rest, _ = run_load(server.url, server.model, clients, requests_each=max(1, (total - first.requests) // clients),
                       max_tokens=max_tokens, temperature=0.0)
    rss_end = server.rss()
    n = first.requests + rest.requests
    return {"requests": n, "errors": first.errors + rest.errors, "lost": first.lost + rest.lost,
            "rss_start_mb": rss_start / 1e6, "rss_after_50_mb": rss_50 / 1e6, "rss_end_mb": rss_end / 1e6,
            "growth_after_50_pct": 100 * (rss_end - rss_50) / rss_50}


def _row(name: str, r: LoadResult) -> str:
    def ms(v: float | None) -> str:
        return "—" if v is None else f"{1000 * v:,.0f}"
    return (f"{name:<22} {r.clients:>7} {r.requests:>8} {r.tok_s:>8.1f} {ms(r.ttft_p50_s):>9} {ms(r.ttft_p99_s):>9} "
            f"{r.errors:>6} {r.lost:>5} {'—' if r.garbled is None else r.garbled:>7} {r.client_cpu_s:>8.1f} "
            f"{'—' if r.server_cpu_s is None else f'{r.server_cpu_s:.1f}':>8}")


def _median_round(rounds: list[LoadResult]) -> dict:
    """A level's figures over its rounds: the round of median throughput (its TTFTs with it), the
    errors, lost and garbled streams of every round, and each round's tok/s."""
    mid = sorted(rounds, key=lambda r: r.tok_s)[(len(rounds) - 1) // 2]
    out = asdict(mid)
    out["errors"] = sum(r.errors for r in rounds)
    out["lost"] = sum(r.lost for r in rounds)
    out["garbled"] = None if any(r.garbled is None for r in rounds) else sum(r.garbled for r in rounds)
    out["first_errors"] = [e for r in rounds for e in r.first_errors][:3]
    out["rounds_tok_s"] = [r.tok_s for r in rounds]
    return out


def _one_run(name: str, server: ServerProcess, clients: int, args: argparse.Namespace,
             reference: dict | None) -> LoadResult:
    """One run of one level on one server, with the server's CPU time, printed as it ends."""
    cpu0 = server.cpu_s()
    r, _ = run_load(server.url, server.model, clients, None if args.duration else args.requests, args.duration,
                    args.max_tokens, args.temperature, reference)
    r.server_cpu_s = server.cpu_s() - cpu0
    print(_row(name, r), flush=True)
    return r


def _level_row(name: str, level: dict) -> str:
    """The table row of a level's figures (_median_round's)."""
    return _row(name, LoadResult(**{k: v for k, v in level.items() if k != "rounds_tok_s"}))


def main(args: argparse.Namespace) -> int:
    from app.bench import serve_table
    from app.bench.report import describe_machine, machine, stamp
    from engine.default_model import default_gguf_path
    if args.from_json:  # no run: the page's block from an earlier report
        serve_table.write_readme(json.loads(Path(args.from_json).read_text()),
                                 Path(args.readme or Path(__file__).resolve().parents[2] / "docs" / "bench" / "serve.md"),
                                 args.from_json, args.block)
        return 0
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: at least 1")
    gguf = args.gguf or str(default_gguf_path())
    counts = [int(c) for c in args.clients.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="colibri-bench-serve-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {describe_machine(machine())}")
    print(f"model: {gguf}; {args.max_tokens} tokens per reply, temperature {args.temperature}, seeded; "
          f"{'%g s per level' % args.duration if args.duration else '%d requests per client' % args.requests}"
          f"{'; median of %d rounds' % args.rounds if args.rounds > 1 else ''}")
    report: dict = {"gguf": gguf, "max_tokens": args.max_tokens, "temperature": args.temperature,
                    "threads": args.threads, "requests": None if args.duration else args.requests,
                    "duration_s": args.duration, "rounds": args.rounds, "machine": machine(), "load_before": os.getloadavg()[0],
                    "levels": {}} | stamp()
    head = (f"{'server':<22} {'clients':>7} {'requests':>8} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
            f"{'errors':>6} {'lost':>5} {'garbled':>7} {'cpu cli':>8} {'cpu srv':>8}")
    rows = []
    srv = colibri_server(args.gguf, args.threads, work, slots=max(counts))
    try:
        ref = references(srv.url, srv.model, DISTINCT, args.max_tokens, args.temperature)
        runs: dict[int, list[LoadResult]] = {n: [] for n in counts}
        for _ in range(args.rounds):  # the levels in turn, round after round: a noisy minute hits every level
            for n in counts:
                runs[n].append(_one_run("colibri-serve", srv, n, args, ref))
        for n in counts:
            report["levels"].setdefault(str(n), {})["colibri"] = level = _median_round(runs[n])
            rows.append(_level_row("colibri-serve", level))
        if args.soak:
            report["soak_colibri"] = soak(srv, args.soak)
            print(f"soak colibri-serve: {report['soak_colibri']}", flush=True)
    finally:
        srv.stop()
    if not args.no_llama:
        if not LLAMA_SERVER.exists():
            print(f"llama-server not found at {LLAMA_SERVER}: set LLAMA_CPP_BIN, or pass --no_llama")
        else:
            for n in counts:
                ls = llama_server(gguf, args.threads, n, work)
                try:
                    lref = references(ls.url, ls.model, DISTINCT, args.max_tokens, args.temperature) \
                        if args.llama_references else None
                    name = f"llama-server -np {n}"  # (a server per level: its slots are the level's clients)
                    level = _median_round([_one_run(name, ls, n, args, lref) for _ in range(args.rounds)])
                    report["levels"].setdefault(str(n), {})["llama"] = level
                    rows.append(_level_row(name, level))
                    if args.soak and n == max(counts):
                        report["soak_llama"] = soak(ls, args.soak)
                        print(f"soak llama-server: {report['soak_llama']}", flush=True)
                finally:
                    ls.stop()
    print("\n" + head + "\n" + "\n".join(rows))
    for n, level in report["levels"].items():
        if "colibri" in level and "llama" in level and level["llama"]["tok_s"]:
            print(f"{n:>3} clients: colibri-serve / llama-server throughput "
                  f"{level['colibri']['tok_s'] / level['llama']['tok_s']:.2f}x")
    at = 8 if 8 in counts else counts[-1]  # the target names 8 clients
    one = report["levels"].get(str(counts[0]), {}).get("colibri")
    top = report["levels"].get(str(at), {}).get("colibri")
    if one and top and one["tok_s"] and len(counts) > 1:
        print(f"colibri-serve throughput at {at} clients / at {counts[0]}: {top['tok_s'] / one['tok_s']:.2f}x "
              f"(target >= 2.5x; round by round: "
              f"{', '.join(f'{a / b:.2f}' for a, b in zip(top['rounds_tok_s'], one['rounds_tok_s']))})")
    if args.experts:
        g = report["expert_grouping"] = expert_grouping(args.experts, args.expert_clients, threads=args.threads)
        print(f"expert bytes per decode step at {g['clients']} sequences on {g['model']}: "
              f"{g['grouped_mb_per_step']:.1f} MB grouped, {g['ungrouped_mb_per_step']:.1f} MB without grouping "
              f"({g['ratio']:.2f}x; median of {g['steps']} steps)")
    report["load_after"] = os.getloadavg()[0]
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if args.readme:
        serve_table.write_readme(report, Path(args.readme), args.json or "this run", args.block)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="colibri-serve under concurrent streaming load, beside llama-server")
    p.add_argument("--gguf", help="the GGUF both servers load (default: the default model's)")
    p.add_argument("--clients", default="1,2,4,8,16", help="numbers of concurrent streaming clients")
    p.add_argument("--requests", type=int, default=2, help="requests per client at each level")
    p.add_argument("--duration", type=float, help="seconds per level instead of --requests (e.g. 120)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every level this many times, the levels in turn; each level's figures are its median round")
    p.add_argument("--max_tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.7, help="sampling with a seed per request")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--soak", type=int, default=0, help="then this many short requests, with the server's RSS")
    p.add_argument("--no_llama", action="store_true", help="colibri-serve only")
    p.add_argument("--llama_references", action="store_true",
                   help="also check llama-server's streams against its own runs alone (slow)")
    p.add_argument("--workdir", help="where the servers' logs go (default: a temporary folder)")
    p.add_argument("--experts", help="an MoE model: expert bytes per batched decode step, grouped and not")
    p.add_argument("--expert_clients", type=int, default=8, help="sequences per step for --experts")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--doc", "--readme", dest="readme", help="also regenerate this page's generated serve block "
                   "(docs/bench/serve.md; or, with --from_json, only that)")
    p.add_argument("--from_json", help="no run: regenerate --doc's block from this earlier --json report")
    p.add_argument("--block", default="serve", help="the page block's name: serve (the load table) or "
                                                    "serve-soak (the 2-minute load and the soak)")
    p.set_defaults(func=main)
