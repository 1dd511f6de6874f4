"""colibri-bench duel: Colibri and llama.cpp decoding the same model in turns, seconds apart.

    colibri-bench duel --model GGUF [--slices 16] [--slice_s 2] [--threads 2] [--trace T.npz] [--json F]
    colibri-bench duel --model GGUF --baseline DIR   # this code against another checkout of Colibri

Both engines load in their own process, prefill the same 32 seeded tokens and decode 8 untimed;
then one decodes while the other is stopped (SIGSTOP), swapped every `slice_s` seconds, the first
of each pair alternating. Each process writes a timestamp per token; a slice's speed is the tokens
that finished in it, and each pair of neighbouring slices gives a ratio (Colibri / llama.cpp).
Why: on a shared machine a decode's speed drifts by half within minutes, so whole runs minutes
apart (colibri-bench memory) compare the host's moods as much as the engines; two slices seconds
apart see the same host. An engine against itself (`--self`) shows the method's own spread.
"""
from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 600.0  # loading and the untimed tokens (a first conversion is done before)

CONTEXT = 4096
# Each child: load, the same seeded prompt (memory.py's tokens: the same for both engines) and 8
# untimed tokens, READY, then (once a line comes in) decode seeded tokens for ever, one timestamp
# line per token into the file argv[1].
_LOOP = """
for t in stream[:8]:
    step([t])
print("READY", flush=True)
sys.stdin.readline()
with open(sys.argv[1], "w") as out:
    for t in stream[8:]:
        step([t])
        out.write(f"{time.monotonic()}\\n")
        out.flush()
"""


def _child(load: str) -> str:
    """A child's source: `load` defines vocab and step (one call of the engine on a list of ids)."""
    from app.bench.memory import _TOKENS
    return (f"import sys, time, numpy as np\n{load}\nprompt_n, decode_n = 32, {CONTEXT - 64}\n{_TOKENS}"
            f"step(ids)\n{_LOOP}")


def colibri_child(model: str, threads: int, trace: str | None) -> str:
    from app.bench.memory import SETUP
    replay = f"from app.bench.memory import replay_routing\nreplay_routing(eng, {trace!r})\n" if trace else ""
    return _child(f"{SETUP}from engine.api import Engine\n"
                  f"eng = Engine({model!r}, threads={threads}, context_length={CONTEXT}, log_level='WARN')\n"
                  f"eng.warmup(); eng.reset()\n{replay}vocab = eng.cfg.vocab_size\nstep = eng.forward")


def llama_child(gguf: str, threads: int) -> str:
    return _child(f"from llama_cpp import Llama\nm = Llama({gguf!r}, n_ctx={CONTEXT}, n_threads={threads}, "
                  f"n_threads_batch={threads}, n_batch=512, verbose=False)\nvocab = m.n_vocab()\nstep = m.eval")


def duel(commands: dict[str, list[str]], slices: int, slice_s: float, env: dict | None = None,
         trees: dict[str, Path] | None = None) -> dict:
    """Run two child commands (name -> argv, each ending where its timestamp file goes) in turns:
    `slices` pairs of `slice_s` seconds. `trees` (name -> a checkout) runs that side's code from
    another source tree (its folder first on PYTHONPATH, and its working directory). Returns each
    side's tokens per second per slice, the tokens stamped outside its slices (a stamp can land just
    past a slice's end), and the ratios of the first side's speeds to the second's, pair by pair."""
    if len(commands) != 2:
        raise ValueError("a duel has two sides")
    names = list(commands)
    procs: dict[str, subprocess.Popen] = {}
    with tempfile.TemporaryDirectory(prefix="colibri-duel-") as tmp:
        stamps = {n: Path(tmp) / f"{i}.txt" for i, n in enumerate(names)}
        try:
            for n in names:  # one at a time: each loads and warms up on its own
                tree = (trees or {}).get(n, ROOT)
                base = os.environ if env is None else env
                side_env = dict(base, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), base.get("PYTHONPATH")])))
                p = subprocess.Popen([*commands[n], str(stamps[n])], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=side_env, cwd=tree)
                procs[n] = p
                line = _readline(p, READY_TIMEOUT_S)
                if line.strip() != "READY":
                    raise RuntimeError(f"{n}: {line.strip() or 'no READY'} (exit code {p.poll()})")
                os.kill(p.pid, signal.SIGSTOP)
                p.stdin.write("GO\n")  # read once it runs
                p.stdin.flush()
            windows: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
            for s in range(slices):
                for n in (names if s % 2 == 0 else names[::-1]):
                    os.kill(procs[n].pid, signal.SIGCONT)
                    t0 = time.monotonic()
                    time.sleep(slice_s)
                    os.kill(procs[n].pid, signal.SIGSTOP)
                    windows[n].append((t0, time.monotonic()))
            gone = [n for n in names if procs[n].poll() is not None]
            if gone:  # a side that died mid-duel: its slices after that would read as 0 tok/s
                raise RuntimeError(f"{', '.join(gone)}: exited during the duel (exit code "
                                   f"{procs[gone[0]].returncode})")
        finally:
            for p in procs.values():
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                p.wait()
        rates, stray = {}, {}
        for n in names:
            text = stamps[n].read_text() if stamps[n].exists() else ""
            ts = np.array([float(v) for v in text.split()], np.float64)
            inside = [(ts > a) & (ts <= b) for a, b in windows[n]]
            rates[n] = [float(m.sum() / (b - a)) for m, (a, b) in zip(inside, windows[n])]
            stray[n] = int(len(ts) - sum(int(m.sum()) for m in inside))  # stamped while stopped: 0, or one at an edge
    ratios = [a / b if b > 0 else float("nan") for a, b in zip(rates[names[0]], rates[names[1]])]
    return {"sides": names, "slice_s": slice_s, "tok_s": rates, "stray_tokens": stray, "ratios": ratios,
            "median_ratio": float(np.nanmedian(ratios)), "quartiles": [float(np.nanpercentile(ratios, q)) for q in (25, 75)]}


def _readline(p: subprocess.Popen, timeout: float) -> str:
    """A line of the child's stdout, or "" when it exits or stays silent past `timeout` seconds."""
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        return p.stdout.readline() if sel.select(timeout) else ""


def _shown(path) -> str:
    """The model's path as the JSON keeps it: under the home folder as ~/..., never this machine's home."""
    p, home = Path(path).expanduser(), Path.home()
    return f"~/{p.relative_to(home)}" if p.is_relative_to(home) else str(path)


def _commit_of(trees: dict[str, Path]) -> str | None:
    """The baseline checkout's commit (what the JSON keeps: not a path on this machine)."""
    if "baseline" not in trees:
        return None
    r = subprocess.run(["git", "-C", str(trees["baseline"]), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                       text=True)
    return r.stdout.strip() or "not a git checkout"


def add_parser(sub) -> None:
    p = sub.add_parser("duel", help="Colibri against llama.cpp on one GGUF, decoding in turns seconds apart")
    p.add_argument("--model", required=True, help="a GGUF file (Colibri converts it once into --workdir)")
    p.add_argument("--slices", type=int, default=16, help="pairs of slices")
    p.add_argument("--slice_s", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--trace", help="replay this routing trace in Colibri (colibri-bench routing --trace)")
    p.add_argument("--self", dest="self_duel", choices=("colibri", "llama.cpp"),
                   help="that engine against itself: what the method's own spread is")
    p.add_argument("--baseline", help="a checkout of Colibri (e.g. `git worktree add ../base COMMIT`): this code "
                   "against that one, no llama.cpp needed")
    p.add_argument("--workdir", help="where the converted copy is kept (default ~/.cache/colibri/bench)")
    p.add_argument("--json", help="also write the result to this file")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from app.bench.llamacpp import find_llama_bench, use_binding_beside
    from app.bench.memory import llama_python
    from app.bench.report import machine, stamp
    from app.bench.speed import MOE_DIR, prepare
    gguf = Path(args.model).expanduser()
    if not (gguf.is_file() and gguf.suffix.lower() == ".gguf"):
        raise SystemExit(f"--model {args.model}: a GGUF file is needed (both engines load it)")
    ours = prepare(gguf, Path(args.workdir).expanduser() if args.workdir else MOE_DIR)["colibri"][0]
    col = [sys.executable, "-c", colibri_child(ours, args.threads, args.trace)]
    trees: dict[str, Path] = {}
    if args.baseline:
        base = Path(args.baseline).expanduser().resolve()
        if not (base / "engine" / "api.py").is_file():
            raise SystemExit(f"--baseline {args.baseline}: not a checkout of Colibri (no engine/api.py)")
        sides, trees = {"colibri": col, "baseline": col}, {"baseline": base}
    else:
        use_binding_beside(find_llama_bench(None)[0])
        py_llama = llama_python()
        if py_llama is None and args.self_duel != "colibri":
            raise SystemExit("llama.cpp's Python binding (llama_cpp) is not installed: see docs/bench/README.md")
        lla = [py_llama or "", "-c", llama_child(str(gguf), args.threads)]
        sides = {"colibri": col, "llama.cpp": lla}
        if args.self_duel:
            sides = {f"{args.self_duel} A": sides[args.self_duel], f"{args.self_duel} B": sides[args.self_duel]}
    out = duel(sides, args.slices, args.slice_s, trees=trees) | {"model": _shown(gguf), "threads": args.threads,
                                                                "trace": args.trace, "baseline": _commit_of(trees)}
    out |= stamp() | {"machine": machine()}
    a, b = out["sides"]
    for i, (x, y, r) in enumerate(zip(out["tok_s"][a], out["tok_s"][b], out["ratios"])):
        print(f"pair {i + 1:2d}: {a} {x:6.1f} tok/s  {b} {y:6.1f} tok/s  ratio {r:.3f}")
    q1, q3 = out["quartiles"]
    print(f"{a} / {b}: median {out['median_ratio']:.3f} (quartiles {q1:.3f}-{q3:.3f}, {len(out['ratios'])} pairs of "
          f"{args.slice_s:g} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0
