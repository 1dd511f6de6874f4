"""Settings: persisted, validated against the one parameter table, and the dialog generated from it."""
from __future__ import annotations

import json

import pytest

from app import settings as S
from engine import params as P

pytestmark = pytest.mark.qt_log_level_fail("WARNING")


def test_defaults_round_trip_and_validation(tmp_path):
    path = tmp_path / "settings.json"
    s = S.load(path)
    assert s.theme == "light" and s.engine_values() == P.defaults("engine")
    s.engine["context_length"] = 2048
    s.set_ui("theme", "dark")
    s.model = "/models/x"
    s.save()
    again = S.load(path)
    assert again.engine == {"context_length": 2048} and again.theme == "dark" and again.model == "/models/x"
    assert again.notices == []
    with pytest.raises(ValueError, match="theme: 'pink' is not one of light, dark"):
        s.set_ui("theme", "pink")


def test_bad_values_are_dropped_with_a_notice(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"engine": {"context_length": 3, "warp_drive": 1}, "ui": {"font_size": 11}}))
    s = S.load(path)
    assert s.engine == {} and s.font_size == 11
    assert any("context_length: 3 is out of range" in n for n in s.notices)
    assert any("unknown engine setting 'warp_drive'" in n for n in s.notices)


def test_an_unreadable_file_is_kept_aside(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{not json")
    s = S.load(path)
    assert s.engine == {} and "could not be read" in s.notices[0]
    assert (tmp_path / "settings.json.bad").read_text() == "{not json"


def test_the_dialog_is_generated_from_the_table_and_picks_up_new_parameters(qtbot, tmp_path, monkeypatch):
    from ui.param_form import SettingsDialog
    new = P.Param("expert_cache_size", int, 8, "experts kept in memory per layer", min=1, max=256, live=False)
    monkeypatch.setitem(P.PARAMS, new.name, new)
    s = S.load(tmp_path / "settings.json")
    d = SettingsDialog(None, s)
    qtbot.addWidget(d)
    engine_names = {p.name for p in P.PARAMS.values() if p.scope == "engine"}
    assert set(d.engine_form.editors) == engine_names and "expert_cache_size" in engine_names
    assert set(d.ui_form.editors) == {"theme", "font_size", "language"}
    assert d.engine_form.values() == P.defaults("engine")  # threads None shows as "auto" and comes back None
    d.engine_form.set_value("kv_cache_quantize", "int8")
    d.engine_form.set_value("expert_cache_size", 32)
    d.engine_form.set_value("threads", 2)
    assert d.engine_form.values() | {} == P.defaults("engine") | {"kv_cache_quantize": "int8",
                                                                 "expert_cache_size": 32, "threads": 2}
