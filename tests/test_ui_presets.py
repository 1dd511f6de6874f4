"""Presets and per-model defaults (issue 18): a model's own generation config (generation_config.json
or GGUF general.sampling.*) is kept by the converter and is where a chat's sampling starts; named
presets (system prompt + sampling, one of them the default for new chats) layer over it."""
from __future__ import annotations

import json
import shutil

import pytest
from conftest import HF_FIXTURES
from gguf import GGUFValueType
from gguf_fixtures import convert_hf
import test_ui_main_window as M

from app import settings as S
from app import worker as W
from app.history import History
from engine.convert.convert import convert

home = M.home
pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


@pytest.fixture(scope="module")
def recommending(tmp_path_factory):
    """The qwen2 fixture with a generation_config.json that recommends sampling values."""
    d = tmp_path_factory.mktemp("gen")
    src = shutil.copytree(HF_FIXTURES / "qwen2", d / "src")
    doc = json.loads((src / "generation_config.json").read_text())
    doc |= {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1,
            "min_p": 7.0}  # out of range: left out, the rest is used
    (src / "generation_config.json").write_text(json.dumps(doc))
    return str(convert(src, d / "model", "keep").path)


def test_the_converter_keeps_the_models_sampling_defaults(recommending, tmp_path):
    assert W.model_sampling(recommending) == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repeat_penalty": 1.1}
    plan = convert_hf(HF_FIXTURES / "qwen2")
    plan.set_key("general.sampling.temp", 0.3, GGUFValueType.FLOAT32)
    plan.set_key("general.sampling.top_k", 30, GGUFValueType.INT32)
    out = convert(plan.write(tmp_path / "q.gguf"), tmp_path / "q", "keep").path
    got = W.model_sampling(out)
    assert got == {"temperature": pytest.approx(0.3), "top_k": 30}
    assert W.model_sampling(convert(HF_FIXTURES / "llama", tmp_path / "plain", "keep").path) == {}


def test_presets_persist_and_are_checked(tmp_path):
    s = S.load(tmp_path / "settings.json")
    assert s.default_preset == "Model defaults" and s.preset()["sampling"] == {}
    s.save_preset("Terse", "Answer in one sentence.", {"temperature": 0.1})
    s.default_preset = "Terse"
    s.save()
    again = S.load(tmp_path / "settings.json")
    assert again.preset() == {"system_prompt": "Answer in one sentence.", "sampling": {"temperature": 0.1}}
    with pytest.raises(ValueError, match="built-in"):
        s.save_preset("Precise", "", {})
    with pytest.raises(ValueError, match="top_p"):
        s.save_preset("Bad", "", {"top_p": 3.0})
    (tmp_path / "settings.json").write_text(json.dumps({"presets": {"X": {"sampling": {"top_p": 9}}},
                                                        "default_preset": "Gone"}))
    bad = S.load(tmp_path / "settings.json")
    assert bad.presets == {"X": {"system_prompt": "", "sampling": {}}} and bad.default_preset == "Model defaults"
    assert any("top_p" in n for n in bad.notices)


def test_a_chat_starts_from_the_models_defaults_and_the_default_preset(qtbot, home, recommending):
    from ui.main_window import MainWindow
    from ui.param_form import ConversationDialog
    settings = S.load()
    settings.model = recommending
    settings.sampling = {"max_tokens": 4}
    w = MainWindow(settings, History())
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.flow.ready, timeout=60_000):
        w.flow.start()
    assert w.flow.model_defaults["temperature"] == 0.6
    conv = w.history.conversation(w.conv_id)
    assert w.sampling_for(conv)["temperature"] == 0.6 and w.sampling_for(conv)["top_k"] == 20
    d = ConversationDialog(w, conv.system_prompt, w.sampling_for(conv), settings,
                           settings.sampling_values() | w.flow.model_defaults, w.flow.model_defaults)
    qtbot.addWidget(d)
    assert "Temperature 0.6" in d.model_note.text()
    d.apply_preset("Coding")
    assert d.system.toPlainText().startswith("You are a careful programming assistant")
    assert d.form.value("temperature") == 0.2 and d.form.value("top_k") == 20  # the model's own, under the preset
    d.form.set_value("top_p", 0.5)
    d.save_preset("My coding")
    d.make_default("My coding")
    assert settings.preset("My coding")["sampling"] == {"temperature": 0.2, "repeat_penalty": 1.05, "top_p": 0.5}
    assert d.preset_box.currentData() == "My coding" and "My coding" in d.default_label.text()
    d.restore_defaults()
    assert d.form.value("temperature") == 0.6
    w.new_conversation()  # new chats start from the default preset
    new = w.history.conversation(w.conv_id)
    assert new.system_prompt.startswith("You are a careful programming assistant")
    assert w.sampling_for(new)["top_p"] == 0.5 and w.sampling_for(new)["top_k"] == 20
    w.input.setPlainText("hi")
    w.send(w.input.toPlainText())
    qtbot.waitUntil(lambda: w.busy == "", timeout=60_000)
    assert w.history.messages(new.id)[-1].stats["generated_tokens"] <= 4
