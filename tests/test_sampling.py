"""The sampler: filters behave as documented, and the same seed repeats itself."""
from __future__ import annotations

import numpy as np
import pytest

from engine.sampling import REPEAT_LAST_N, Sampler
from engine.tokenizer import StopMatcher

LOGITS = np.log(np.array([0.05, 0.5, 0.3, 0.15], np.float32))
NO_FILTERS = dict(top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)


def draws(n=20000, **kw):
    s = Sampler(**{**NO_FILTERS, **kw, "seed": kw.get("seed", 1)})
    return np.bincount([s.sample(LOGITS, []) for _ in range(n)], minlength=4) / n


def test_temperature_one_follows_the_distribution():
    np.testing.assert_allclose(draws(temperature=1.0), [0.05, 0.5, 0.3, 0.15], atol=0.015)


def test_greedy_and_filters():
    assert Sampler(temperature=0).sample(LOGITS, []) == 1
    assert draws(2000, temperature=1.0, top_k=1)[1] == 1.0
    np.testing.assert_allclose(draws(temperature=1.0, top_k=2), [0, 0.5 / 0.8, 0.3 / 0.8, 0], atol=0.015)
    np.testing.assert_allclose(draws(temperature=1.0, top_p=0.75), [0, 0.5 / 0.8, 0.3 / 0.8, 0], atol=0.015)
    np.testing.assert_allclose(draws(temperature=1.0, min_p=0.5), [0, 0.5 / 0.8, 0.3 / 0.8, 0], atol=0.015)
    cold = draws(temperature=0.2)
    assert cold[1] > 0.9  # low temperature sharpens


def test_repetition_penalty_demotes_recent_tokens():
    s = Sampler(temperature=0, repeat_penalty=2.0)
    assert s.sample(LOGITS, [1]) == 2  # 0.5 -> logit/2 ... token 1 loses its lead
    assert s.sample(LOGITS, [1] + [3] * REPEAT_LAST_N) == 1  # only the last 64 tokens count


def test_seed_repeats():
    a = Sampler(temperature=1.0, seed=5)
    b = Sampler(temperature=1.0, seed=5)
    assert [a.sample(LOGITS, []) for _ in range(50)] == [b.sample(LOGITS, []) for _ in range(50)]


@pytest.mark.parametrize("kw,fragment", [({"temperature": -1}, "temperature"), ({"top_p": 2}, "top_p"),
                                         ({"min_p": -0.1}, "min_p"), ({"top_k": -3}, "top_k"),
                                         ({"repeat_penalty": 11}, "repeat_penalty"), ({"repeat_penalty": 0}, "repeat_penalty"),
                                         ({"seed": -1}, "seed")])
def test_out_of_range_names_the_parameter(kw, fragment):
    with pytest.raises(ValueError, match=f"{fragment}: .* out of range"):
        Sampler(**kw)


def test_stop_strings_are_never_partly_shown():
    m = StopMatcher(("</answer>",))
    shown = []
    for piece in ["The answer", " is 4</", "ans", "wer> and more"]:
        out, hit = m.push(piece)
        shown.append(out)
        if hit:
            break
    assert "".join(shown) == "The answer is 4" and hit
    m = StopMatcher(("STOP",))
    assert m.push("no S") == ("no ", False) and m.push("and") == ("Sand", False)
