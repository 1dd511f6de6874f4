"""Speculative decoding (engine.speculative): n-gram drafts verified in one batched step give the
plain decoder's tokens (greedy: the same tokens; sampled: the same distribution), the cache keeps
exactly the accepted positions, and models whose states cannot be rolled back do not speculate."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import HF_FIXTURES

from engine.api import Engine
from engine.convert.convert import convert
from engine.speculative import NgramIndex, accept

PARAGRAPH = ("The committee met on Tuesday to review the budget. It agreed to fund the new library, to repair "
             "the bridge on Mill Street and to hire two more teachers for the primary school next year.")
REPEAT = [{"role": "user", "content": "Copy this paragraph word for word:\n\n" + PARAGRAPH}]


def _chi2_crit(df: int, z: float = 3.29) -> float:
    """The chi-square value a df-degree statistic exceeds with probability about 5e-4 (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def _tokens(e: Engine, prompt, **kw) -> list[int]:
    e.reset()
    return [s.token_id for s in e.generate(prompt, **kw) if s.token_id is not None]


def test_ngram_index_drafts_what_followed_the_longest_match():
    idx = NgramIndex()
    toks = [1, 2, 3, 4, 5, 9, 2, 3, 4]
    assert idx.draft(toks, 3) == [5, 9, 2]  # "2 3 4" (a 3-gram) came before, followed by 5 9 2
    toks += [7, 8]
    assert idx.draft(toks, 3) == []  # "7 8" never came before: no draft, a plain step
    toks += [1, 2]
    assert idx.draft(toks, 2) == [3, 4]  # the index grew with the list
    toks += [3, 4]
    assert idx.draft(toks, 4) == [5, 9, 2, 3]  # the longest match: "1 2 3 4", not the later "2 3 4"
    toks += [7, 9, 2, 3, 4]
    assert idx.draft(toks, 2) == [7, 8]  # "9 2 3 4" twice before: the latest occurrence


@pytest.mark.parametrize("settings", [dict(temperature=0.8, top_k=5, top_p=1.0, min_p=0.0),
                                      dict(temperature=1.3, top_k=0, top_p=0.9, min_p=0.02, repeat_penalty=1.3)])
def test_acceptance_rule_keeps_the_samplers_distribution(settings):
    """accept() with any drafted token (likely, unlikely, impossible) draws from the plain distribution."""
    from engine.sampling import Sampler, reference_distribution
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(64) * 2).astype(np.float32)
    history = [3, 5, 5, 9]
    s = Sampler(seed=1, **settings)
    p = reference_distribution(logits, history, s.temperature, s.top_k, s.top_p, s.min_p, s.repeat_penalty)
    n = 20000
    for draft in (int(np.argmax(p)), int(np.argsort(p)[-3]), int(np.argmin(p))):
        counts = np.bincount([accept(s, logits, history, draft) for _ in range(n)], minlength=64)
        assert counts[p == 0].sum() == 0
        live = p > 0
        stat = float((((counts[live] - n * p[live]) ** 2) / (n * p[live])).sum())
        assert stat < _chi2_crit(max(1, int(live.sum()) - 1)), (draft, stat)


@pytest.fixture(scope="module")
def default_engine(default_converted):
    e = Engine(default_converted, threads=2)
    yield e
    e.close()


def test_greedy_speculation_gives_the_plain_tokens_on_the_default_model(default_engine):
    e = default_engine
    plain = _tokens(e, REPEAT, temperature=0, max_tokens=60, speculative="off")
    before = e.stats().speculative["accepted"]
    spec = _tokens(e, REPEAT, temperature=0, max_tokens=60, speculative="ngram")
    st = e.stats().speculative
    assert spec == plain
    assert st["accepted"] > before and st["state"] == "on"
    assert e.cache.length == len(e.tokens)  # the rejected drafts' positions are not kept
    # the next turn continues from the cache the speculative reply left: as it would from a plain one
    follow = REPEAT + [{"role": "assistant", "content": e.detokenize(spec)}, {"role": "user", "content": "Again."}]
    assert _tokens(e, follow, temperature=0, max_tokens=12, speculative="ngram") == \
        _tokens(e, follow, temperature=0, max_tokens=12, speculative="off")


@pytest.fixture(scope="module")
def moe_engine(tmp_path_factory):
    out = tmp_path_factory.mktemp("spec") / "qwen3_moe"
    convert(HF_FIXTURES / "qwen3_moe", out, "keep")
    e = Engine(out, threads=2, kv_cache_quantize="f32")
    yield e
    e.close()


def test_greedy_speculation_gives_the_plain_tokens_on_a_moe(moe_engine):
    e = moe_engine
    prompt = "one two three four five one two three four five one two three"
    plain = _tokens(e, prompt, temperature=0, max_tokens=40, speculative="off")
    spec = _tokens(e, prompt, temperature=0, max_tokens=40, speculative="ngram")
    assert spec == plain
    assert e.stats().speculative["accepted"] > 0


def test_sampled_speculation_keeps_the_distribution_over_seeds(moe_engine):
    """The tokens after a drafted position, over many seeds, with and without speculation: one
    distribution (a two-sample chi-square test on each of the first eight generated positions)."""
    e = moe_engine
    prompt = "one two three four five one two three four five one two three four five "  # (ends as it repeats)
    before = e.stats().speculative["drafted"]
    n, kw = 300, dict(temperature=0.3, top_k=3, top_p=1.0, min_p=0.0, max_tokens=12)
    runs = {m: [_tokens(e, prompt, seed=s, speculative=m, **kw) for s in range(n)] for m in ("off", "ngram")}
    assert e.stats().speculative["drafted"] > before
    for pos in range(8):
        a = [r[pos] for r in runs["off"] if len(r) > pos]
        b = [r[pos] for r in runs["ngram"] if len(r) > pos]
        cats = sorted(set(a) | set(b))
        ca = np.array([a.count(c) for c in cats], float)
        cb = np.array([b.count(c) for c in cats], float)
        tot = ca + cb
        ea, eb = tot * len(a) / (len(a) + len(b)), tot * len(b) / (len(a) + len(b))
        stat = float((((ca - ea) ** 2) / ea + ((cb - eb) ** 2) / eb).sum())
        assert stat < _chi2_crit(max(1, len(cats) - 1)), (pos, stat, cats)


def test_a_seeded_sampled_reply_is_the_same_text_under_auto(moe_engine):
    """auto's switches follow timings: with a seed it leaves sampled replies alone."""
    e = moe_engine
    kw = dict(temperature=0.9, seed=7, max_tokens=20)
    prompt = "one two three four five one two three four five one two three"
    assert _tokens(e, prompt, speculative="auto", **kw) == _tokens(e, prompt, speculative="off", **kw)


def test_models_with_states_that_cannot_roll_back_do_not_speculate(tmp_path):
    from arch_reference import ARCH_FIXTURES
    out = tmp_path / "lfm2"
    convert(ARCH_FIXTURES / "lfm2_moe", out, "f32")
    with Engine(out, threads=2) as e:
        e.reset()
        plain = _tokens(e, "a b c a b c a b", temperature=0, max_tokens=8, speculative="off")
        assert _tokens(e, "a b c a b c a b", temperature=0, max_tokens=8, speculative="ngram") == plain
        st = e.stats().speculative
        assert st["drafted"] == 0 and st["state"].startswith("off (recurrent")
