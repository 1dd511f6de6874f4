"""The app's settings: engine parameters (from engine/params.py), default sampling for new chats,
appearance and the last model, kept as JSON in the data folder.

Appearance settings are declared with the same `Param` record as the engine's, so the settings
dialog is generated from one list: the engine table (whatever it holds today) plus `APPEARANCE`.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.paths import data_dir
from engine import params as P

log = logging.getLogger("colibri.app")

FILENAME = "settings.json"
# presets: a name -> a system prompt and the sampling values it sets (the rest come from the model's own
# defaults, then the parameter table). New chats start from the default preset.
BUILTIN_PRESETS: dict[str, dict[str, Any]] = {
    "Model defaults": {"system_prompt": "", "sampling": {}},
    "Precise": {"system_prompt": "", "sampling": {"temperature": 0.2, "top_p": 0.9}},
    "Creative": {"system_prompt": "", "sampling": {"temperature": 1.0, "top_p": 0.98, "min_p": 0.02}},
    "Coding": {"system_prompt": "You are a careful programming assistant. Answer with working code and a short "
                                "explanation.", "sampling": {"temperature": 0.2, "repeat_penalty": 1.05}},
}
DEFAULT_PRESET = "Model defaults"
REMOTE_KEYS = ("url", "model")  # what is kept of a remote endpoint; its API key only in the system keyring


def _remote(remote: dict) -> dict[str, str]:
    """The endpoint as kept: an address holding a user:password@ is dropped, not written or read."""
    return {k: v for k, v in remote.items() if k in REMOTE_KEYS and isinstance(v, str)
            and not (k == "url" and "@" in v.split("://", 1)[-1].split("/", 1)[0])}
DEFAULT_SERVE_PORT = 4242  # "Serve on localhost" (colibri-serve's default; settings.ui["serve_port"] changes it)
APPEARANCE: dict[str, P.Param] = {p.name: p for p in [
    P.Param("theme", str, "light", "colour theme of the window", scope="ui", choices=("light", "dark")),
    P.Param("font_size", int, 11, "text size of the conversation, in points", scope="ui", min=8, max=28),
    P.Param("language", str, "system", "language of the interface (the desktop's, where translated); "
            "applied at once", scope="ui", choices=("system", "en", "zh_CN")),
]}


def engine_params() -> list[P.Param]:
    """Engine parameters, in table order; new ones added to the table appear here by themselves."""
    return [p for p in P.PARAMS.values() if p.scope == "engine"]


def sampling_params() -> list[P.Param]:
    return [p for p in P.PARAMS.values() if p.scope == "sampling"]


@dataclass
class Settings:
    engine: dict[str, Any] = field(default_factory=dict)  # only values the user changed
    sampling: dict[str, Any] = field(default_factory=dict)  # defaults for new conversations
    ui: dict[str, Any] = field(default_factory=lambda: {n: p.default for n, p in APPEARANCE.items()})
    model: str | None = None  # the folder of the last model loaded
    window: dict[str, str] = field(default_factory=dict)  # the main window's geometry and docks (Qt's, base64)
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)  # the user's own (beside BUILTIN_PRESETS)
    default_preset: str = DEFAULT_PRESET  # what new chats start from
    remote: dict[str, str] = field(default_factory=dict)  # the last remote endpoint: "url", "model" (the key: keyring)
    path: Path | None = None
    notices: list[str] = field(default_factory=list)  # values that were dropped on load, and why

    @property
    def theme(self) -> str:
        return self.ui["theme"]

    @property
    def font_size(self) -> int:
        return self.ui["font_size"]

    @property
    def language(self) -> str:
        return self.ui["language"]

    def engine_values(self) -> dict[str, Any]:
        return P.defaults("engine") | self.engine

    def sampling_values(self) -> dict[str, Any]:
        return P.defaults("sampling") | self.sampling

    def all_presets(self) -> dict[str, dict[str, Any]]:
        return BUILTIN_PRESETS | self.presets

    def preset(self, name: str | None = None) -> dict[str, Any]:
        """A preset by name (the default one if None or gone): {"system_prompt": str, "sampling": dict}."""
        presets = self.all_presets()
        return presets.get(name or self.default_preset) or presets[DEFAULT_PRESET]

    def save_preset(self, name: str, system_prompt: str, sampling: dict[str, Any]) -> None:
        name = name.strip()
        if not name:
            raise ValueError("a preset needs a name")
        if name in BUILTIN_PRESETS:
            raise ValueError(f"{name!r} is a built-in preset: pick another name")
        checked = {k: P.check(k, v) for k, v in sampling.items()}
        self.presets[name] = {"system_prompt": system_prompt, "sampling": checked}

    def set_ui(self, name: str, value: Any) -> None:
        self.ui[name] = APPEARANCE[name].check(value)

    def save(self) -> None:
        path = self.path or data_dir() / FILENAME
        doc = {"version": 1, "engine": self.engine, "sampling": self.sampling, "ui": self.ui, "model": self.model,
               "window": self.window, "presets": self.presets, "default_preset": self.default_preset,
               "remote": _remote(self.remote)}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2))
        os.replace(tmp, path)  # never a half-written settings file


def _checked(values: Any, table: dict[str, P.Param], section: str, notices: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not isinstance(values, dict):
        notices.append(f"settings: section {section!r} is not a table; using defaults")
        return out
    for name, value in values.items():
        if name not in table:
            notices.append(f"settings: unknown {section} setting {name!r} was ignored")
            continue
        try:
            out[name] = table[name].check(value)
        except ValueError as e:
            notices.append(f"settings: {e}; using the default {table[name].default!r}")
    return out


def _presets(doc: Any, table: dict[str, P.Param], notices: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(doc, dict):
        notices.append("settings: 'presets' is not a table; the saved presets were ignored")
        return out
    for name, p in doc.items():
        if not isinstance(p, dict) or name in BUILTIN_PRESETS:
            notices.append(f"settings: preset {name!r} was ignored")
            continue
        out[name] = {"system_prompt": str(p.get("system_prompt", "")),
                     "sampling": _checked(p.get("sampling", {}), table, f"preset {name!r}", notices)}
    return out


def load(path: str | Path | None = None) -> Settings:
    """The saved settings; a missing file gives defaults, bad values are dropped with a notice."""
    path = Path(path) if path is not None else data_dir() / FILENAME
    s = Settings(path=path)
    if not path.exists():
        return s
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        aside = path.with_name(path.name + ".bad")
        os.replace(path, aside)
        s.notices.append(f"settings: {path} could not be read ({e}); kept as {aside}, using defaults")
        return s
    engine = {n: p for n, p in P.PARAMS.items() if p.scope == "engine"}
    sampling = {n: p for n, p in P.PARAMS.items() if p.scope == "sampling"}
    s.engine = _checked(doc.get("engine", {}), engine, "engine", s.notices)
    s.sampling = _checked(doc.get("sampling", {}), sampling, "sampling", s.notices)
    s.ui |= _checked(doc.get("ui", {}), APPEARANCE, "ui", s.notices)
    s.model = doc.get("model") if isinstance(doc.get("model"), str) else None
    s.presets = _presets(doc.get("presets", {}), sampling, s.notices)
    if isinstance(doc.get("default_preset"), str) and doc["default_preset"] in s.all_presets():
        s.default_preset = doc["default_preset"]
    remote = doc.get("remote", {})
    s.remote = _remote(remote) if isinstance(remote, dict) else {}
    window = doc.get("window", {})
    s.window = {k: v for k, v in window.items() if isinstance(v, str)} if isinstance(window, dict) else {}
    for n in s.notices:
        log.warning(n)
    return s
