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

    def set_ui(self, name: str, value: Any) -> None:
        self.ui[name] = APPEARANCE[name].check(value)

    def save(self) -> None:
        path = self.path or data_dir() / FILENAME
        doc = {"version": 1, "engine": self.engine, "sampling": self.sampling, "ui": self.ui, "model": self.model,
               "window": self.window}
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
    window = doc.get("window", {})
    s.window = {k: v for k, v in window.items() if isinstance(v, str)} if isinstance(window, dict) else {}
    for n in s.notices:
        log.warning(n)
    return s
