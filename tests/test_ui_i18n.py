"""Translations: the Simplified Chinese catalogue is complete and consistent, the `language` setting
picks it, and with it installed the window's controls read in Chinese."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
import test_ui_main_window as M
from PySide6.QtCore import QTranslator
from PySide6.QtWidgets import QPushButton

from app import settings as S
from ui import i18n

home, tiny = M.home, M.tiny  # fixtures shared with the main window's tests

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]
TS = i18n.I18N / "colibri_zh_CN.ts"


@pytest.fixture
def chinese(qapp):
    translators = i18n.install(qapp, "zh_CN")
    yield translators
    i18n.uninstall(qapp, translators)


def test_the_catalogue_is_finished_and_keeps_every_placeholder():
    """Every message has a translation, and a translation names the same {fields} as its source
    (a dropped or renamed one would raise KeyError in str.format on screen)."""
    fields = re.compile(r"\{(\w*)[^}]*\}")
    for ctx in ET.parse(TS).getroot().iter("context"):
        for m in ctx.iter("message"):
            src, tr = m.findtext("source"), m.find("translation")
            assert tr.text and tr.get("type") != "unfinished", (ctx.findtext("name"), src)
            assert sorted(fields.findall(src)) == sorted(fields.findall(tr.text)), (src, tr.text)
            assert ("&" in src) <= ("&" in tr.text), f"mnemonic lost: {src!r}"


def test_the_compiled_catalogue_is_current():
    """The .qm is committed (no build step at run time): it must hold what the .ts says."""
    t = QTranslator()
    assert t.load(str(i18n.I18N / "colibri_zh_CN.qm"))
    for ctx in ET.parse(TS).getroot().iter("context"):
        name = ctx.findtext("name")
        for m in ctx.iter("message"):
            assert t.translate(name, m.findtext("source")) == m.findtext("translation"), m.findtext("source")


def test_the_language_setting(tmp_path, qapp):
    s = S.load(tmp_path / "settings.json")
    assert s.language == "system"
    s.set_ui("language", "zh_CN")
    s.save()
    assert S.load(tmp_path / "settings.json").language == "zh_CN"
    with pytest.raises(ValueError, match="language: 'xx' is not one of system, en, zh_CN"):
        s.set_ui("language", "xx")
    assert i18n.resolve("en") == "en" and i18n.resolve("zh_CN") == "zh_CN"
    assert i18n.resolve("system") in ("en", *i18n.TRANSLATED)
    assert i18n.install(qapp, "en") == []  # English is the source: nothing to install


def test_in_chinese_the_main_window_reads_in_chinese(qtbot, home, tiny, chinese):
    from ui.param_form import SettingsDialog
    assert len(chinese) == 2  # ours and Qt's own (standard buttons)
    w = M.open_window(qtbot, tiny)
    assert (w.new_button.text(), w.send_button.text(), w.chat_settings_button.text(), w.settings_button.text()) \
        == ("新建对话", "发送", "对话设置", "设置")
    assert [a.text() for a in w.menuBar().actions()] == ["文件(&F)", "对话(&C)", "视图(&V)", "服务器(&R)"]
    assert w.search.placeholderText() == "搜索对话" and w.input.placeholderText().startswith("给 Colibri 发消息")
    assert w.new_button.accessibleName() == "新建对话" and w.send_button.accessibleName() == "发送消息"
    w.input.setPlainText("用一句话介绍你自己")
    w.input.submitted.emit(w.input.toPlainText())
    qtbot.waitUntil(lambda: w.busy == "", timeout=60_000)
    text = w.view.toPlainText()
    assert "用一句话介绍你自己" in text and "你" in text and "助手" in text and "重新生成" in text
    assert "词元/秒" in text  # the reply's figures
    w._update_status()
    assert w.context_label.text().startswith("上下文 ")
    d = SettingsDialog(w, w.settings)
    qtbot.addWidget(d)
    assert d.windowTitle() == "设置" and d.ui_form.editors["theme"].currentText() == "浅色"
    assert d.ui_form.editors["language"].itemText(2) == "简体中文"
    assert {b.text() for b in d.findChildren(QPushButton)} >= {"确定", "取消"}  # Qt's own catalogue


def test_changing_the_language_applies_at_once(qtbot, home, tiny, qapp):
    w = M.open_window(qtbot, tiny)
    try:
        w.apply_settings({}, {"language": "zh_CN"})
        assert S.load().language == "zh_CN" and w.send_button.text() == "发送"  # no restart needed
    finally:
        i18n.uninstall(qapp, w.translators)


def test_every_text_of_a_window_class_is_in_its_context():
    """`self.tr` looks a text up under the class whose method calls it (and the classes after it in the
    object's MRO): a text of a MainWindow part (ui/conversation_list.py, …) that is catalogued under another
    class only would be left for lupdate to mark new, and a text never catalogued shows in English."""
    import ast
    from pathlib import Path
    catalogued: dict[str, set[str]] = {}
    for ctx in ET.parse(TS).getroot().iter("context"):
        catalogued.setdefault(ctx.findtext("name"), set()).update(m.findtext("source") for m in ctx.iter("message"))
    missing, seen = [], 0
    for f in sorted(Path(i18n.__file__).parent.glob("*.py")):
        for cls in (n for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))) if isinstance(n, ast.ClassDef)):
            for n in ast.walk(cls):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "tr" \
                        and n.args and isinstance(n.args[0], ast.Constant):
                    seen += 1
                    if n.args[0].value not in catalogued.get(cls.name, ()):
                        missing.append(f"{f.name} {cls.name}: {n.args[0].value!r}")
    assert seen > 250 and not missing, missing
