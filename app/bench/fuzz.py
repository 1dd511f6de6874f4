"""colibri-bench fuzz: mutate real GGUF and safetensors files for a time budget and count what
breaks the readers (`--server`: hostile clients of colibri-serve instead, app/bench/fuzz_server.py).

Every mutant must either open (config, tokenizer, a conversion plan for each quantization, the
first and last row of every tensor read and dequantized) or be refused with a ColibriError
naming what is wrong. Anything else is a crash: another exception, or the case's process
killed by a signal; a case still running after --case_timeout seconds is a hang. Each case runs
in a forked child under an address-space cap (RLIMIT_AS), so a runaway allocation is a
MemoryError counted as a crash, not a machine swapping, and a crash cannot end the run.

Mutations, seeded (--seed) and mostly aimed at the header (counts, lengths, offsets, dims,
types, the safetensors JSON): random bit flips, a 4- or 8-byte word set to an extreme value
(0, 1, 2^31, 2^32 - 1, 2^40, 2^63, 2^64 - 1), a run of random bytes, a cut at a random point;
for a Hugging Face folder, a quarter of the cases set a number of its config.json instead.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import resource
import shutil
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

EXTREMES = (0, 1, 2 ** 31, 2 ** 32 - 1, 2 ** 40, 2 ** 63, 2 ** 64 - 1)
REPO = Path(__file__).resolve().parents[2]
DEFAULT_FILES = [REPO / "tests" / "fixtures" / "llamacpp_presets" / "tiny-q4_k_m.gguf",
                 REPO / "tests" / "fixtures" / "llamacpp_presets" / "tiny-moe-mxfp4_moe.gguf",
                 REPO / "tests" / "fixtures" / "hf" / "qwen2"]


@dataclass
class Report:
    cases: int = 0
    opened: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # ColibriError class -> count
    crashes: list[str] = field(default_factory=list)  # "mutation: what happened"
    hangs: list[str] = field(default_factory=list)


def _target(path: Path) -> None:
    """What the converter and the wizard do with a source before writing anything."""
    from engine import quant
    from engine.convert.convert import QUANTIZE_CHOICES, open_source, plan
    src = open_source(path)
    try:
        for q in QUANTIZE_CHOICES:
            plan(src, src.config, q, split_experts=True)
        for t in src.tensors.values():
            for r in {0, t.rows - 1}:
                quant.dequantize(t.read(r, r + 1), t.qtype)
    finally:
        src.close()


def run_case(path: Path, timeout: float, memory_cap: int) -> tuple[str, str]:
    """("opened" | "refused" | "crash" | "hang", detail) of _target(path) in a forked child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, exit without running the parent's handlers
        os.close(r)
        code, detail = 0, "opened"
        try:
            resource.setrlimit(resource.RLIMIT_AS, (memory_cap, memory_cap))
            logging.disable(logging.WARNING)  # the converter's own warnings (f16 fallbacks) would flood the report
            from engine.errors import ColibriError
            try:
                _target(path)
            except ColibriError as e:
                code, detail = 1, f"{type(e).__name__}: {e}"
        except BaseException as e:  # noqa: BLE001  (a crash: anything that is not a ColibriError)
            tb = traceback.extract_tb(e.__traceback__)[-1]
            code, detail = 2, f"{type(e).__name__}: {str(e)[:200]} at {Path(tb.filename).name}:{tb.lineno}"
        os.write(w, detail.encode("utf-8", "replace")[:4000])
        os._exit(code)
    os.close(w)
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.005)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        return "hang", f"still running after {timeout:.0f} s"
    with os.fdopen(r, "rb") as f:
        detail = f.read().decode("utf-8", "replace")
    if os.WIFSIGNALED(status):
        return "crash", f"killed by signal {os.WTERMSIG(status)}"
    return {0: "opened", 1: "refused"}.get(os.WEXITSTATUS(status), "crash"), detail


def _header_end(path: Path) -> int:
    """Bytes before the tensor data: a GGUF's header, or a safetensors file's 8 + JSON length."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] == b"GGUF":
        import gguf
        return int(gguf.GGUFReader(path).data_offset)
    from engine.convert.safetensors_file import read_safetensors_header
    return read_safetensors_header(path)[1]


def _mutation(rng: random.Random, size: int, header: int) -> tuple[str, list[tuple[int, bytes]] | int]:
    """(description, patches [(offset, bytes)]) or (description, cut length)."""
    at = rng.randrange(header) if rng.random() < 0.9 else rng.randrange(size)
    kind = rng.choice(("flip", "word", "word", "bytes", "cut"))
    if kind == "cut":
        n = rng.randrange(min(size, header + 4096))
        return f"cut at {n}", n
    if kind == "flip":
        patches = []
        for _ in range(rng.randint(1, 8)):
            a = rng.randrange(header) if rng.random() < 0.9 else rng.randrange(size)
            patches.append((a, bytes([1 << rng.randrange(8)])))
        return f"flip {[a for a, _ in patches]}", [(a, b) for a, b in patches]  # xor masks
    if kind == "word":
        width = rng.choice((4, 8))
        at -= at % 4
        value = rng.choice(EXTREMES) % (1 << (8 * width))
        return f"word{width} {value} at {at}", [(min(at, size - width), value.to_bytes(width, "little"))]
    n = rng.randint(1, 32)
    return f"{n} random bytes at {at}", [(min(at, size - n), bytes(rng.randrange(256) for _ in range(n)))]


def _apply(mutation: tuple[str, list[tuple[int, bytes]] | int], original: bytes) -> tuple[str, bytes]:
    what, change = mutation
    if isinstance(change, int):
        return what, original[:change]
    data = bytearray(original)
    for at, b in change:
        if what.startswith("flip"):
            data[at] ^= b[0]
        else:
            data[at:at + len(b)] = b
    return what, bytes(data)


def _config_mutation(rng: random.Random, original: bytes) -> tuple[str, bytes]:
    """config.json with one of its numbers made extreme (or negative)."""
    spans = [m.span() for m in re.finditer(rb"-?\d+(?:\.\d+)?", original)]
    a, b = rng.choice(spans)
    value = str(rng.choice((*EXTREMES, -1, 2 ** 31 - 1))).encode()
    return f"config.json {original[a:b].decode()} -> {value.decode()}", original[:a] + value + original[b:]


def fuzz(sources: list[Path], seconds: float, seed: int, timeout: float, memory_cap: int,
         log=print, cases: int | None = None) -> Report:
    """Mutate each source in turn (a copy of it) until `seconds` have passed (or `cases` are done:
    the same mutants for the same seed)."""
    import engine.convert.convert  # noqa: F401  (imported once here: every forked case inherits it)
    rng = random.Random(seed)
    report = Report()
    work = Path(tempfile.mkdtemp(prefix="colibri-fuzz-"))
    try:
        copies = []
        for src in sources:
            dst = work / src.name
            (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
            target = dst / next(p.name for p in sorted(dst.glob("*.safetensors"))) if dst.is_dir() else dst
            copies.append((dst, target, target.read_bytes(), _header_end(target)))
        end = time.monotonic() + seconds
        while time.monotonic() < end and (cases is None or report.cases < cases):
            dst, target, original, header = copies[report.cases % len(copies)]
            if dst.is_dir() and rng.random() < 0.25:  # an HF folder: its config.json instead
                target = dst / "config.json"
                original = target.read_bytes()
                what, mutant = _config_mutation(rng, original)
            else:
                what, mutant = _apply(_mutation(rng, len(original), header), original)
            target.write_bytes(mutant)
            outcome, detail = run_case(dst, timeout, memory_cap)
            report.cases += 1
            if outcome == "opened":
                report.opened += 1
            elif outcome == "refused":
                name = detail.split(":", 1)[0]
                report.refused[name] = report.refused.get(name, 0) + 1
            else:
                line = f"{dst.name}: {what}: {detail}"
                (report.crashes if outcome == "crash" else report.hangs).append(line)
                log(f"{outcome.upper()} {line}")
            target.write_bytes(original)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


def main(args: argparse.Namespace) -> int:
    if args.server:
        from app.bench import fuzz_server
        report = fuzz_server.fuzz_server(args.seconds, args.seed, args.case_timeout,
                                         Path(args.model) if args.model else None, cases=args.cases)
        print(fuzz_server.summary(report))
        if args.json:
            Path(args.json).write_text(json.dumps(report.__dict__, indent=1) + "\n")
        late = report.final_s is None or report.final_s > 1.0
        return 1 if report.crashes or report.hangs or late else 0
    sources = [Path(p) for p in args.files.split(",")] if args.files else [p for p in DEFAULT_FILES if p.exists()]
    if args.default_model:
        from engine.default_model import default_gguf_path
        sources.append(Path(default_gguf_path()))
    r = fuzz(sources, args.seconds, args.seed, args.case_timeout, int(args.memory_cap_gb * 2 ** 30),
             cases=args.cases)
    print(f"{r.cases} mutants of {', '.join(p.name for p in sources)}: {r.opened} opened, "
          f"{sum(r.refused.values())} refused ({', '.join(f'{k} {v}' for k, v in sorted(r.refused.items()))}), "
          f"{len(r.crashes)} crashes, {len(r.hangs)} hangs")
    if args.json:
        Path(args.json).write_text(json.dumps(r.__dict__, indent=1) + "\n")
    return 1 if r.crashes or r.hangs else 0


def add_parser(sub) -> None:
    p = sub.add_parser("fuzz", help="mutated GGUF / safetensors files, or hostile clients of colibri-serve "
                       "(--server): 0 crashes and 0 hangs expected")
    p.add_argument("--files", help="comma-separated GGUF files or HF folders (default: tiny test fixtures)")
    p.add_argument("--default_model", action="store_true", help="also mutate the default model's GGUF")
    p.add_argument("--seconds", type=float, default=60, help="time budget")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", type=int, help="stop after this many mutants (a reproducible run)")
    p.add_argument("--case_timeout", type=float, default=20, help="seconds before a case counts as a hang")
    p.add_argument("--memory_cap_gb", type=float, default=4, help="address-space cap of each case")
    p.add_argument("--server", action="store_true", help="fuzz colibri-serve instead (app/bench/fuzz_server.py): "
                   "malformed heads and bodies, slow clients, abrupt closes, cross-origin and huge requests")
    p.add_argument("--model", help="with --server: a converted model folder to serve (default: the tiny test model)")
    p.add_argument("--json", help="also write the report to this file")
    p.set_defaults(func=main)
