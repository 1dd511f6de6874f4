"""colibri-bench speed: Colibri, llama.cpp and transformers side by side on one model, one run.

Each measurement is a fresh process (so load time and peak RSS are honest), and the engines
alternate run by run, so machine noise (other jobs on a shared box) spreads over all of them;
figures are medians of `--runs` runs. Each run follows llama-bench's conventions: load, a
512-token prompt from an empty context (pp512: prefill and time to first token), then 128
tokens generated from an empty context (tg128: decode), each fed a random id as llama-bench
does. Colibri runs twice: `colibri` through `forward()`, `colibri-chat` through `generate()`
with the chat window's default sampling (the path users run). llama.cpp runs twice too:
`llama-bench` (its C++ tool, the reference: ratios are taken against it) and `llama.cpp` (the
llama-cpp-python binding). Every engine gets one untimed warm-up run per model first (a whole
process: page cache, compiled kernels), and in every timed process the warm-up llama-bench does
in its own (the prompt once and one token, untimed). The memory read bandwidth is measured in the same run by
a parallel numba read kernel, before the first model and after each (the best probe is the
limit: on a shared machine one probe may land in a busy minute), and decode is also given as a
fraction of that limit: tok/s × (weight bytes + mean KV-cache bytes read per token) ÷ bandwidth.

Peers need their own packages: llama.cpp from `llama-cpp-python` (the `bench` extra),
transformers from `torch` + `transformers` (the `fixtures` extra). If the running interpreter
lacks one, an interpreter that has it is used for that engine (`--llamacpp_python`,
`--transformers_python`, or the repository's .venv-bench / .venv-fixtures); otherwise the engine
is skipped with the reason printed.

This module's top level imports only the standard library and numpy: the peers' interpreters
run it as `python -m app.bench.speed --worker ENGINE ...` without Colibri's dependencies.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from app.bench.llamacpp import find_llama_bench, find_llama_cpp, llama_cpp_gguf, run_llama_bench, use_binding_beside
from app.bench.report import BEGIN, END, cpu_info, figure, machine, markdown, stamp, write_readme  # noqa: F401 (BEGIN, END, cpu_info: API)
from app.bench.workers import converter_python, find_python, open_colibri

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ("colibri", "colibri-chat", "llama-bench", "llama.cpp", "transformers")
REFERENCE = "llama-bench"  # ratios are against llama.cpp's own C++ benchmark
FIGURES = ("decode_tok_s", "prefill_tok_s", "ttft_s", "load_s", "first_token_s", "peak_rss_mb")


# --- the physical limit ----------------------------------------------------------------------

_READ_KERNEL = None


def _read_kernel():
    """A parallel streaming read compiled by numba: each task sums its own contiguous slice of
    float32 values (fastmath lets LLVM vectorise the sum into independent lanes), the way the
    engine's kernels stream weights: through a function of its own per slice, as the engine's
    parallel loops call theirs. (A sum written inside the prange body stayed a chain of dependent
    scalar adds: on Zen 5 that probe read 3.6 GB/s a thread against 33.8 this way, while the engine
    decoded 18.8 GB/s of weights.) Compiled on first use (not at import: peers' interpreters
    import this module without numba)."""
    global _READ_KERNEL
    if _READ_KERNEL is None:
        from numba import njit, prange

        @njit(fastmath=True, nogil=True)
        def slice_sum(x):  # x: float32 (m,), contiguous
            s = np.float32(0.0)
            for i in range(x.shape[0]):
                s += x[i]
            return s

        @njit(parallel=True, fastmath=True, nogil=True)
        def read(a, parts, out):  # a: float32 (n,), n divisible by parts; out: one sum per slice
            step = a.shape[0] // parts
            for p in prange(parts):
                out[p] = slice_sum(a[p * step:(p + 1) * step])
        _READ_KERNEL = read
    return _READ_KERNEL


def measure_bandwidth(threads: int = 1, mb: int = 512, reps: int = 7) -> float:
    """Memory read bandwidth in bytes/s: `threads` numba threads each streaming its share of `mb`
    MB (far beyond any cache) through a parallel read kernel; the median of `reps`."""
    import numba
    read = _read_kernel()
    parts = threads * 8  # several slices per thread: a slow core does not hold the others up
    n = mb * (1 << 20) // 4 // (parts * 16) * (parts * 16)
    a, out = np.ones(n, np.float32), np.zeros(parts, np.float32)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        read(a, parts, out)  # compile, and fault the pages in
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            read(a, parts, out)
            times.append(time.perf_counter() - t0)
    finally:
        numba.set_num_threads(before)
    if abs(float(out.sum()) - n) > 1e-3 * n:  # the kernel really read every value
        raise RuntimeError(f"bandwidth probe read {float(out.sum())} of {n} values")
    return a.nbytes / statistics.median(times)


def bandwidth_limit(max_threads: int) -> tuple[float, dict[int, float]]:
    """The machine's read bandwidth: the best of 1..max_threads streaming threads (one core alone
    rarely saturates the memory controller), and each thread count's figure."""
    each = {t: measure_bandwidth(t) for t in range(1, max(1, max_threads) + 1)}
    return max(each.values()), each


def per_token(model_dir: Path) -> tuple[int, int]:
    """Bytes and weights a decode step reads: attention, routers, the active share of the experts
    (top_k of num_experts; shared experts always) and the output matrix. From the tensor headers,
    so a copied directory and one indexing a GGUF in place count alike."""
    from engine.model_dir import open_model_dir
    md = open_model_dir(model_dir)
    cfg, nbytes, weights = md.config, 0, 0
    for rel, infos in md.headers.items():
        if rel == "embeddings.bin":
            continue
        share = cfg.top_k / cfg.num_experts if cfg.is_moe and rel.startswith("experts/") and "shared" not in rel else 1
        nbytes += int(sum(i.nbytes for i in infos.values()) * share)
        weights += int(sum(int(np.prod(i.shape)) for i in infos.values() if len(i.shape) >= 2) * share)
    emb = md.headers["embeddings.bin"]
    head = emb["output.weight" if "output.weight" in emb else "token_embd.weight"]
    return nbytes + head.nbytes, weights + int(np.prod(head.shape))


KV_BYTES = {"f32": 4.0, "f16": 2.0, "int8": 1.0 + 4.0 / 32}  # per element (int8: a float scale per 32)


def kv_bytes_per_token(model_dir: Path, gen: int, kv: str = "f16") -> int:
    """Mean KV-cache bytes a decode step reads over tg`gen` from an empty context: keys and values
    of every earlier position, every layer (position p reads p + 1 rows; the mean is (gen + 1) / 2)."""
    from engine.model_dir import open_model_dir
    cfg = open_model_dir(model_dir).config
    row = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * KV_BYTES[kv]
    return int(row * (gen + 1) / 2)


# --- workers: one measurement each, in a fresh process ---------------------------------------

def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _pp_then_tg(prefill, reset, step, prompt: list[int], gen: int) -> tuple[float, float]:
    """(seconds for the prompt from an empty context, seconds for `gen` tokens generated from an empty
    context): llama-bench's pp and tg, after llama-bench's own in-process warm-up (the same prompt
    once and one token, untimed)."""
    prefill(prompt)
    reset()
    step(prompt[0])
    reset()
    t0 = time.perf_counter()
    prefill(prompt)
    ttft = time.perf_counter() - t0
    reset()
    t0 = time.perf_counter()
    for i in range(gen):  # the next token is not the model's pick but, as llama-bench feeds it, a random id
        step(prompt[i % len(prompt)])  # (greedy picks loop on a random-weight MoE: the same experts, cache-hot)
    return ttft, time.perf_counter() - t0


def _colibri(model: str, threads: int, prompt: list[int], gen: int, t_start: float) -> dict:
    eng = open_colibri(model, threads, len(prompt) + gen + 8)
    load = time.perf_counter() - t_start
    ttft, decode = _pp_then_tg(eng.forward, eng.reset, lambda t: eng.forward([t]), prompt, gen)
    return {"load_s": load, "ttft_s": ttft, "decode_s": decode}


def _colibri_chat(model: str, threads: int, prompt: list[int], gen: int, t_start: float) -> dict:
    """The chat window's path: generate() on text, the engine's default sampling, streamed Steps."""
    eng = open_colibri(model, threads, len(prompt) + gen + 64)
    load = time.perf_counter() - t_start
    eng.codec.stop_ids = frozenset()  # benchmark only: EOS must not end tg early (llama-bench ignores it too)
    text = eng.detokenize(prompt)
    need = len(eng.prompt_ids(text)) + gen + 64  # the text may encode to more tokens than the ids it came from
    if need > eng.context_limit:
        eng.set_param("context_length", need)
    for _step in eng.generate(text, max_tokens=2):  # llama-bench's warm-up: the prompt once, a token
        pass
    eng.reset()
    t0 = time.perf_counter()
    first = next(iter(eng.generate(text, max_tokens=1)))
    ttft = time.perf_counter() - t0
    eng.reset()
    times = []
    for _step in eng.generate(eng.detokenize(prompt[:1]), max_tokens=gen):
        times.append(time.perf_counter())
    if len(times) < gen:
        raise RuntimeError(f"generate() stopped after {len(times)} of {gen} tokens")
    per_token = (times[-1] - times[0]) / (len(times) - 1)
    return {"load_s": load, "ttft_s": ttft, "decode_s": per_token * gen, "prompt_tokens": first.prompt_tokens}


def _llamacpp(model: str, threads: int, prompt: list[int], gen: int, t_start: float) -> dict:
    from llama_cpp import Llama
    n_ctx = len(prompt) + gen + 8  # scores keeps n_batch rows: n_batch >= n_ctx
    llm = Llama(model_path=model, n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    load = time.perf_counter() - t_start

    def step(tok: int) -> int:
        llm.eval([tok])
        return int(np.argmax(llm.scores[llm.n_tokens - 1]))
    ttft, decode = _pp_then_tg(llm.eval, llm.reset, step, prompt, gen)
    return {"load_s": load, "ttft_s": ttft, "decode_s": decode}


# GGUF tensor (inside blk.N.) -> Hugging Face name (inside model.layers.N.), Llama family
_HF_NAMES = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
             "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
             "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
             "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
             "ffn_down.weight": "mlp.down_proj.weight"}


def _hf_from_gguf(path: str):
    """A Llama-family GGUF dequantized into transformers' LlamaForCausalLM (float32), as
    tests/make_float_reference.py does (transformers cannot read Q4_1 itself)."""
    import gguf
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    r = gguf.GGUFReader(path)
    f = {k: v.contents() for k, v in r.fields.items()}
    if f.get("general.architecture") != "llama":
        raise SystemExit(f"transformers: GGUF architecture {f.get('general.architecture')!r} is not dequantized "
                         f"here (Llama family only): pass a Hugging Face folder")
    heads, kv = f["llama.attention.head_count"], f["llama.attention.head_count_kv"]

    def unpermute(w, n):  # llama.cpp interleaves rotary pairs in q/k rows; HF keeps halves
        return w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    sd = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        if t.name in ("token_embd.weight", "output.weight"):
            sd["model.embed_tokens.weight" if t.name == "token_embd.weight" else "lm_head.weight"] = torch.from_numpy(w)
        elif t.name == "output_norm.weight":
            sd["model.norm.weight"] = torch.from_numpy(w)
        else:
            _, layer, key = t.name.split(".", 2)
            w = unpermute(w, heads) if key == "attn_q.weight" else unpermute(w, kv) if key == "attn_k.weight" else w
            sd[f"model.layers.{layer}.{_HF_NAMES[key]}"] = torch.from_numpy(w)
    tied = "lm_head.weight" not in sd
    if tied:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    cfg = LlamaConfig(vocab_size=sd["model.embed_tokens.weight"].shape[0], hidden_size=f["llama.embedding_length"],
                      intermediate_size=f["llama.feed_forward_length"], num_hidden_layers=f["llama.block_count"],
                      num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied,
                      rms_norm_eps=f["llama.attention.layer_norm_rms_epsilon"], rope_theta=f["llama.rope.freq_base"],
                      max_position_embeddings=f["llama.context_length"])
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(sd, strict=True)
    return model


def _transformers(model: str, threads: int, prompt: list[int], gen: int, t_start: float) -> dict:
    import torch
    torch.set_num_threads(threads)
    if model.lower().endswith(".gguf"):
        net = _hf_from_gguf(model)
    else:
        from transformers import AutoModelForCausalLM
        net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    net.eval()
    load = time.perf_counter() - t_start
    with torch.inference_mode():
        net(torch.tensor([prompt]), use_cache=True)  # llama-bench's warm-up: the prompt once, untimed
        t0 = time.perf_counter()
        net(torch.tensor([prompt]), use_cache=True)
        ttft = time.perf_counter() - t0
        past, nxt = None, prompt[0]  # tg from an empty context, as llama-bench
        t0 = time.perf_counter()
        for _ in range(gen):
            out = net(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, int(out.logits[0, -1].argmax())
    return {"load_s": load, "ttft_s": ttft, "decode_s": time.perf_counter() - t0}


WORKERS = {"colibri": _colibri, "colibri-chat": _colibri_chat, "llama.cpp": _llamacpp,
           "transformers": _transformers}


def worker_main(argv: list[str]) -> int:
    """`--worker ENGINE --model PATH --threads N --prompt_file F --gen N`: prints one JSON line."""
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser()
    for flag in ("--worker", "--model", "--prompt_file"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--gen", type=int, required=True)
    a = ap.parse_args(argv)
    prompt = json.loads(Path(a.prompt_file).read_text())
    r = WORKERS[a.worker](a.model, a.threads, prompt, a.gen, t_start)
    r |= {"prefill_tok_s": r.pop("prompt_tokens", len(prompt)) / r["ttft_s"], "decode_tok_s": a.gen / r["decode_s"],
          "first_token_s": r["load_s"] + r["ttft_s"], "peak_rss_mb": _peak_rss_mb()}
    print("BENCH_RESULT " + json.dumps(r), flush=True)
    return 0


# --- the parent: prepare, alternate, summarise -----------------------------------------------


NAMED = {"default": "the default model's GGUF (SmolLM2-135M-Instruct Q4_1)",
         "moe-q8_0": "the Mixtral-style benchmark model (colibri-bench memory) in int8 = Q8_0",
         "moe-q4_0": "the same model re-rounded to Q4_0 (embeddings and output head Q8_0)"}


def prepare(model: Path, workdir: Path) -> dict[str, tuple[str | None, str]]:
    """engine -> (the path it loads, or None and why it is skipped)."""
    from engine.model_dir import open_model_dir
    is_gguf = model.is_file() and model.suffix.lower() == ".gguf"
    if (model / "manifest.json").exists():  # already a Colibri directory: peers need its source
        open_model_dir(model)
        return {"colibri": (str(model), ""), "llama.cpp": (None, "a Colibri directory: give the GGUF/HF source"),
                "transformers": (None, "a Colibri directory: give the GGUF/HF source")}
    from engine.convert.convert import convert, in_place_refusal
    out = workdir / f"colibri-{model.stem}"
    if not (out / "manifest.json").exists():  # a GGUF is indexed in place, as the app opens it
        in_place = is_gguf and in_place_refusal("gguf", "keep", True, None) is None
        print(f"{'indexing' if in_place else 'converting'} {model.name} for Colibri into {out} ...", flush=True)
        convert(model, out, force=True, in_place=in_place)
    return {"colibri": (str(out), ""),
            "llama.cpp": (str(model), "") if is_gguf else (None, "llama.cpp needs a GGUF file"),
            "transformers": (str(model), "")}


MOE_DIR = Path.home() / ".cache" / "colibri" / "bench"  # shared with colibri-bench memory


# A Mixtral-style model small enough to quantize into every preset in minutes (0.31 B parameters, 8
# experts, top-2, 4 layers; SmolLM2's vocabulary): `moe-small:PRESET`
SMALL_MOE = {"hidden": 1024, "layers": 4, "heads": 16, "kv_heads": 4, "experts": 8, "top_k": 2, "ff": 2048,
             "vocab": 49152}


def small_moe(moe_dir: Path, log=print) -> Path:
    """The small benchmark MoE's Hugging Face folder (random weights, balanced routers), built once."""
    from app.bench.memory import _default_tokenizer
    from app.bench.models import MixtralShape, write_checkpoint
    folder = moe_dir / "mixtral-small-hf"
    if not (folder / "model.safetensors").exists():
        log(f"building the small benchmark MoE in {folder} ...")
        write_checkpoint(folder, MixtralShape(**SMALL_MOE), balanced_router=True, tokenizer_json=_default_tokenizer(),
                         embed_std=1.0)
    return folder


def split_preset(spec: str) -> tuple[str, str] | None:
    """`default:Q4_K_M` -> ("default", "Q4_K_M"); None for a spec without a llama.cpp preset."""
    base, _, preset = spec.rpartition(":")
    if not base or not preset[:1].isalpha() or "/" in preset:
        return None
    return base, preset


def resolve_spec(spec: str, moe_dir: Path, llama_cpp: str | None = None, log=print) -> str:
    """`NAME:PRESET` / `PATH:PRESET` -> the GGUF llama.cpp's own tools make of it (`default:Q4_K_M`,
    `moe:Q4_K_M`); anything else is returned as it is."""
    if split_preset(spec) is None:
        return spec
    base, preset = split_preset(spec)
    tools, why = find_llama_cpp(llama_cpp)
    if tools is None:
        raise SystemExit(f"--model {spec}: {why}")
    if base == "default":
        from engine.default_model import default_gguf_path
        source = Path(default_gguf_path())
    elif base == "moe":
        from app.bench.memory import prepare as prepare_moe
        moe_dir.mkdir(parents=True, exist_ok=True)
        prepare_moe(moe_dir)
        source = moe_dir / "mixtral-hf"
    elif base == "moe-small":
        source = small_moe(moe_dir, log)
    else:
        source = Path(base).expanduser()
    return str(llama_cpp_gguf(source, preset, moe_dir / "llama.cpp", tools, converter_python, log))


def model_paths(spec: str, workdir: Path, moe_dir: Path | None = None) -> dict[str, tuple[str | None, str]]:
    """engine -> path for a NAMED model or a path the user gave (prepared on first use)."""
    paths = (prepare_named(spec, workdir, moe_dir or MOE_DIR) if spec in NAMED
             else prepare(Path(spec).expanduser(), workdir))
    return paths | {"colibri-chat": paths["colibri"], "llama-bench": paths["llama.cpp"]}  # the same files


def prepare_named(name: str, workdir: Path, moe_dir: Path) -> dict[str, tuple[str | None, str]]:
    """The paths of a named benchmark model (NAMED), built on first use. The MoE models are
    built in `moe_dir` and kept (shared with `colibri-bench memory`); every engine reads the same
    blocks, and transformers the float checkpoint they were rounded from."""
    if name == "default":
        from engine.default_model import default_gguf_path
        return prepare(default_gguf_path(), workdir)
    from app.bench.memory import prepare as prepare_moe
    from engine.convert.convert import convert
    from engine.convert.gguf_export import export_gguf
    moe_dir.mkdir(parents=True, exist_ok=True)
    int8_dir, q8_gguf, _ = prepare_moe(moe_dir)
    hf = str(moe_dir / "mixtral-hf")
    if name == "moe-q8_0":
        return {"colibri": (str(int8_dir), ""), "llama.cpp": (str(q8_gguf), ""), "transformers": (hf, "")}
    q4_gguf, q4_dir = moe_dir / "mixtral-q4_0.gguf", moe_dir / "mixtral-q4_0"
    if not q4_gguf.exists():
        print(f"re-rounding the benchmark model to Q4_0: {q4_gguf} ...", flush=True)
        part = q4_gguf.with_suffix(".part")
        export_gguf(int8_dir, part, requantize="q4_0")
        part.rename(q4_gguf)
    if not (q4_dir / "manifest.json").exists():
        convert(q4_gguf, q4_dir, None, force=True)  # the GGUF's Q4_0 blocks, kept as they are
    return {"colibri": (str(q4_dir), ""), "llama.cpp": (str(q4_gguf), ""), "transformers": (hf, "")}


def run_once(py: str, engine: str, model: str, threads: int, prompt_file: Path, gen: int,
             env: dict[str, str]) -> dict:
    if engine == "llama-bench":
        return run_llama_bench(py, model, threads, len(json.loads(prompt_file.read_text())), gen)
    cmd = [py, "-m", "app.bench.speed", "--worker", engine, "--model", model, "--threads", str(threads),
           "--prompt_file", str(prompt_file), "--gen", str(gen)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=os.environ | env, timeout=1800)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("BENCH_RESULT ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"{engine} worker failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line.split(" ", 1)[1])


def _label(engine: str, simd: str) -> str:
    return engine if engine != "colibri" or simd == "auto" else f"colibri[{simd}]"


def _fidelity(name: str, paths: dict, pythons: dict, workdir: Path, threads: int, log) -> dict:
    """app.bench.fidelity on this model's files: the teacher-forced argmax against llama.cpp's."""
    from app.bench import fidelity
    gguf, why = paths["llama.cpp"]
    py, why_py = find_python("llama.cpp", pythons.get("llama.cpp")) if gguf else (None, why)
    if py is None:
        log(f"{name}: no fidelity check: {why_py}")
        return {"skipped": why_py}
    res = fidelity.measure(paths["colibri"][0], gguf, sys.executable, py, workdir, threads)
    own = res["llama_cpp_self"]
    log(f"{name}: teacher-forced argmax equals llama.cpp's at {res['agreed']} of {res['compared']} confident "
        f"positions ({100 * (res['rate'] or 0):.1f}%; llama.cpp one token at a time vs batched: {own['agreed']} of "
        f"{own['compared']})")
    return res


def run_speed(models: list[str], engines: list[str], threads: list[int], runs: int, prompt_tokens: int, gen: int,
              simds: list[str], workdir: Path, pythons: dict[str, str | None], moe_dir: Path | None = None,
              log=print, llama_cpp: str | None = None, fidelity: bool = False) -> dict:
    """Every model in turn (a NAMED one or a path); per model, the engines alternate run by run."""
    workdir.mkdir(parents=True, exist_ok=True)
    import psutil
    cores = psutil.cpu_count(logical=False) or 1
    probes: list[dict[int, float]] = []

    def probe() -> None:  # a shared machine's bandwidth varies over a run: the best probe is the limit
        log("measuring memory bandwidth ...")
        probes.append(bandwidth_limit(cores)[1])
        log("bandwidth " + ", ".join(f"{t} thread(s) {b / 1e9:.1f} GB/s" for t, b in probes[-1].items()))

    probe()
    report = {"machine": machine(), "prompt_tokens": prompt_tokens, "decode_tokens": gen, "models": [],
              "results": [], "skipped": {}}
    done: dict[tuple[str, str, int], list[dict]] = {}  # (engine, path, threads) -> samples, across models
    for spec in models:
        path = resolve_spec(spec, moe_dir or MOE_DIR, llama_cpp, log)
        paths = model_paths(path, workdir, moe_dir)
        name = spec if spec in NAMED or path != spec else Path(spec).name
        entry = _run_model(name, paths, engines, threads, runs, prompt_tokens, gen, simds, workdir, pythons,
                           done, log)
        if fidelity:
            entry["model"]["fidelity"] = _fidelity(name, paths, pythons, workdir, max(threads), log)
        report["models"].append(entry["model"])
        report["results"] += entry["results"]
        report["skipped"] |= {f"{name}: {e}": why for e, why in entry["skipped"].items()}
        probe()
    each = {t: max(p[t] for p in probes) for t in probes[0]}
    bw = max(each.values())
    report |= {"bandwidth_gb_s": bw / 1e9, "bandwidth_by_threads_gb_s": {str(t): b / 1e9 for t, b in each.items()},
               "bandwidth_probes_gb_s": [max(p.values()) / 1e9 for p in probes]}
    per_token = {(m["name"], e): (m["float_bytes_per_token"] if e == "transformers" else m["weight_bytes_per_token"])
                 + m["kv_bytes_per_token"] for m in report["models"] for e in ("transformers", "other")}
    for row in report["results"]:
        kind = "transformers" if row["engine"] == "transformers" else "other"
        row["bandwidth_fraction"] = row["decode_tok_s"] * per_token[(row["model"], kind)] / bw
    if len(models) == 1:  # the single-model layout of earlier reports
        report |= {"model": report["models"][0]["name"],
                   "weight_bytes_per_token": report["models"][0]["weight_bytes_per_token"],
                   "skipped": {k.split(": ", 1)[1]: v for k, v in report["skipped"].items()}}
    return report


def _run_model(name: str, paths: dict, engines: list[str], threads: list[int], runs: int, prompt_tokens: int,
               gen: int, simds: list[str], workdir: Path, pythons: dict, done: dict, log) -> dict:
    plan, skipped = [], {}
    for engine in engines:
        path, why = paths[engine]
        py, why_py = find_python(engine, pythons.get(engine)) if path else (None, why)
        if py is None:
            skipped[engine] = why_py
            log(f"{name}: skipping {engine}: {why_py}")
            continue
        for simd in (simds if engine == "colibri" else ["auto"]):
            plan.append((_label(engine, simd), engine, py, path, {"COLIBRI_SIMD": simd}))
    from engine.model_dir import open_model_dir
    cfg = open_model_dir(paths["colibri"][0]).config
    rng = np.random.default_rng(0)  # the same prompt for every engine: ordinary (non-special) ids
    prompt = [int(i) for i in rng.integers(min(1000, cfg.vocab_size // 4), cfg.vocab_size * 3 // 4, prompt_tokens)]
    prompt_file = workdir / "prompt.json"
    prompt_file.write_text(json.dumps(prompt))
    qbytes, weights = per_token(Path(paths["colibri"][0]))
    fbytes = 4 * weights
    log(f"{name}: weights read per decoded token: {qbytes / 1e6:.1f} MB (as stored), {fbytes / 1e6:.1f} MB "
        f"(float32, transformers)")
    todo = [p for p in plan if not all((p[0], p[3], t) in done for t in threads)]
    for _name, engine, py, path, env in todo:  # untimed: compiles kernels, warms the page cache
        run_once(py, engine, path, threads[0], prompt_file, 4, env)
    for r in range(runs):
        for t in threads:
            for label, engine, py, path, env in todo:
                res = run_once(py, engine, path, t, prompt_file, gen, env)
                done.setdefault((label, path, t), []).append(res)
                log(f"{name} run {r + 1}/{runs} {label:>18} {t} thread(s): decode {res['decode_tok_s']:6.1f} tok/s, "
                    f"prefill {res['prefill_tok_s']:6.1f} tok/s, load {figure(res['load_s'], '.2f')} s")
    results = []
    for label, _engine, _py, path, _env in plan:
        for t in threads:
            rs = done[(label, path, t)]
            med = {k: (statistics.median(x[k] for x in rs) if rs[0].get(k) is not None else None)
                   for k in FIGURES}  # (+ bandwidth_fraction: run_speed)
            results.append({"engine": label, "model": name, "threads": t, "runs": len(rs), **med})
    reference = REFERENCE if any(r["engine"] == REFERENCE for r in results) else "llama.cpp"
    for row in results:
        for peer, key in ((reference, "vs_llama_cpp"), ("transformers", "vs_transformers")):
            other = next((x for x in results if x["engine"] == peer and x["threads"] == row["threads"]), None)
            if other:
                row[key] = {"decode": row["decode_tok_s"] / other["decode_tok_s"],
                            "prefill": row["prefill_tok_s"] / other["prefill_tok_s"]}
    scaling = {}
    for label in dict.fromkeys(r["engine"] for r in results):
        by_t = {r["threads"]: r["decode_tok_s"] for r in results if r["engine"] == label}
        if 1 in by_t and len(by_t) > 1:
            scaling[label] = {str(t): v / by_t[1] for t, v in by_t.items()}
    model = {"name": name, "colibri_path": paths["colibri"][0], "gguf": paths["llama.cpp"][0],
             "weight_bytes_per_token": qbytes, "kv_bytes_per_token": kv_bytes_per_token(Path(paths["colibri"][0]), gen),
             "float_bytes_per_token": fbytes, "decode_scaling_vs_1_thread": scaling, "reference": reference}
    return {"model": model, "results": results, "skipped": skipped}


def cmd_speed(args: argparse.Namespace) -> int:
    models = [m.strip() for m in (args.model or "default").split(",") if m.strip()]
    use_binding_beside(find_llama_bench(args.llama_bench)[0])
    for m in models:
        if m not in NAMED and split_preset(m) is None and not Path(m).expanduser().exists():
            raise SystemExit(f"--model {m}: no such file or folder (or one of: {', '.join(NAMED)})")
    workdir = Path(args.workdir) if args.workdir else None
    moe_dir = Path(args.moe_dir).expanduser() if args.moe_dir else None
    with tempfile.TemporaryDirectory(prefix="colibri-speed-") as tmp:
        report = run_speed(models, [e.strip() for e in args.engines.split(",")],
                           [int(t) for t in args.threads.split(",")], args.runs, args.prompt_tokens,
                           args.gen_tokens, [s.strip() for s in args.simd.split(",")], workdir or Path(tmp),
                           {"llama.cpp": args.llamacpp_python, "transformers": args.transformers_python,
                            "llama-bench": args.llama_bench}, moe_dir, llama_cpp=args.llama_cpp,
                           fidelity=args.fidelity)
    report |= stamp()
    print("\n" + markdown(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if args.readme:
        write_readme(report, Path(args.readme), args.json or "this run")
    return 0


def cmd_readme(args: argparse.Namespace) -> int:
    """Regenerate a page's generated speed block from a saved `speed --json` report."""
    write_readme(json.loads(Path(args.json).read_text()), Path(args.readme), args.json, args.block)
    print(f"{args.readme}: the {args.block} block regenerated from {args.json}")
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("speed", help="decode/prefill speed beside llama.cpp and transformers")
    s.add_argument("--model", help="comma-separated: GGUF files, Hugging Face folders, Colibri directories or "
                                   "named models (" + "; ".join(f"{k}: {v}" for k, v in NAMED.items())
                                   + "); NAME:PRESET or PATH:PRESET is that model as llama.cpp's own tools quantize "
                                     "it (default:Q4_K_M, moe-small:Q4_K_M, moe:Q4_0, a HF folder:Q5_K_M); default: default")
    s.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, of: " + ", ".join(ENGINES))
    s.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    s.add_argument("--runs", type=int, default=3, help="runs per engine and thread count (medians)")
    s.add_argument("--prompt_tokens", type=int, default=512, help="pp: prompt tokens (llama-bench's pp512)")
    s.add_argument("--gen_tokens", type=int, default=128, help="tg: tokens generated (llama-bench's tg128)")
    s.add_argument("--simd", default="auto", help="Colibri's instruction sets to compare, e.g. auto,avx512")
    s.add_argument("--llamacpp_python", help="interpreter with llama_cpp (default: this one or .venv-bench)")
    s.add_argument("--transformers_python", help="interpreter with torch+transformers (default: .venv-fixtures)")
    s.add_argument("--workdir", help="keep the converted model here (reused next time)")
    s.add_argument("--moe_dir", help="where the MoE benchmark models are built and kept (default "
                                     "~/.cache/colibri/bench, shared with colibri-bench memory)")
    s.add_argument("--llama_cpp", help="llama.cpp source tree with build/bin/llama-quantize, for NAME:PRESET "
                                       "models (default: $COLIBRI_LLAMA_CPP or .llama.cpp)")
    s.add_argument("--llama_bench", help="llama.cpp's C++ llama-bench (default: $COLIBRI_LLAMA_BENCH, PATH, "
                                         ".llama.cpp/build/bin)")
    s.add_argument("--fidelity", action="store_true",
                   help="also teacher-force 256 tokens of English through Colibri and llama.cpp (its Python binding) "
                        "on each model and report how often their argmax agree where llama.cpp is confident")
    s.add_argument("--json", help="also write the figures to this file")
    s.add_argument("--doc", "--readme", dest="readme", help="also regenerate this page's generated speed block "
                   "(docs/bench/speed.md)")
    s.set_defaults(func=cmd_speed)
    r = sub.add_parser("readme", help="regenerate a page's speed block from a speed --json report (colibri-bench docs "
                                      "regenerates every block)")
    r.add_argument("--json", required=True)
    r.add_argument("--doc", "--readme", dest="readme", default=str(ROOT / "docs" / "bench" / "speed.md"))
    r.add_argument("--block", default="speed", help="which generated block: speed or another name "
                   "marked `<!-- colibri-bench NAME: begin ... -->` (e.g. speed-arch)")
    r.set_defaults(func=cmd_readme)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        sys.exit(worker_main(sys.argv[1:]))
    sys.exit("run through colibri-bench speed")
