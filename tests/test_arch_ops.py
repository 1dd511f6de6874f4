"""engine/ops against their numpy twins and against transformers' own modules (tests/fixtures/arch:
per-module captures, logits, a 4x-window sequence), and the per-layer-type caches."""
from __future__ import annotations

import json

import numpy as np
import pytest
from arch_reference import ARCH_FIXTURES, ARCHS, Model

from engine.ops import attention as att
from engine.ops import cache as caches
from engine.ops import conv, deltanet, ffn, rope


def rel_err(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(b).max())


def modules(arch: str) -> dict[str, np.ndarray]:
    """modules.npz with the aliases of reference.json filled in."""
    got = dict(np.load(ARCH_FIXTURES / arch / "modules.npz"))
    for alias, kept in json.loads((ARCH_FIXTURES / arch / "reference.json").read_text())["module_aliases"].items():
        got[alias] = got[kept]
    return got


@pytest.fixture(scope="module")
def model():
    cache = {}

    def get(arch: str) -> Model:
        if arch not in cache:
            cache[arch] = Model(arch)
        m = cache[arch]
        m.reset()
        return m
    return get


# ---- kernels against their numpy twins ----------------------------------------------------------

def test_rope_kernel_matches_twin_with_pass_through_dims():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 24)).astype(np.float32)
    cos, sin = rope.tables(rope.default_inv_freq(1e4, 24, 0.25), np.arange(7, 12))
    y = x.copy()
    rope.rope(y, cos, sin)
    np.testing.assert_allclose(y, rope.rope_ref(x, cos, sin), rtol=0, atol=1e-6)
    assert np.array_equal(y[..., 6:], x[..., 6:])  # partial rotary: 6 of 24 dims turn


def test_rope_takes_odd_rotating_dims_as_transformers_does():
    """int(20 x 0.25) = 5: transformers' 3 frequencies theta^-(0, 2, 4)/5 turn the first 6 dims
    (held to its logits by the qwen3_5_moe_rope5 fixture, tests/test_arch_engine.py)."""
    inv = rope.default_inv_freq(1e4, 20, 0.25)
    np.testing.assert_allclose(inv, 1e4 ** -(np.arange(0, 5, 2) / 5), rtol=1e-6)
    with pytest.raises(ValueError, match="rotating dims"):
        rope.default_inv_freq(1e4, 20, 0.01)  # none turns
    with pytest.raises(ValueError, match="rotating dims"):
        rope.default_inv_freq(1e4, 5, 1.0)  # 3 pairs in a head of 5


@pytest.mark.parametrize("window,sinks,softcap", [(0, False, 0.0), (4, True, 0.0), (3, False, 5.0)])
def test_attention_kernel_matches_twin(window, sinks, softcap):
    rng = np.random.default_rng(1)
    T, S, H, KVH, hd = 4, 9, 6, 2, 20
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k = rng.standard_normal((S, KVH, hd)).astype(np.float32)
    v = rng.standard_normal((S, KVH, hd)).astype(np.float32)
    kpos = rng.permutation(np.r_[np.arange(S - 1), -1]).astype(np.int64)  # ring order, one empty slot
    qpos = np.arange(S - 1 - T, S - 1, dtype=np.int64) + 1
    s = rng.standard_normal(H).astype(np.float32) if sinks else None
    got = att.attend(q, k, v, qpos, kpos, 0.3, window, s, softcap)
    want = att.attention_ref(q, k, v, qpos, kpos, 0.3, window, s, softcap)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_causal_conv_carries_its_state_across_chunks():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((11, 7)).astype(np.float32)
    w = rng.standard_normal((7, 4)).astype(np.float32)
    want, want_state = conv.causal_conv_ref(x, w, np.zeros((3, 7), np.float32), silu=True)
    state, outs = np.zeros((3, 7), np.float32), []
    for a, b in ((0, 2), (2, 3), (3, 9), (9, 11)):  # chunks shorter and longer than the kernel
        out = np.empty((b - a, 7), np.float32)
        conv.causal_conv(np.ascontiguousarray(x[a:b]), w, state, True, out)
        outs.append(out)
    np.testing.assert_allclose(np.concatenate(outs), want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(state, want_state, rtol=0, atol=0)


def test_delta_rule_recurrent_chunked_and_kernel_agree():
    rng = np.random.default_rng(3)
    T, Hk, Hv, dk, dv = 13, 2, 4, 20, 12
    q, k = (rng.standard_normal((T, Hk, dk)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((T, Hv, dv)).astype(np.float32)
    g = -rng.uniform(0.05, 2, (T, Hv)).astype(np.float32)
    beta = rng.uniform(0, 1, (T, Hv)).astype(np.float32)
    s0 = rng.standard_normal((Hv, dk, dv)).astype(np.float32) * 0.1
    want, want_s = deltanet.delta_rule_ref(q, k, v, g, beta, s0)
    got, got_s = deltanet.delta_rule_chunked_ref(q, k, v, g, beta, s0, chunk=5)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got_s, want_s, rtol=0, atol=1e-5)
    s, out = s0.copy(), np.empty((T, Hv, dv), np.float32)
    work = deltanet.work_for(Hv, dk, dv)
    deltanet.delta_rule(q, k, v, g, beta, s, False, work, out)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(s, want_s, rtol=0, atol=1e-5)
    # llama.cpp's tiled value-head order: value head h reads key head h % Hk
    tiled, _ = deltanet.delta_rule_ref(q, k, v, g, beta, s0, tiled=True)
    deltanet.delta_rule(q, k, v, g, beta, s0.copy(), True, work, out)
    np.testing.assert_allclose(out, tiled, rtol=0, atol=1e-5)
    assert np.allclose(tiled[:, 0], want[:, 0]) and not np.allclose(tiled[:, 1], want[:, 1])


def test_clamped_swiglu_kernel_matches_twin_beyond_the_limit():
    x = np.linspace(-12, 12, 2 * 3 * 16, dtype=np.float32).reshape(3, 32)
    out = np.empty((3, 16), np.float32)
    ffn.clamped_swiglu(x, np.float32(1.702), np.float32(7.0), out)
    np.testing.assert_allclose(out, ffn.clamped_swiglu_ref(x, 1.702, 7.0), rtol=1e-6, atol=1e-6)
    assert np.isclose(ffn.clamped_swiglu_ref(np.array([[100.0, 100.0]], np.float32), 1.702, 7.0)[0, 0],
                      8 * 7 / (1 + np.exp(-1.702 * 7)))  # both clamps bite


def test_biased_clamped_swiglu_matches_the_interleaved_twin():
    """gpt-oss's experts: biases added and both clamps applied in the kernel, as the twin computes
    them over the interleaved (gate + bias, up + bias); values beyond the limit on both sides."""
    rng = np.random.default_rng(3)
    g, u = (rng.normal(0, 6, (3, 21)).astype(np.float32) for _ in range(2))
    gb, ub = (rng.normal(0, 2, 21).astype(np.float32) for _ in range(2))
    out = np.empty_like(g)
    ffn.biased_clamped_swiglu(g, u, gb, ub, np.float32(1.702), np.float32(7.0), out)
    gu = np.empty((3, 42), np.float32)
    gu[:, 0::2], gu[:, 1::2] = g + gb, u + ub
    assert (gu > 7).any() and (gu[:, 1::2] < -7).any()
    np.testing.assert_allclose(out, ffn.clamped_swiglu_ref(gu, 1.702, 7.0), rtol=1e-6, atol=1e-6)


def test_gelu_mul_kernel_matches_twin_across_the_curve():
    """Gemma 4's gelu_tanh(gate) * up in one kernel pass, against the numpy twin, over values from
    the flat negative tail through the knee to large positives (odd width, several rows)."""
    rng = np.random.default_rng(7)
    g = np.concatenate([np.linspace(-12, 12, 3 * 37), rng.normal(0, 3, 3 * 37)]).astype(np.float32).reshape(6, 37)
    u = rng.normal(0, 2, g.shape).astype(np.float32)
    out = np.empty_like(g)
    ffn.gelu_mul(g, u, out)
    want = ffn.gelu_tanh(g) * u
    # libm's tanh and numpy's differ in the last bits near -1, where 1 + tanh cancels: absolute
    # there, relative elsewhere
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-9)
    assert np.abs(out).max() > 10  # the large positives pass through (gelu(x) ~ x)


def test_checked_entry_points_name_shapes_that_do_not_fit():
    z = np.zeros
    with pytest.raises(ValueError, match=r"attention: q \(2, 3, 8\), k \(4, 2, 8\)"):
        att.attend(z((2, 3, 8), np.float32), z((4, 2, 8), np.float32), z((4, 2, 8), np.float32), np.arange(2),
                   np.arange(4), 1.0)  # 2 KV heads do not divide 3 query heads
    with pytest.raises(ValueError, match=r"gated delta rule: .*state \(4, 8, 5\)"):
        deltanet.gated_delta(z((1, 2, 8)), z((1, 2, 8)), z((1, 4, 6)), z((1, 4)), z((1, 4)), z((4, 8, 5), np.float32))
    with pytest.raises(ValueError, match=r"causal conv: x \(3, 5\), w \(4, 3\)"):
        conv.short_conv(z((3, 5)), z((4, 3)), z((2, 4), np.float32))
    out = deltanet.gated_delta(z((2, 1, 4)), z((2, 1, 4)), np.ones((2, 2, 3)), z((2, 2)), np.ones((2, 2)),
                               z((2, 4, 3), np.float32))
    assert out.shape == (2, 2, 3) and conv.short_conv(np.ones((3, 4)), np.ones((4, 2)), z((1, 4), np.float32)).shape == (3, 4)


# ---- the per-layer-type caches -------------------------------------------------------------------

def test_ring_keeps_the_last_window_and_a_chunk_sees_what_it_pushes_out():
    ring = caches.RingKV(4, 1, 2)
    k = np.arange(6 * 2, dtype=np.float32).reshape(6, 1, 2)
    ks, _, kpos = ring.update(k, k, np.arange(6))
    assert sorted(kpos[kpos >= 0].tolist()) == [0, 1, 2, 3, 4, 5]  # old slots (empty) + the 6 new
    assert sorted(ring.pos.tolist()) == [2, 3, 4, 5]
    ks, _, kpos = ring.update(k[:1] + 100, k[:1], np.array([6]))
    assert sorted(kpos.tolist()) == [3, 4, 5, 6] and ks[kpos == 6][0, 0, 0] == 100


def test_full_kv_refuses_to_overflow():
    kv = caches.FullKV(3, 1, 2)
    kv.update(np.zeros((3, 1, 2), np.float32), np.zeros((3, 1, 2), np.float32), np.arange(3))
    with pytest.raises(ValueError, match="capacity 3"):
        kv.update(np.zeros((1, 1, 2), np.float32), np.zeros((1, 1, 2), np.float32), np.array([3]))


@pytest.mark.parametrize("kind", ["f16", "int8"])
def test_attention_reads_a_stored_cache_as_its_float32_copy(kind):
    """update_stored: the kernel widens f16 bits and int8 times its scales as it reads them, and
    gets what it gets from update()'s float32 copy (f16 exactly; int8 to float rounding); a
    ring's decode step and a full cache's chunk alike."""
    rng = np.random.default_rng(4)
    k, v = rng.standard_normal((7, 2, 8)).astype(np.float32), rng.standard_normal((7, 2, 6)).astype(np.float32)
    q = rng.standard_normal((1, 4, 8)).astype(np.float32)
    for cache, chunks in ((caches.RingKV(4, 2, 8, 6, kind=kind), (6, 1)), (caches.FullKV(7, 2, 8, 6, kind=kind), (3, 4))):
        cache.update(k[:chunks[0]], v[:chunks[0]], np.arange(chunks[0]))
        twin = cache.copy()
        new = np.arange(chunks[0], 7)
        ks, k_scale, vs, v_scale, kpos = cache.update_stored(k[chunks[0]:], v[chunks[0]:], new)
        fk, fv, fpos = twin.update(k[chunks[0]:], v[chunks[0]:], new)
        assert ks.dtype == {"f16": np.uint16, "int8": np.int8}[kind] and np.array_equal(kpos, fpos)
        qpos = np.array([6], np.int64)
        outs = []
        for args in ((ks, vs, k_scale, v_scale, kind == "int8"), (fk, fv, att.NO_SCALE, att.NO_SCALE, False)):
            out, scores = np.empty((1, 4, 6), np.float32), np.empty((1, 4, len(kpos)), np.float32)
            att.attention(q, *args, qpos, kpos, np.float32(0.3), 0, np.zeros(4, np.float32), False, np.float32(0),
                          scores, out)
            outs.append(out)
        np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=0 if kind == "f16" else 1e-6)


@pytest.mark.parametrize("kind, tol", [("f32", 0.0), ("f16", 1e-3), ("int8", 1 / 127)])
def test_ring_and_full_kv_store_their_kind_and_read_back_float32(kind, tol):
    """kv_cache_quantize in the per-layer caches: stored as the kind (int8 with a scale per position
    and head), read back as float32 within the kind's rounding, sized as position_bytes says."""
    rng = np.random.default_rng(0)
    k, v = rng.standard_normal((6, 2, 8)).astype(np.float32), rng.standard_normal((6, 2, 4)).astype(np.float32)
    full, ring = caches.FullKV(6, 2, 8, 4, kind=kind), caches.RingKV(4, 2, 8, 4, kind=kind)
    ks, vs, _ = full.update(k, v, np.arange(6))
    assert ks.dtype == np.float32 and full.k.dtype == {"f32": np.float32, "f16": np.float16, "int8": np.int8}[kind]
    for got, want in ((ks, k), (vs, v)):
        assert np.abs(got - want).max() <= tol * np.abs(want).max(axis=-1, keepdims=True).max() + 1e-7
    assert full.nbytes == 6 * caches.position_bytes(2, 8, 4, kind) and full.bytes_used() == full.nbytes
    ring.update(k[:5], v[:5], np.arange(5))
    ks, _, kpos = ring.update(k[5:], v[5:], np.array([5]))
    assert sorted(kpos.tolist()) == [2, 3, 4, 5] and np.allclose(ks[kpos == 5][0], k[5], atol=tol * 4 + 1e-7)
    assert ring.nbytes == 4 * caches.position_bytes(2, 8, 4, kind)
    assert np.array_equal(ring.copy().k, ring.k)
    with pytest.raises(ValueError, match="kv_cache_quantize: 'q4' is not one of f32, f16, int8"):
        caches.FullKV(2, 1, 2, kind="q4")


@pytest.mark.parametrize("arch", ARCHS)
def test_caches_snapshot_and_full_kv_trims_for_prefix_reuse(model, arch):
    """A turn taken back by restoring a copy() of every cache leaves the next turn's logits as one
    pass gives them; a full-attention layer trimmed back to a prefix re-runs what follows exactly."""
    m, ref = model(arch), np.load(ARCH_FIXTURES / arch / "reference.npz")
    ids, cut = ref["input_ids"], len(ref["input_ids"]) - 4
    m.forward(ids[:cut])
    snap, pos = [c.copy() for c in m.caches], m.pos
    m.forward(np.array([5, 6, 7]))  # a turn that is then taken back
    m.caches, m.pos = snap, pos
    assert rel_err(m.forward(ids[cut:]), ref["logits"][cut:]) <= 1e-4
    long = np.load(ARCH_FIXTURES / arch / "long.npz")
    i = m.types.index("full_attention")
    x, want = long[f"L{i}.self_attn.in0"], long[f"L{i}.self_attn.out0"]
    m.caches[i] = m.new_cache(i)
    m.mixer(i, x[:12], np.arange(12))
    m.caches[i].trim(6)  # positions 6.. are edited away, then re-run
    assert rel_err(m.mixer(i, x[6:], np.arange(6, len(x))), want[6:]) <= 1e-5
    with pytest.raises(ValueError, match="cannot trim"):
        m.caches[i].trim(len(x) + 1)


# ---- against transformers' modules ---------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_rope_tables_match_transformers(model, arch):
    m, got = model(arch), modules(arch)
    T = len(np.load(ARCH_FIXTURES / arch / "reference.npz")["input_ids"])
    for i, t in enumerate(m.types):
        key = f"rope.{t}" if f"rope.{t}.cos" in got else "rope.all"
        if f"{key}.cos" not in got:
            continue  # no rope on this layer kind
        cos, sin = m.rope_tables(i, np.arange(T))
        np.testing.assert_allclose(cos, got[f"{key}.cos"][:, :cos.shape[1]], rtol=0, atol=2e-6)
        np.testing.assert_allclose(sin, got[f"{key}.sin"][:, :sin.shape[1]], rtol=0, atol=2e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_each_mixer_matches_transformers(model, arch):
    m, got = model(arch), modules(arch)
    for i, t in enumerate(m.types):
        name = {"linear_attention": "linear_attn", "conv": "conv"}.get(t, "self_attn")
        x = got[f"L{i}.{name}.in0"]
        y = m.mixer(i, x, np.arange(len(x)))
        assert rel_err(y, got[f"L{i}.{name}.out0"]) <= 1e-5, f"layer {i} ({t})"


def test_delta_rule_matches_transformers_core():
    got = modules("qwen3_5_moe")
    for i in (0, 2):
        q, k, v, g, beta = (got[f"L{i}.delta.{n}"] for n in ("q", "k", "v", "g", "beta"))
        s0 = np.zeros((v.shape[1], q.shape[2], v.shape[2]), np.float32)
        out = np.empty_like(v)
        deltanet.delta_rule(q, k, v, g, beta, s0.copy(), False, deltanet.work_for(*s0.shape[:2], v.shape[2]), out)
        assert rel_err(out, got[f"L{i}.delta.out"]) <= 1e-5
        assert rel_err(deltanet.delta_rule_chunked_ref(q, k, v, g, beta, s0, chunk=8)[0], got[f"L{i}.delta.out"]) <= 1e-5


@pytest.mark.parametrize("arch", ARCHS)
def test_each_feed_forward_block_matches_transformers(model, arch):
    m, got = model(arch), modules(arch)
    block = {"lfm2_moe": "feed_forward"}.get(arch, "mlp")
    for i in range(len(m.types)):
        if arch == "gemma4":  # the MoE half is routed from the raw residual: check router and experts apart
            x = got[f"L{i}.router.in0"]
            probs, ids, wts = ffn.route_gemma4(x, m.w[f"model.layers.{i}.router.proj.weight"],
                                               m.w[f"model.layers.{i}.router.scale"],
                                               m.w[f"model.layers.{i}.router.per_expert_scale"], 2, m.eps)
            assert rel_err(probs, got[f"L{i}.router.out0"]) <= 1e-5
            assert rel_err(wts, got[f"L{i}.router.out1"]) <= 1e-5
            y = m.experts(f"model.layers.{i}.experts.", got[f"L{i}.experts.in0"], ids, wts)
            assert rel_err(y, got[f"L{i}.experts.out0"]) <= 1e-5
            continue
        y, scores = m.ffn(i, got[f"L{i}.{block}.in0"])
        assert rel_err(y, got[f"L{i}.{block}.out0"]) <= 1e-5, f"layer {i}"


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_hidden_states_and_routers_match_transformers(model, arch):
    m, ref = model(arch), np.load(ARCH_FIXTURES / arch / "reference.npz")
    dump = {}
    logits = m.forward(ref["input_ids"], dump)
    assert rel_err(logits, ref["logits"]) <= 1e-4  # measured 1e-6 - 9e-6
    hs = ref["hidden_states"]  # measured <= 1.1e-5 (qwen3.5's f32 DeltaNet state, summed in another order)
    for i in range(len(hs) - 1):
        assert rel_err(dump["hidden"][i], hs[i]) <= 3e-5, f"hidden state {i}"
    assert rel_err(dump["final_norm"], hs[-1]) <= 3e-5
    for j, r in enumerate(dump.get("router", [])):
        assert rel_err(r, ref["router_logits"][j]) <= 3e-5, f"router {j}"


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_decode_with_caches_matches_transformers(model, arch):
    """Prefill the prompt in one chunk, then decode one token at a time through the caches."""
    m, ref = model(arch), np.load(ARCH_FIXTURES / arch / "reference.npz")
    nxt = int(m.forward(ref["input_ids"])[-1].argmax())
    got = [nxt]
    while len(got) < len(ref["greedy_ids"]):
        got.append(int(m.forward(np.array([got[-1]]))[-1].argmax()))
    assert got == ref["greedy_ids"].tolist()


@pytest.mark.parametrize("chunk", [1, 7])
@pytest.mark.parametrize("arch", ARCHS)
def test_long_sequence_in_pieces_is_exact_and_memory_flat(model, arch, chunk):
    """4x the sliding window (qwen3.5: 40 tokens of DeltaNet), as a 3-token prefill then pieces of
    `chunk` tokens (7: more than the window of 5, so a piece pushes out keys its own first queries
    need): each mixer's outputs equal transformers' one-pass outputs, and the ring buffers and
    recurrent states stop growing once full."""
    m, long = model(arch), np.load(ARCH_FIXTURES / arch / "long.npz")
    for i, t in enumerate(m.types):
        name = {"linear_attention": "linear_attn", "conv": "conv"}.get(t, "self_attn")
        x, want = long[f"L{i}.{name}.in0"], long[f"L{i}.{name}.out0"]
        m.caches[i] = m.new_cache(i)
        sizes, outs = [], [m.mixer(i, x[:3], np.arange(3))]
        for p in range(3, len(x), chunk):
            outs.append(m.mixer(i, x[p:p + chunk], np.arange(p, min(p + chunk, len(x)))))
            sizes.append(m.caches[i].nbytes)
        assert rel_err(np.concatenate(outs), want) <= 1e-5, f"layer {i} ({t})"
        if t != "full_attention":
            assert len(set(sizes)) == 1, f"layer {i} ({t}) grew: {sizes[0]} -> {sizes[-1]} bytes"
    if "sliding_window" in m.cfg:
        assert len(long["input_ids"]) >= 4 * m.cfg["sliding_window"]


@pytest.mark.parametrize("arch", ARCHS)
def test_llamacpp_teacher_forced_argmax_agrees_with_ours(model, arch):
    """llama.cpp ran the GGUF its converter made from this checkpoint: its argmax after each position
    (where its top-1/top-2 margin is >= 0.05) must be ours at >= 98% of them."""
    rec = json.loads((ARCH_FIXTURES / arch / "llamacpp.json").read_text())
    assert "refused" not in rec, rec.get("refused")
    m = model(arch)
    for name, run in rec["runs"].items():
        m.reset()
        ours = m.forward(np.array(run["ids"])).argmax(-1)
        confident = np.array(run["margins"]) >= 0.05
        agree = (ours == np.array(run["argmax"]))[confident]
        assert agree.mean() >= 0.98, f"{name}: {agree.sum()}/{len(agree)}"


def test_rope_frequencies_at_the_released_models_shapes_match_transformers():
    """rope_real.npz: transformers' frequencies for gpt-oss-20b (yarn, both truncations: they differ
    by up to 2e-4 rad/token there, which llama.cpp's always-truncating yarn inherits), Qwen3.5-35B-A3B
    (64 of 256 dims turn) and Gemma-4-26B-A4B (proportional on 512-dim heads, default on 256)."""
    want = np.load(ARCH_FIXTURES / "rope_real.npz")
    for truncate in (False, True):
        inv, factor = rope.yarn_inv_freq(150000.0, 64, 32.0, 4096, 32.0, 1.0, truncate)
        np.testing.assert_allclose(inv, want[f"gpt_oss_truncate_{truncate}"], rtol=1e-6, atol=0)
        assert factor == pytest.approx(float(want[f"gpt_oss_truncate_{truncate}_factor"]), rel=1e-6)
    assert np.abs(want["gpt_oss_truncate_False"] - want["gpt_oss_truncate_True"]).max() > 1e-4
    np.testing.assert_allclose(rope.default_inv_freq(10000000.0, 256, 0.25), want["qwen3_5_moe"], rtol=1e-6)
    np.testing.assert_allclose(rope.proportional_inv_freq(1000000.0, 512, 0.25), want["gemma4_full"], rtol=1e-6)
    np.testing.assert_allclose(rope.default_inv_freq(10000.0, 256), want["gemma4_sliding"], rtol=1e-6)
