"""llama.cpp's own tools, for colibri-bench: llama-bench (the speed reference) and the converter and
quantizer that make the GGUFs every engine is measured on (never our exporter).

Standard library only: the parent of a benchmark imports it, never a peer's worker.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]


def bin_dir(env: str | None = None) -> Path:
    """Where llama.cpp's built tools are: $`env` if set, else the checkout's .llama.cpp/build/bin
    (docs/bench/README.md, llama.cpp)."""
    if env and os.environ.get(env):
        return Path(os.environ[env])
    return ROOT / ".llama.cpp" / "build" / "bin"


LLAMA_BENCH_HELP = ("build it from the llama-cpp-python sdist's vendored llama.cpp (docs/bench/README.md): "
                    "cmake -S vendor/llama.cpp -B build -DLLAMA_CURL=OFF && cmake --build build --target llama-bench")


def find_llama_bench(given: str | None) -> tuple[str | None, str]:
    """llama.cpp's C++ llama-bench: --llama_bench, $COLIBRI_LLAMA_BENCH, PATH, or .llama.cpp/build/bin."""
    import shutil
    candidates = [given] if given else [os.environ.get("COLIBRI_LLAMA_BENCH"), shutil.which("llama-bench"),
                                        str(ROOT / ".llama.cpp" / "build" / "bin" / "llama-bench")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c, ""
    return None, f"no llama-bench found ({LLAMA_BENCH_HELP})"


def use_binding_beside(bench_exe: str | Path | None) -> None:
    """Point the llama-cpp-python binding at the libllama built beside llama-bench (docs/bench/README.md:
    the binding installed without a second build), unless LLAMA_CPP_LIB_PATH already says where."""
    if bench_exe:
        os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(Path(bench_exe).resolve().parent))


def run_llama_bench(binary: str, model: str, threads: int, prompt_tokens: int, gen: int) -> dict:
    """One llama-bench run (pp`prompt_tokens` and tg`gen`, one repetition, its own warm-up). Its peak
    RSS is the exec'd image's VmHWM, polled until it exits (wait4's ru_maxrss would count the pages
    this parent had when it forked)."""
    cmd = [binary, "-m", model, "-t", str(threads), "-p", str(prompt_tokens), "-n", str(gen), "-r", "1",
           "-o", "json"]
    hwm = [0]
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)

        def watch() -> None:
            while p.poll() is None:
                try:
                    with open(f"/proc/{p.pid}/status") as f:
                        hwm[0] = max(hwm[0], next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")))
                except (OSError, StopIteration, ValueError):
                    pass
                time.sleep(0.02)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        out = p.stdout.read()
        p.wait()
        watcher.join()
        if p.returncode:
            err.seek(0)
            raise RuntimeError(f"llama-bench failed (exit {p.returncode}):\n{err.read()[-3000:]}")
    rss_mb = hwm[0] / 1024
    rows = json.loads(out)
    pp = next(r for r in rows if r["n_prompt"] == prompt_tokens and r["n_gen"] == 0)["avg_ts"]
    tg = next(r for r in rows if r["n_gen"] == gen and r["n_prompt"] == 0)["avg_ts"]
    return {"prefill_tok_s": pp, "decode_tok_s": tg, "ttft_s": prompt_tokens / pp, "load_s": None,
            "first_token_s": None, "peak_rss_mb": rss_mb}




LLAMA_CPP_HELP = ("a llama.cpp source tree with build/bin/llama-quantize (--llama_cpp, $COLIBRI_LLAMA_CPP or "
                  ".llama.cpp): the llama-cpp-python sdist's vendor/llama.cpp, built as docs/bench/README.md says")


def find_llama_cpp(given: str | None = None) -> tuple[Path | None, str]:
    """llama.cpp's own tools: convert_hf_to_gguf.py (with its gguf-py) and build/bin/llama-quantize."""
    for c in ([given] if given else [os.environ.get("COLIBRI_LLAMA_CPP"), str(ROOT / ".llama.cpp")]):
        if c and (Path(c) / "convert_hf_to_gguf.py").is_file() and (Path(c) / "build/bin/llama-quantize").is_file():
            return Path(c), ""
    return None, f"no llama.cpp tools found ({LLAMA_CPP_HELP})"


def llama_cpp_gguf(source: Path, preset: str, out_dir: Path, llama_cpp: Path, converter_python: Callable[[], str],
                   log=print) -> Path:
    """`source` (a Hugging Face folder, or a GGUF) quantized by llama.cpp itself to `preset` (Q4_K_M, Q4_0,
    Q8_0, IQ4_XS, ...): convert_hf_to_gguf.py to f16 first for a folder, then llama-quantize (a GGUF that is
    already quantized is requantized, as a user with only that file would). Built once, reused."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = source.stem if source.is_file() else source.name
    out = out_dir / f"{stem}-{preset}.gguf"
    if out.exists():
        return out
    src, requant = source, ["--allow-requantize"]
    if source.is_dir():
        src, requant = out_dir / f"{stem}-f16.gguf", []
        if not src.exists():
            log(f"llama.cpp convert_hf_to_gguf.py: {source} -> {src} ...")
            env = os.environ | {"PYTHONPATH": str(llama_cpp / "gguf-py")}  # the converter's own gguf
            proc = subprocess.run([converter_python(), str(llama_cpp / "convert_hf_to_gguf.py"), str(source),
                                   "--outtype", "f16", "--outfile", str(src.with_suffix(".part"))],
                                  capture_output=True, text=True, env=env)
            if proc.returncode:
                raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{proc.stderr[-3000:]}")
            src.with_suffix(".part").rename(src)
    log(f"llama.cpp llama-quantize {preset}: {src.name} -> {out.name} ...")
    part = out.with_suffix(".part")
    proc = subprocess.run([str(llama_cpp / "build/bin/llama-quantize"), *requant, str(src), str(part), preset],
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"llama-quantize {preset} failed:\n{proc.stderr[-3000:]}")
    part.rename(out)
    return out
