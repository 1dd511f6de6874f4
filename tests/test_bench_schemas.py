"""colibri-bench schemas' set: 50+ JSON schemas of every kind the target names, each one a valid
JSON Schema that llguidance compiles (the bench would otherwise measure refusals); its validity check."""
from __future__ import annotations

import json

import jsonschema

from app.bench.schema_set import SCHEMAS
from app.bench.schemas import _valid
from engine import grammar as G


def _walk(node):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def test_the_set_has_fifty_schemas_of_every_kind_and_each_compiles():
    assert len(SCHEMAS) >= 50 and len({name for name, _, _ in SCHEMAS}) == len(SCHEMAS)
    seen = set()
    for _name, _, schema in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schema)
        G.check(G.json_schema(schema))
        for node in _walk(schema):
            seen |= {k for k in ("enum", "required", "pattern", "format", "minimum", "maximum", "items", "$ref",
                                 "anyOf", "oneOf") if k in node}
            if node.get("type") == "object" and any(isinstance(p, dict) and p.get("type") == "object"
                                                    for p in node.get("properties", {}).values()):
                seen.add("nested")
    assert seen >= {"enum", "required", "pattern", "format", "minimum", "maximum", "items", "nested"}
    formats = {n["format"] for _, _, s in SCHEMAS for n in _walk(s) if "format" in n}
    assert formats >= {"email", "date", "date-time", "uri", "uuid"}


def test_validity_means_json_that_validates_formats_included():
    schema = {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}, "required": ["d"]}
    assert _valid(json.dumps({"d": "2024-02-29"}), schema) is None
    assert _valid(json.dumps({"d": "yesterday"}), schema).startswith("invalid")
    assert _valid('{"d": "2024-', schema).startswith("not JSON")
