"""The public Engine API on real converted models: parameters, generation, cache reuse, limits."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
from conftest import HF_FIXTURES

from engine import errors
from engine.api import ContextOverflowError, Engine
from engine.convert.convert import convert


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return convert(HF_FIXTURES / "qwen3_moe", tmp_path_factory.mktemp("api") / "m", "keep").path


@pytest.fixture(scope="module")
def smol(default_converted):
    eng = Engine(default_converted, threads=2)
    yield eng
    eng.close()


CHAT = [{"role": "user", "content": "What is 2 + 2? Answer with a number."}]


def reply(eng, prompt, **kw):
    steps = list(eng.generate(prompt, **kw))
    return "".join(s.text for s in steps), steps


def test_parameters_are_checked_against_the_table(tiny):
    with pytest.raises(ValueError, match=r"temperature: 7.0 is out of range \(0 to 5\)"):
        Engine(tiny, temperature=7)
    with pytest.raises(ValueError, match="kv_cache_quantize: 'int3' is not one of f32, f16, int8"):
        Engine(tiny, kv_cache_quantize="int3")
    with pytest.raises(ValueError, match="unknown parameter 'tempreature'"):
        Engine(tiny, tempreature=1)
    eng = Engine(tiny)
    with pytest.raises(ValueError, match=r"top_p: 1.5 is out of range \(0 to 1\)"):
        eng.set_param("top_p", 1.5)
    with pytest.raises(ValueError, match="top_k: 'many' is not a valid int"):
        list(eng.generate("hi", top_k="many"))
    eng.set_param("kv_cache_quantize", "int8")
    assert eng.cache.kind == "int8"
    eng.set_param("temperature", 0.2)
    assert eng.stats().params["temperature"] == 0.2


def test_same_seed_same_text(tiny):
    eng = Engine(tiny)
    a, _ = reply(eng, "The", temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=123, max_tokens=12)
    b, _ = reply(eng, "The", temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=123, max_tokens=12)
    c, _ = reply(eng, "The", temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7, max_tokens=12)
    assert a == b and a != c


def test_greedy_generate_equals_forward_loop(tiny):
    eng = Engine(tiny, kv_cache_quantize="f32")
    _, steps = reply(eng, "Hello world", temperature=0, max_tokens=6, repeat_penalty=1.0)
    ids = eng.tokenize("Hello world")
    fresh = Engine(tiny, kv_cache_quantize="f32")
    want = [fresh.forward(ids)]
    for _ in range(5):
        want.append(fresh.forward([want[-1]]))
    got = [s.token_id for s in steps if s.token_id is not None]
    assert got == want[:len(got)] and steps[-1].finish_reason in ("length", "stop")


def test_logits_do_not_touch_the_conversation(tiny):
    eng = Engine(tiny)
    reply(eng, "Once upon", temperature=0, max_tokens=3)
    before = (list(eng.tokens), eng.cache.length)
    out = eng.logits(eng.tokenize("a b c"))
    assert out.shape == (len(eng.tokenize("a b c")), eng.cfg.vocab_size) and out.dtype == np.float32
    assert (eng.tokens, eng.cache.length) == before


def test_finish_reasons(tiny):
    eng = Engine(tiny, context_length=24)
    _, steps = reply(eng, "x " * 8, temperature=0, max_tokens=3)
    assert steps[-1].finish_reason == "length" and steps[-1].generated_tokens == 3
    _, steps = reply(eng, "x " * 8, temperature=0, max_tokens=500)
    assert steps[-1].finish_reason == "context" and steps[-1].context_used <= 24 and steps[-1].length_limited
    with pytest.raises(ContextOverflowError, match=r"the prompt is \d+ tokens but the context holds 24"):
        eng.generate("x " * 40)
    assert eng.cache.length <= 24


def test_stop_from_another_thread(tiny):
    eng = Engine(tiny)
    gen = eng.generate("Tell", temperature=0, max_tokens=10_000)
    first = next(gen)
    threading.Thread(target=eng.stop).start()
    rest = list(gen)
    assert first.finish_reason is None and rest[-1].finish_reason == "cancelled"


def test_stop_strings(tiny):
    eng = Engine(tiny)
    full, _ = reply(eng, "Once", temperature=0, max_tokens=20, repeat_penalty=1.0)
    cut = full[3:6]
    assert cut
    text, steps = reply(eng, "Once", temperature=0, max_tokens=20, repeat_penalty=1.0, stop=[cut])
    assert steps[-1].finish_reason == "stop" and text == full[:full.index(cut)]


def test_chat_on_the_default_model(smol):
    text, steps = reply(smol, CHAT, temperature=0, max_tokens=20)
    assert "4" in text
    last = steps[-1]
    assert last.finish_reason == "stop" and last.token_id is None  # ended by the model's own EOS
    assert last.ttft_s > 0 and last.prefill_tok_s > 0


def test_follow_up_turn_prefills_only_new_tokens(smol):
    smol.reset()
    first, s1 = reply(smol, CHAT, temperature=0, max_tokens=20)
    conv = CHAT + [{"role": "assistant", "content": first}, {"role": "user", "content": "And 3 + 3?"}]
    _, s2 = reply(smol, conv, temperature=0, max_tokens=10)
    new = s2[-1].prompt_tokens - s2[-1].cached_tokens
    assert s2[-1].cached_tokens >= s1[-1].prompt_tokens  # the whole first turn was reused
    assert new < 20 < s2[-1].prompt_tokens
    assert smol.stats().tokens_reused >= s2[-1].cached_tokens


def test_stats_is_a_frozen_snapshot(smol):
    st = smol.stats()
    assert st.architecture == "llama" and st.num_layers == 30 and st.weights_bytes > 90e6
    assert st.rss_bytes > 0 and st.context_limit == 4096 and st.kv_cache_kind == "f16"
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.threads = 9  # type: ignore[misc]


def test_bad_model_paths(tmp_path, default_gguf, default_converted):
    with pytest.raises(errors.ModelFormatError, match="a GGUF file; convert it first"):
        Engine(default_gguf)
    with pytest.raises(errors.MissingFileError, match="model directory not found"):
        Engine(tmp_path / "nothing")
    import shutil
    broken = shutil.copytree(default_converted, tmp_path / "broken")
    (broken / "attention" / "layer_7.bin").write_bytes(b"CLBT")
    with pytest.raises(errors.ModelFormatError, match="layer_7.bin"):
        Engine(broken)


def test_warmup_and_token_checks(tiny):
    eng = Engine(tiny)
    assert eng.warmup() >= 0
    with pytest.raises(ValueError, match="token ids out of range"):
        eng.logits([0, 10_000_000])
    assert eng.detokenize(eng.tokenize("round trip 123")) == "round trip 123"


def test_int8_activations_switch_live(smol):
    """int8_activations (default on) against float activations on the real Q4_1 model: close,
    not identical, switched on a running engine."""
    ids = smol.tokenize("The capital of France is")
    fast = smol.logits(ids)
    smol.set_param("int8_activations", False)
    try:
        exact = smol.logits(ids)
    finally:
        smol.set_param("int8_activations", True)
    assert not np.array_equal(fast, exact)
    assert np.abs(fast - exact).max() < 0.05 * np.abs(exact).max()
    assert (fast[-1].argmax() == exact[-1].argmax())
    np.testing.assert_array_equal(smol.logits(ids), fast)


WARM_CHECK = """
import sys, numba
from numba.core.registry import CPUDispatcher
from engine import kernels
kernels.setup()
from engine.api import Engine

def overloads():
    mods = [m for n, m in list(sys.modules.items()) if n.startswith("engine") and m is not None]
    return {f"{m.__name__}.{k}": len(v.overloads) for m in mods for k, v in list(vars(m).items())
            if isinstance(v, CPUDispatcher)}

def llvm_rss_mb():  # resident pages of LLVM's library mapped into this process
    rss, mapped = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
            mapped = head[-1].endswith("/libllvmlite.so")
        elif mapped and head[0] == "Rss:":
            rss += int(head[1])
    return rss / 1024

eng = Engine(sys.argv[1], threads=1)
print("llvm before warmup", llvm_rss_mb())
eng.warmup()
print("llvm after warmup", llvm_rss_mb())
before = overloads()
chat = [{"role": "user", "content": "Write two lines about the sea, the wind and the long grey shore."}]
text = "".join(s.text for s in eng.generate(chat, max_tokens=6))
after = overloads()
print("llvm after a reply", llvm_rss_mb())
print(sorted(k for k in after if after[k] != before.get(k, 0)))
"""


@pytest.mark.parametrize("model", ["default Q4_1", "llama.cpp's Q4_K_M"])
def test_warmup_compiles_everything_the_first_chat_reply_runs(model, default_converted, tmp_path):
    """The first reply in a fresh window must not compile (or load from the cache) a kernel:
    warmup() runs a prompt-sized prefill, a decode step and the chat's default sampler, and
    compiles the prompt's K-quant SwiGLU tiles (warm-up's probe is shorter than the 16 tokens
    they take). A fresh process, because compiled overloads are per process. Then warm-up unmaps
    LLVM's library (about 100 MB of RSS), and the reply does not map it back."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = default_converted if model.startswith("default") else \
        convert(os.path.join(root, "tests/fixtures/llamacpp_presets/tiny-q4_k_m.gguf"), tmp_path / "q4km").path
    r = subprocess.run([sys.executable, "-c", WARM_CHECK, str(path)], cwd=root, capture_output=True,
                       text=True, timeout=900, env=dict(os.environ, PYTHONPATH=root))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == "[]", r.stdout
    # LLVM's code pages leave the process's RSS once the kernels are in, and decoding never faults them back
    mb = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("llvm ")}
    if sys.platform.startswith("linux"):
        assert mb["llvm before warmup"] > 50, r.stdout
        assert mb["llvm after warmup"] < 8 and mb["llvm after a reply"] < 8, r.stdout
