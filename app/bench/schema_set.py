"""The JSON schemas colibri-bench schemas runs: each a (name, what to ask for, schema), covering
nested objects, arrays, enums, required fields, numbers with bounds, string patterns and formats."""
from __future__ import annotations

S, I, N, B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}


def obj(props: dict, required: list[str] | None = None, closed: bool = True) -> dict:
    out = {"type": "object", "properties": props, "required": list(props) if required is None else required}
    return out | ({"additionalProperties": False} if closed else {})


def text(n: int) -> dict:
    return {"type": "string", "minLength": 1, "maxLength": n}


def arr(items: dict, lo: int = 1, hi: int = 4) -> dict:
    return {"type": "array", "items": items, "minItems": lo, "maxItems": hi}


ADDRESS = obj({"street": text(40), "city": text(30), "zip": {"type": "string", "pattern": r"^[0-9]{5}$"}})

SCHEMAS: list[tuple[str, str, dict]] = [
    ("person", "a person", obj({"name": text(40), "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("city", "a city and its country", obj({"city": text(30), "country": text(30)})),
    ("book", "a book", obj({"title": text(60), "author": text(40), "year": {"type": "integer", "minimum": 1450,
                                                                            "maximum": 2026}})),
    ("color", "a colour", obj({"color": {"enum": ["red", "green", "blue", "yellow"]}})),
    ("yes_no", "whether the sky is blue", obj({"answer": {"type": "boolean"}})),
    ("rating", "a film rating", obj({"film": text(40), "stars": {"type": "integer", "minimum": 1, "maximum": 5}})),
    ("temperature", "today's weather", obj({"celsius": {"type": "number", "minimum": -60, "maximum": 60},
                                            "sky": {"enum": ["sunny", "cloudy", "rainy", "snowy"]}})),
    ("price", "a product and its price", obj({"product": text(40), "price": {"type": "number",
                                                                              "exclusiveMinimum": 0, "maximum": 10000},
                                              "currency": {"enum": ["EUR", "USD", "GBP", "JPY"]}})),
    ("tags", "three tags for a blog post about cooking", obj({"tags": arr(text(20), 1, 5)})),
    ("numbers", "a few prime numbers", obj({"primes": arr({"type": "integer", "minimum": 2, "maximum": 1000},
                                                          1, 8)})),
    ("address", "a postal address", ADDRESS),
    ("customer", "a customer with an address", obj({"name": text(40), "address": ADDRESS})),
    ("order", "a shop order", obj({"id": {"type": "string", "pattern": r"^ORD-[0-9]{6}$"},
                                   "items": arr(obj({"sku": {"type": "string", "pattern": r"^[A-Z]{3}[0-9]{3}$"},
                                                     "qty": {"type": "integer", "minimum": 1, "maximum": 99}}), 1, 3),
                                   "paid": B})),
    ("email", "a contact", obj({"name": text(40), "email": {"type": "string", "format": "email"}})),
    ("date", "a historical event", obj({"event": text(60), "date": {"type": "string", "format": "date"}})),
    ("datetime", "a meeting", obj({"title": text(40), "start": {"type": "string", "format": "date-time"}})),
    ("uri", "a web site", obj({"name": text(40), "url": {"type": "string", "format": "uri"}})),
    ("uuid", "a record id", obj({"id": {"type": "string", "format": "uuid"}})),
    ("time", "an alarm", obj({"label": text(30), "at": {"type": "string", "format": "time"}})),
    ("ipv4", "a server", obj({"host": text(30), "ip": {"type": "string", "format": "ipv4"}})),
    ("phone", "a phone number", obj({"phone": {"type": "string", "pattern": r"^\+[0-9]{2} [0-9]{3} [0-9]{4}$"}})),
    ("hex_color", "a colour code", obj({"hex": {"type": "string", "pattern": r"^#[0-9a-f]{6}$"}})),
    ("semver", "a software release", obj({"package": text(30), "version": {"type": "string",
                                                                          "pattern": r"^[0-9]+\.[0-9]+\.[0-9]+$"}})),
    ("optional", "a user profile", obj({"name": text(40), "nickname": text(20), "bio": text(80)}, ["name"])),
    ("open_object", "any facts about the moon", {"type": "object", "properties": {"radius_km": N},
                                                  "required": ["radius_km"], "maxProperties": 4}),
    ("matrix", "a 2 by 2 matrix", obj({"rows": arr(arr(I, 2, 2), 2, 2)})),
    ("tuple", "a point", obj({"point": {"type": "array", "prefixItems": [N, N], "items": False, "minItems": 2}})),
    ("nullable", "a task", obj({"task": text(40), "due": {"type": ["string", "null"], "format": "date"}})),
    ("anyof", "a shape", obj({"shape": {"anyOf": [obj({"kind": {"const": "circle"}, "r": N}),
                                                  obj({"kind": {"const": "square"}, "side": N})]}})),
    ("oneof_const", "a traffic light state", obj({"light": {"oneOf": [{"const": "red"}, {"const": "amber"},
                                                                     {"const": "green"}]}})),
    ("ref", "a family tree of two generations", {
        "$defs": {"person": obj({"name": text(30), "born": {"type": "integer", "minimum": 1900, "maximum": 2026}})},
        **obj({"parent": {"$ref": "#/$defs/person"}, "children": arr({"$ref": "#/$defs/person"}, 1, 3)})}),
    ("recipe", "a recipe", obj({"title": text(40), "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                                "ingredients": arr(obj({"name": text(30), "grams": {"type": "number", "minimum": 0,
                                                                                    "maximum": 5000}}), 1, 4),
                                "steps": arr(text(80), 1, 3)})),
    ("calendar", "a week's plan", obj({"days": arr(obj({"day": {"enum": ["Mon", "Tue", "Wed", "Thu", "Fri",
                                                                          "Sat", "Sun"]}, "busy": B}), 1, 7)})),
    ("inventory", "a warehouse", obj({"warehouse": text(30), "stock": arr(obj({
        "item": text(30), "count": {"type": "integer", "minimum": 0, "maximum": 100000},
        "location": obj({"aisle": {"type": "integer", "minimum": 1, "maximum": 50},
                         "shelf": {"enum": ["A", "B", "C"]}})}), 1, 3)})),
    ("coords", "the location of Paris", obj({"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                             "lon": {"type": "number", "minimum": -180, "maximum": 180}})),
    ("percent", "a test score", obj({"student": text(40), "score": {"type": "number", "minimum": 0,
                                                                    "maximum": 100}})),
    ("count_words", "a word count", obj({"word": {"type": "string", "pattern": r"^[a-z]{1,12}$"},
                                         "count": {"type": "integer", "minimum": 0}})),
    ("http_response", "an HTTP response", obj({"status": {"type": "integer", "minimum": 100, "maximum": 599},
                                              "headers": obj({"content_type": text(40)}),
                                              "body": text(80)})),
    ("log_entry", "a log line", obj({"level": {"enum": ["DEBUG", "INFO", "WARN", "ERROR"]},
                                     "ts": {"type": "string", "format": "date-time"}, "message": text(80)})),
    ("git_commit", "a git commit", obj({"sha": {"type": "string", "pattern": r"^[0-9a-f]{7}$"},
                                        "author": text(30), "files_changed": {"type": "integer", "minimum": 1,
                                                                              "maximum": 50}})),
    ("sentiment", "the sentiment of 'I love this!'", obj({"sentiment": {"enum": ["positive", "neutral",
                                                                                  "negative"]},
                                                          "confidence": {"type": "number", "minimum": 0,
                                                                         "maximum": 1}})),
    ("translation", "the French for 'cat'", obj({"source": text(20), "target": text(20),
                                                  "lang": {"type": "string", "pattern": r"^[a-z]{2}$"}})),
    ("quiz", "a quiz question", obj({"question": text(80), "choices": arr(text(30), 2, 4),
                                     "answer": {"type": "integer", "minimum": 0, "maximum": 3}})),
    ("planet", "a planet", obj({"name": {"enum": ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn",
                                                  "Uranus", "Neptune"]},
                                "moons": {"type": "integer", "minimum": 0, "maximum": 200},
                                "rings": B})),
    ("employee", "an employee", obj({"name": text(40), "department": {"enum": ["sales", "engineering", "hr"]},
                                     "salary": {"type": "integer", "minimum": 10000, "maximum": 500000},
                                     "manager": {"type": ["string", "null"], "maxLength": 40}})),
    ("flight", "a flight", obj({"flight": {"type": "string", "pattern": r"^[A-Z]{2}[0-9]{2,4}$"},
                                "from": {"type": "string", "pattern": r"^[A-Z]{3}$"},
                                "to": {"type": "string", "pattern": r"^[A-Z]{3}$"},
                                "departs": {"type": "string", "format": "date-time"}})),
    ("invoice", "an invoice", obj({"number": {"type": "integer", "minimum": 1},
                                   "lines": arr(obj({"text": text(40), "amount": {"type": "number", "minimum": 0,
                                                                                  "maximum": 1e6}}), 1, 3),
                                   "total": {"type": "number", "minimum": 0}})),
    ("tree", "a small folder tree", obj({"name": text(20), "children": arr(obj({
        "name": text(20), "children": arr(obj({"name": text(20)}), 0, 2)}), 0, 3)})),
    ("settings", "app settings", obj({"theme": {"enum": ["light", "dark"]},
                                      "font_size": {"type": "integer", "minimum": 8, "maximum": 28},
                                      "autosave": B, "language": {"type": "string", "pattern": r"^[a-z]{2}_[A-Z]{2}$"}})),
    ("poll", "a poll", obj({"question": text(60), "options": arr(obj({"label": text(20),
                                                                     "votes": {"type": "integer", "minimum": 0}}),
                                                                 2, 4)})),
    ("scores", "game scores", obj({"scores": arr({"type": "number", "minimum": 0, "maximum": 10}, 1, 5),
                                   "best": {"type": "number", "minimum": 0, "maximum": 10}})),
    ("unit", "a length", obj({"value": {"type": "number", "minimum": 0}, "unit": {"enum": ["mm", "cm", "m",
                                                                                            "km"]}})),
    ("contact_list", "two contacts", obj({"contacts": arr(obj({"name": text(30), "email": {
        "type": "string", "format": "email"}}), 2, 2)})),
    ("top_level_array", "three fruits", arr(text(20), 3, 3)),
    ("top_level_enum", "the best season", {"enum": ["spring", "summer", "autumn", "winter"]}),
]
