"""colibri-serve's structured output with real parts: uvicorn on a free loopback port, the default
model, the official openai client; replies held to response_format (json_object, json_schema) or a
grammar, streamed and whole, validated with jsonschema; and a remote backend passing it through."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from app import server as S
from app.remote import RemoteBackend, RemoteError
from engine.api import Engine

EVENT = {"type": "object", "additionalProperties": False, "required": ["title", "year", "places"],
         "properties": {"title": {"type": "string", "minLength": 1, "maxLength": 40},
                        "year": {"type": "integer", "minimum": 1000, "maximum": 2026},
                        "places": {"type": "array", "minItems": 1, "maxItems": 3,
                                   "items": {"type": "object", "required": ["city", "kind"], "additionalProperties": False,
                                             "properties": {"city": {"type": "string", "maxLength": 30},
                                                            "kind": {"enum": ["capital", "port", "village"]}}}},
                        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}}
ASK = [{"role": "system", "content": "You answer with JSON only."},
       {"role": "user", "content": "Give a historical event as JSON."}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "event", "schema": EVENT, "strict": True}}


@pytest.fixture(scope="module")
def engine(default_converted):
    eng = Engine(default_converted, threads=2, kv_cache_quantize="f32", context_length=512)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine):
    handle = S.start(engine, "127.0.0.1", 0)
    assert handle.service.scheduler.warmed.wait(600)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


def streamed(client, server, messages=ASK, **kw) -> tuple[str, str]:
    text, finish = "", None
    for c in client.chat.completions.create(model=server.model_id, messages=messages, stream=True, **kw):
        if c.choices:
            text += c.choices[0].delta.content or ""
            finish = c.choices[0].finish_reason or finish
    return text, finish


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_replies_validate(client, server, stream):
    for seed, temperature in ((None, 0.0), (7, 1.0)):
        kw = dict(response_format=FORMAT, max_tokens=300, temperature=temperature, seed=seed)
        if stream:
            text, finish = streamed(client, server, **kw)
        else:
            out = client.chat.completions.create(model=server.model_id, messages=ASK, **kw)
            text, finish = out.choices[0].message.content, out.choices[0].finish_reason
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), EVENT)


@pytest.mark.parametrize("stream", [False, True])
def test_json_object_replies_parse(client, server, stream):
    # any object: a question with a short answer, as a 135M model may otherwise add keys up to max_tokens
    cat = [{"role": "user", "content": "Describe a cat in JSON with keys name and color."}]
    kw = dict(response_format={"type": "json_object"}, max_tokens=300, temperature=0.9, seed=3)
    if stream:
        text, finish = streamed(client, server, cat, **kw)
    else:
        out = client.chat.completions.create(model=server.model_id, messages=cat, **kw)
        text, finish = out.choices[0].message.content, out.choices[0].finish_reason
    assert finish == "stop" and isinstance(json.loads(text), dict), text


def test_a_lark_grammar_field_and_raw_completions(client, server):
    lark = 'start: "Answer: " ("yes" | "no") "."'
    out = client.chat.completions.create(model=server.model_id, messages=ASK, temperature=1.0, seed=1,
                                         extra_body={"grammar": lark})
    assert re.fullmatch(r"Answer: (yes|no)\.", out.choices[0].message.content)
    out = client.completions.create(model=server.model_id, prompt="The year:", max_tokens=20, temperature=0,
                                    extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                        "name": "y", "schema": {"type": "integer", "minimum": 1, "maximum": 3000}}}})
    assert 1 <= json.loads(out.choices[0].text) <= 3000 and out.choices[0].finish_reason == "stop"


def test_an_unsupported_keyword_is_a_400_naming_it(client, server):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "if": {"required": ["a"]},
              "then": {"required": ["a"]}}
    for strict in (True, False):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=server.model_id, messages=ASK, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}})
        err = e.value.body
        assert "if" in err["message"] and err["param"] == "response_format" and err["code"] == "unsupported"
    bad = [({"type": "xml"}, "response_format"), ({"type": "json_schema"}, "response_format"),
           ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "nope"}}},
            "response_format")]
    for fmt, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=server.model_id, messages=ASK, response_format=fmt)
        assert e.value.body["param"] == param, fmt
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server.model_id, messages=ASK, extra_body={"grammar": "start: nothing"})
    assert e.value.body["param"] == "grammar" and "nothing" in e.value.body["message"]
    out = client.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=4, temperature=0)
    assert out.choices[0].message.content  # still serving


def test_a_remote_backend_passes_the_schema_through(server):
    remote = RemoteBackend(server.url)
    try:
        text = "".join(s.text for s in remote.generate(ASK, grammar=EVENT, max_tokens=300, temperature=0))
        jsonschema.validate(json.loads(text), EVENT)
        with pytest.raises(RemoteError, match="JSON schema"):
            list(remote.generate(ASK, grammar='start: "a"'))
    finally:
        remote.close()
