"""Constrained decoding (engine/grammar.py) on the real default model: llguidance's view of the
tokenizer, the mask the sampler applies, and replies that fit their JSON schema, regex or grammar."""
from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from engine import grammar as G
from engine import params as P
from engine.api import Engine

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}}}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]


@pytest.fixture(scope="module")
def engine(default_converted):
    eng = Engine(default_converted, threads=2, kv_cache_quantize="f32", context_length=512)
    yield eng
    eng.close()


def text_of(steps) -> tuple[str, str]:
    steps = list(steps)
    return "".join(s.text for s in steps), steps[-1].finish_reason


def test_tokenizer_view_is_built_once_and_reads_tokens_as_the_codec_does(engine):
    codec = engine.codec
    view = G.tokenizer_view(codec, engine.cfg.vocab_size)
    assert G.tokenizer_view(codec, engine.cfg.vocab_size) is view
    assert sorted(view.eos_tokens) == sorted(codec.stop_ids) != []
    assert view.vocab_size >= engine.cfg.vocab_size
    for name, i in codec.special_ids.items():  # control tokens are never text a grammar could emit
        assert view.is_special_token(i), name
    text = 'Ünïcødé 🚀 "quotes" {braces}\n\ttabs, 中文 and émoji'  # multi-byte characters split over byte tokens
    ids = codec.encode(text, add_bos=False)
    assert view.decode_bytes(ids) == text.encode()
    assert all(view.decode_bytes([i]) == codec.tok.decode([i]).encode() or "\ufffd" in codec.tok.decode([i])
               for i in ids)


def test_the_mask_allows_exactly_the_tokens_that_continue_the_grammar(engine):
    c = G.constraint('start: "yes" | "no"', engine.codec, engine.cfg.vocab_size)
    allowed = c.allowed()
    assert allowed.shape == (engine.cfg.vocab_size,)
    for i in np.flatnonzero(allowed):
        piece = engine.codec.tok.decode([int(i)])
        assert piece and ("yes".startswith(piece) or "no".startswith(piece)), piece
    assert allowed[engine.codec.encode("yes", add_bos=False)[0]] and allowed[engine.codec.encode("no", add_bos=False)[0]]
    logits = np.random.default_rng(0).standard_normal(engine.cfg.vocab_size).astype(np.float32)
    masked = c.mask(logits)
    assert np.array_equal(masked[allowed], logits[allowed]) and np.all(masked[~allowed] == -np.inf)
    from engine.sampling import Sampler
    for settings in ({"temperature": 2.0, "top_k": 40}, {"temperature": 2.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
                     {"temperature": 2.0, "repeat_penalty": 1.3}, {"temperature": 0.0}):
        s = Sampler(**settings, seed=1)
        assert all(allowed[s.sample(masked, [1, 2, 3])] for _ in range(200)), settings


def test_json_schema_replies_validate_greedy_and_sampled(engine):
    for seed, temperature in ((None, 0.0), (1, 1.0), (2, 1.2), (3, 1.5)):
        text, finish = text_of(engine.generate(ASK, grammar=PERSON, max_tokens=200, temperature=temperature,
                                               seed=seed, top_k=0 if seed == 3 else 40))
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), PERSON)


def test_regex_and_lark_grammars_end_the_reply_where_they_end(engine):
    text, finish = text_of(engine.generate("Today's date is", grammar=G.regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
                                           temperature=1.0, seed=4))
    assert finish == "stop" and re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text), text
    lark = 'start: answer " because " reason\nanswer: "yes" | "no"\nreason: /[a-z ]{1,30}/ "."'
    text, finish = text_of(engine.generate(ASK, grammar=lark, temperature=0.8, seed=5, max_tokens=60))
    assert finish == "stop" and re.fullmatch(r"(yes|no) because [a-z ]{1,30}\.", text), text
    cat = [{"role": "user", "content": "Describe a cat in JSON with keys name and color."}]
    text, finish = text_of(engine.generate(cat, grammar=G.json_object(), temperature=0, max_tokens=300))
    assert finish == "stop" and isinstance(json.loads(text), dict), text


def test_a_cut_reply_says_length_and_free_text_is_unchanged(engine):
    text, finish = text_of(engine.generate(ASK, grammar={"type": "array", "items": {"type": "string"}},
                                           temperature=0, max_tokens=3))
    assert finish == "length" and text.startswith("[")
    free = text_of(engine.generate(ASK, temperature=0, max_tokens=8))
    assert text_of(engine.generate(ASK, temperature=0, max_tokens=8, grammar=None)) == free


def test_a_grammar_llguidance_cannot_enforce_is_refused_before_anything_runs(engine):
    with pytest.raises(G.GrammarError, match='"if"') as e:
        engine.generate(ASK, grammar={"type": "object", "if": {"required": ["a"]}})
    assert G.unsupported_keywords(str(e.value)) == ["if"]
    with pytest.raises(G.GrammarError, match="unknown name"):
        engine.generate(ASK, grammar="start: missing_rule")
    with pytest.raises(G.GrammarError):
        G.check(G.json_schema({"type": "string", "format": "no-such-format"}))


def test_the_parameter_takes_a_schema_as_a_dict_or_its_json_text():
    schema_text = P.check("grammar", PERSON)
    assert P.check("grammar", json.dumps(PERSON)) == schema_text == json.dumps(PERSON)  # kept as written
    assert G.compiled(schema_text) == G.json_schema(PERSON) == G.compiled(G.json_schema(PERSON))
    assert G.schema_of(schema_text) == PERSON == G.schema_of(G.json_schema(PERSON))
    assert G.schema_of(G.regex("a+")) is None and G.schema_of('start: "a"') is None
    assert P.check("grammar", 'start: "a"') == 'start: "a"' and P.check("grammar", "none") is None
    with pytest.raises(ValueError, match="grammar"):
        P.check("grammar", 5)
    for bad in ("{not json", "{} {}"):
        with pytest.raises(ValueError, match="grammar"):
            P.check("grammar", bad)
