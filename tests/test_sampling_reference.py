"""The fast sampler against the straightforward definition (a full sort of the vocabulary), its
Numba kernels against their numpy twins, and the edge cases."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from engine.sampling import REPEAT_LAST_N, Sampler, SamplingError, reference_distribution, top_candidates

RNG = np.random.default_rng(7)


def dense(sampler: Sampler, logits: np.ndarray, history: list[int]) -> np.ndarray:
    idx, p = sampler.distribution(logits, history)
    assert len(set(idx.tolist())) == len(idx), "a token listed twice"
    out = np.zeros(len(logits))
    out[idx] = p
    return out


def random_logits(v: int, ties: bool = False) -> np.ndarray:
    x = RNG.standard_normal(v).astype(np.float32) * 3
    return np.round(x * 2) / 2 if ties else x  # rounded: many exact ties


@pytest.mark.parametrize("ties", [False, True])
def test_top_candidates_hold_the_m_largest(ties):
    for v, m in [(1, 1), (7, 3), (500, 5), (500, 40), (500, 500), (3000, 104), (49152, 40), (49157, 1)]:
        x = random_logits(v, ties)
        x[RNG.integers(0, v, max(1, v // 50))] = -np.inf
        got = top_candidates(x, m)
        assert np.all(np.diff(got) > 0) and len(got) >= min(m, v)
        kth = np.sort(x)[::-1][min(m, v) - 1]  # every token >= the m-th largest value must be there
        np.testing.assert_array_equal(np.intersect1d(got, np.flatnonzero(x >= kth)), np.flatnonzero(x >= kth))


SETTINGS = list(itertools.product([0.0, 0.7, 1.5], [0, 1, 5, 40, 10_000], [1.0, 0.95, 0.5, 1e-9], [0.0, 0.05, 1.0]))
PENALTIES = [{}, {"repeat_penalty": 1.3}, {"frequency_penalty": 0.5, "presence_penalty": 0.3},
             {"presence_penalty": -1.5}, {"repeat_penalty": 0.8, "frequency_penalty": -0.4}]


@pytest.mark.parametrize("penalty", PENALTIES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "none")
@pytest.mark.parametrize("ties", [False, True])
def test_distribution_is_the_definition(penalty, ties):
    for temperature, top_k, top_p, min_p in SETTINGS:
        logits = random_logits(700, ties)
        history = RNG.integers(0, 700, 90).tolist()  # repeats, and older tokens beyond the window
        settings = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, **penalty)
        want = reference_distribution(logits, history, **settings)
        got = dense(Sampler(**settings, seed=0), logits, history)
        np.testing.assert_allclose(got, want, atol=1e-12, err_msg=str(settings))


def test_distribution_on_a_real_vocabulary_size():
    logits = random_logits(49152)
    history = RNG.integers(0, 49152, 200).tolist()
    for settings in [{"temperature": 0.7, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
                     {"temperature": 0.7, "top_k": 0, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.1},
                     {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "frequency_penalty": 1.0}]:
        want = reference_distribution(logits, history, **settings)
        np.testing.assert_allclose(dense(Sampler(**settings), logits, history), want, atol=1e-12)


@pytest.mark.parametrize("settings", [{"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
                                      {"temperature": 0.7, "top_k": 3, "top_p": 0.95, "min_p": 0.05},
                                      {"temperature": 1.3, "top_k": 0, "top_p": 0.8, "min_p": 0.0, "repeat_penalty": 1.5}])
def test_draws_follow_the_definition(settings):
    logits = np.log(np.array([0.05, 0.3, 0.1, 0.25, 0.2, 0.1], np.float32))
    history = [1, 3, 3]
    s, n = Sampler(**settings, seed=3), 20000
    freq = np.bincount([s.sample(logits, history) for _ in range(n)], minlength=6) / n
    np.testing.assert_allclose(freq, reference_distribution(logits, history, **settings), atol=0.015)


def test_greedy_is_exactly_argmax():
    for _ in range(200):
        logits = random_logits(int(RNG.integers(1, 3000)), ties=bool(RNG.integers(2)))
        assert Sampler(temperature=0.0).sample(logits, [5, 6]) == int(np.argmax(logits))
    logits = np.array([-np.inf, 2.0, 3.0, -np.inf, 3.0], np.float32)
    assert Sampler(temperature=0.0).sample(logits, []) == 2


def test_edge_settings():
    logits = random_logits(1000)
    top = int(np.argmax(logits))
    assert all(Sampler(top_k=1, temperature=1.5, seed=i).sample(logits, []) == top for i in range(20))
    assert all(Sampler(top_k=0, top_p=1e-9, min_p=0.0, seed=i).sample(logits, []) == top for i in range(20))
    assert all(Sampler(top_k=0, top_p=1.0, min_p=1.0, seed=i).sample(logits, []) == top for i in range(20))
    tied = np.array([1.0, 5.0, 2.0, 5.0], np.float32)
    assert sorted(Sampler(min_p=1.0, seed=0).distribution(tied, [])[0].tolist()) == [1, 3]
    assert Sampler(top_k=1).sample(tied, []) == 1  # ties: the lower id, as a stable sort has it


@pytest.mark.parametrize("bad,fragment", [(np.nan, "token 3 is nan"), (np.inf, "token 3 is inf")])
@pytest.mark.parametrize("penalty", [1.0, 1.2])
@pytest.mark.parametrize("settings", [{"temperature": 0.0}, {}, {"top_k": 0}, {"top_k": 0, "top_p": 1.0, "min_p": 0.0}])
def test_non_finite_logits_are_a_clear_error(bad, fragment, settings, penalty):
    logits = random_logits(50)
    logits[[3, 30]] = bad
    with pytest.raises(SamplingError, match=fragment):
        Sampler(**settings, repeat_penalty=penalty).sample(logits, [3, 4])


@pytest.mark.parametrize("settings", [{"temperature": 0.0}, {}, {"top_k": 0}])
def test_all_minus_inf_is_a_clear_error(settings):
    with pytest.raises(SamplingError, match="every logit is -inf"):
        Sampler(**settings).sample(np.full(10, -np.inf, np.float32), [])


def test_frequency_and_presence_penalties():
    logits = np.array([1.0, 1.2, 0.9], np.float32)
    assert Sampler(temperature=0.0, presence_penalty=0.5).sample(logits, [1]) == 0
    assert Sampler(temperature=0.0, frequency_penalty=0.1).sample(logits, [1]) == 1  # 1.2 - 0.1 > 1.0
    assert Sampler(temperature=0.0, frequency_penalty=0.1).sample(logits, [1, 1, 1]) == 0  # 1.2 - 0.3
    assert Sampler(temperature=0.0, presence_penalty=-0.5).sample(logits, [2]) == 2  # negative: promotes
    assert Sampler(temperature=0.0, presence_penalty=0.5).sample(logits, [1] + [0] * REPEAT_LAST_N) == 1
    with pytest.raises(ValueError, match="frequency_penalty: .* out of range"):
        Sampler(frequency_penalty=3.0)


@pytest.mark.parametrize("ties", [False, True])
def test_one_call_sampler_draws_as_the_numpy_path(ties):
    """sample_top_k (sample()'s kernel for the chat defaults) against its numpy twin, distribution()
    and the cumulative search, for the same uniform number: the same token."""
    from engine.sampling import sample_top_k
    for temperature, top_k, top_p, min_p in [(0.7, 40, 0.95, 0.05), (1.0, 5, 1.0, 0.0), (1.5, 64, 0.5, 0.0),
                                             (0.3, 2, 0.9, 0.2)]:
        s = Sampler(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        for _ in range(20):
            logits = random_logits(3000, ties)
            idx, p = s.distribution(logits, [])
            c = np.cumsum(p)
            for u in RNG.random(5):
                want = int(idx[min(int(np.searchsorted(c, u * c[-1], side="right")), len(idx) - 1)])
                assert sample_top_k(logits, top_k, top_p, min_p, temperature, u) == want
    bad = random_logits(100)
    bad[7] = np.nan
    assert sample_top_k(bad, 4, 0.9, 0.0, 1.0, 0.5) == -1
    assert sample_top_k(np.full(10, -np.inf, np.float32), 4, 0.9, 0.0, 1.0, 0.5) == -2


def test_one_call_sampler_skips_only_blocks_that_cannot_hold_the_top_k():
    """A real vocabulary size with a ragged last block (SCAN_BLOCK logits a block): only blocks whose
    maximum reaches the k-th largest block maximum are scanned; with the top-k's ties spread over
    many blocks, a rising trend (each block beating the last) and -inf logits, the token is still
    the numpy path's. A NaN of either sign or +inf anywhere, the last block included, is found."""
    from engine.sampling import SCAN_BLOCK, sample_top_k
    V = 48 * SCAN_BLOCK + 77
    s = Sampler(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05)
    tied = np.round(RNG.standard_normal(V) * 2).astype(np.float32)  # many logits equal the 40th
    rising = (RNG.standard_normal(V) + np.linspace(-6, 0, V)).astype(np.float32)
    masked = random_logits(V)
    masked[::3] = -np.inf
    for logits in (tied, rising, masked, random_logits(V, ties=True)):
        idx, p = s.distribution(logits, [])
        c = np.cumsum(p)
        for u in RNG.random(8):
            want = int(idx[min(int(np.searchsorted(c, u * c[-1], side="right")), len(idx) - 1)])
            assert sample_top_k(logits, 40, 0.95, 0.05, 0.7, u) == want
    for at, value in ((V - 1, np.inf), (V - 40, -np.float32(np.nan)), (SCAN_BLOCK + 3, np.nan)):
        bad = random_logits(V)
        bad[at] = value
        assert sample_top_k(bad, 40, 0.95, 0.05, 0.7, 0.5) == -1
