"""The conversion wizard on a real Qt loop (offscreen): inspect, options, convert, cancel, open."""
from __future__ import annotations

import gc
import threading

import pytest
from conftest import HF_FIXTURES
from gguf import GGMLQuantizationType as Q
from gguf_fixtures import write_gguf
from PySide6.QtCore import Qt, QTimer

from engine.model_dir import open_model_dir

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore("propagateSizeHints")]


@pytest.fixture
def wizard(qtbot, tmp_path):
    from ui.wizard import ConvertWizard
    # garbage of earlier tests (Qt objects in reference cycles) must be collected here, on the GUI
    # thread: a collection that happens to run on the wizard's thread would delete them there
    gc.collect()
    w = ConvertWizard(None, tmp_path / "models")
    (tmp_path / "models").mkdir()
    qtbot.addWidget(w)
    w.show()
    yield w
    w.close()
    gc.collect()


def inspect(qtbot, w, source) -> None:
    w.set_source(str(source))
    assert not w.next_button.isEnabled()  # not before the source is read
    qtbot.waitUntil(lambda: w.summary is not None or w.state == "failed", timeout=20_000)


def test_inspects_a_hugging_face_folder(qtbot, wizard):
    inspect(qtbot, wizard, HF_FIXTURES / "mixtral")
    text = wizard.facts.text()
    assert "Hugging Face folder" in text and "mixtral" in text and "8 per layer" in text and "Parameters" in text
    assert wizard.next_button.isEnabled()
    qtbot.mouseClick(wizard.next_button, Qt.LeftButton)
    assert wizard.pages.currentIndex() == 1 and wizard.next_button.text() == "Convert"
    assert wizard.quantize == "int8" and wizard.name_edit.text() == "mixtral-int8"  # convert()'s own default
    table = wizard.memory_table
    assert [table.item(r, 0).text() for r in range(table.rowCount())] == ["2 of 8", "4 of 8", "8 of 8"]
    before = table.item(0, 1).text()
    wizard.quant_buttons["int4"].setChecked(True)
    assert table.item(0, 1).text() != before and wizard.name_edit.text() == "mixtral-int4"
    assert wizard.split_layer.isEnabled()


def test_inspects_a_gguf_file(qtbot, wizard, tmp_path):
    inspect(qtbot, wizard, write_gguf(HF_FIXTURES / "qwen2_moe", tmp_path / "tiny-moe.gguf", qtypes=Q.Q8_0))
    assert "GGUF file" in wizard.facts.text() and "Q8_0" in wizard.facts.text()
    assert "shared expert" in wizard.facts.text()
    wizard._next()
    assert wizard.quantize == "keep" and wizard.name_edit.text() == "tiny-moe"


def test_a_source_it_cannot_read_says_why(qtbot, wizard, tmp_path):
    (tmp_path / "empty").mkdir()
    inspect(qtbot, wizard, tmp_path / "empty")
    assert wizard.state == "failed" and "failed" in wizard.source_status.text()
    assert not wizard.next_button.isEnabled()


def test_converts_with_progress_then_opens_the_result(qtbot, wizard):
    inspect(qtbot, wizard, HF_FIXTURES / "mixtral")
    wizard._next()
    wizard.quant_buttons["int4"].setChecked(True)
    wizard.split_layer.setChecked(True)
    opened = []
    wizard.open_requested.connect(opened.append)
    qtbot.mouseClick(wizard.next_button, Qt.LeftButton)
    assert wizard.pages.currentIndex() == 2 and wizard.cancel_button.isVisible()
    qtbot.waitUntil(lambda: wizard.state == "done", timeout=30_000)
    assert wizard.progress_seen and wizard.progress_seen[-1] == 1.0 and wizard.bar.value() == 1000
    assert wizard.progress_seen == sorted(wizard.progress_seen)
    model = open_model_dir(wizard.target, verify=True)
    assert not model.split_experts and (wizard.target / "experts" / "layer_0.bin").is_file()
    assert "Done" in wizard.outcome.text() and wizard.open_button.isVisible()
    qtbot.mouseClick(wizard.open_button, Qt.LeftButton)
    assert opened == [str(wizard.target)] and not wizard.isVisible()


def test_cancel_leaves_no_output(qtbot, wizard):
    inspect(qtbot, wizard, HF_FIXTURES / "mixtral")
    wizard._next()
    gate = threading.Event()
    QTimer.singleShot(0, wizard.worker, lambda: gate.wait(10))  # holds the wizard's thread until Cancel
    wizard.start_conversion()
    wizard.cancel()
    gate.set()
    qtbot.waitUntil(lambda: wizard.state == "cancelled", timeout=30_000)
    assert "nothing was written" in wizard.outcome.text()
    assert list(wizard.models.iterdir()) == []  # neither the model nor a hidden partial folder
    assert wizard.back_button.isEnabled() and not wizard.open_button.isVisible()


def test_file_menu_converts_and_opens_in_chat(qtbot, tmp_path, monkeypatch):
    from app import settings as S
    from app.history import History
    from ui.main_window import MainWindow
    monkeypatch.setenv("COLIBRI_HOME", str(tmp_path))
    gc.collect()
    w = MainWindow(S.load(), History())
    qtbot.addWidget(w)
    w.show()
    action = next(a for m in w.menuBar().actions() if m.text() == "&File"
                  for a in m.menu().actions() if a.text() == "Convert model…")
    action.trigger()
    from ui.wizard import ConvertWizard
    wizard = w.findChild(ConvertWizard, "convert_wizard")
    assert wizard is not None and wizard.isVisible()
    inspect(qtbot, wizard, HF_FIXTURES / "qwen2_moe")
    wizard._next()
    wizard._next()
    qtbot.waitUntil(lambda: wizard.state == "done", timeout=30_000)
    target = str(wizard.target)
    with qtbot.waitSignal(w.flow.ready, timeout=60_000) as ready:
        qtbot.mouseClick(wizard.open_button, Qt.LeftButton)
    assert ready.args[0].model == "qwen2_moe-int8" and w.flow.model == target
    assert w.model_picker.currentData() == target
    w.close()


def test_eta_text():
    from ui.wizard import eta_text
    assert eta_text(10.0, 0.5) == ", about 10 s left"
    assert eta_text(60.0, 0.25) == ", about 3 min 0 s left"
    assert eta_text(0.5, 0.5) == "" and eta_text(10.0, 0.01) == "" and eta_text(10.0, 1.0) == ""


def test_a_pasted_path_is_read_and_the_reading_shows(qtbot, wizard, tmp_path):
    from PySide6.QtGui import QGuiApplication, QKeySequence
    from PySide6.QtWidgets import QPushButton
    assert not wizard.path_edit.isReadOnly()
    QGuiApplication.clipboard().setText(str(HF_FIXTURES / "qwen2"))
    wizard.path_edit.setFocus()
    seen = []
    wizard.inspect_requested.connect(lambda path: seen.append((path, wizard.read_bar.isVisibleTo(wizard),
                                                               wizard.source_status.text())))
    with qtbot.waitSignal(wizard.inspect_requested, timeout=3_000):  # read once the typing pauses
        qtbot.keySequence(wizard.path_edit, QKeySequence.Paste)  # the user's Ctrl+V
        assert wizard.path_edit.text() == str(HF_FIXTURES / "qwen2")
    assert seen == [(str(HF_FIXTURES / "qwen2"), True, "Reading qwen2…")]  # a moving bar, then the seconds
    qtbot.waitUntil(lambda: wizard.summary is not None, timeout=20_000)
    assert not wizard.read_bar.isVisibleTo(wizard) and "qwen2" in wizard.facts.text()
    wizard.path_edit.setText(str(tmp_path / "nowhere.gguf"))
    qtbot.keyClick(wizard.path_edit, Qt.Key_Return)
    assert wizard.source_status.text().startswith("No file or folder at")
    wizard._next()
    headers = [wizard.memory_table.horizontalHeaderItem(c).text() for c in range(3)]
    assert all(headers) and headers[2] == "what it means"
    wizard.quant_buttons["int4"].setChecked(True)
    assert "stays at higher precision" in wizard.size_note.text() and "token embeddings" in wizard.size_note.text()
    wizard.quant_buttons["int8"].setChecked(True)
    assert not wizard.size_note.isVisibleTo(wizard)
    wizard.start_conversion()
    assert wizard.state == "converting"
    cancels = [b for b in wizard.findChildren(QPushButton) if b.isVisibleTo(wizard) and "Cancel" in b.text()]
    assert cancels == [wizard.cancel_button]  # one Cancel on the convert page, not two
    qtbot.waitUntil(lambda: wizard.state in ("done", "cancelled"), timeout=30_000)
    assert wizard.close_button.isVisibleTo(wizard)


def test_a_gguf_is_read_header_only_with_progress(qtbot, wizard, default_gguf, monkeypatch):
    """Defect 4: the 98 MB default GGUF's facts come from its header alone (gguf.GGUFReader, which
    walked every field part, is not used), and the bar shows how much of the header is read."""
    import time

    import gguf

    def no_reader(*a, **k):
        raise AssertionError("the whole file was read")
    monkeypatch.setattr(gguf, "GGUFReader", no_reader)
    fractions = []
    wizard.worker.reading.connect(lambda source, f: fractions.append(f))
    t = time.perf_counter()
    inspect(qtbot, wizard, default_gguf)
    print(f"\nwizard inspect of {default_gguf.name}: {time.perf_counter() - t:.2f} s")
    assert wizard.summary is not None and "GGUF file" in wizard.facts.text() and "49,152 tokens" in wizard.facts.text()
    qtbot.waitUntil(lambda: bool(fractions) and fractions[-1] == 1.0, timeout=2_000)
    assert fractions == sorted(fractions) and len(fractions) >= 2
    assert not wizard.read_bar.isVisibleTo(wizard)
    wizard._read_fraction = 0.43  # what the line says mid-read
    wizard._reading_path = str(default_gguf)
    wizard._reading()
    assert wizard.source_status.text() == f"Reading the header of {default_gguf.name} (98.4 MB): 43%"


def test_each_choice_shows_its_size_memory_and_measured_quality_cost(qtbot, wizard, tmp_path):
    """Issue 20 item 5: the quality cost from app/bench/results/quality.json, said to be one model's."""
    from app.model_info import human_bytes
    from app.quality_table import expected_cost
    inspect(qtbot, wizard, HF_FIXTURES / "mixtral")
    wizard._next()
    b, cells = wizard.quant_buttons, {q: [c.text() for c in cs] for q, cs in wizard.quant_cells.items()}
    cost = expected_cost("q4_k_m")
    want = f"{cost['delta_ppl_pct']:+.1f}% perplexity, {cost['same_top_pct']:.0f}% same next token"
    assert cells["q4_k_m"][2] == want == "+4.6% perplexity, 88% same next token"
    summary = wizard.summary
    assert cells["q4_k_m"][:2] == [human_bytes(summary.sizes["q4_k_m"].total),
                                   human_bytes(summary.memory_table("q4_k_m")[0].ram_bytes)]
    assert cells["keep"][2] == cells["f16"][2] == "—"  # no row in the table: no figure
    assert cells["int4"][2].endswith(" *")  # the default model's source was Q4_1: no loss there
    assert "* int4 shows no loss there" in wizard.quality_note.text()
    assert b["q4_k_m"].accessibleDescription().endswith("measured on the default model: " + want)
    assert wizard.quality_note.isVisibleTo(wizard) and "one model's" in wizard.quality_note.text()
    assert "SmolLM2" in wizard.quality_note.text()
    b["q4_k_m"].setChecked(True)
    assert wizard.calibration_edit.isEnabled() and wizard.calibration == ""
    wizard.calibration_edit.setText(str(tmp_path / "nowhere.txt"))
    assert "No file at" in wizard.calibration_note.text() and not wizard.next_button.isEnabled()
    text = tmp_path / "cal.txt"
    text.write_text("Some text.", encoding="utf-8")
    wizard.calibration_edit.setText(str(text))
    assert wizard.next_button.isEnabled() and wizard.calibration == str(text)
    cal = expected_cost("q4_k_m", calibrated=True)
    assert wizard.quant_cells["q4_k_m"][2].text().startswith(f"calibrated: {cal['delta_ppl_pct']:+.1f}% perplexity")
    b["f16"].setChecked(True)  # nothing to round: the option is off and nothing is passed on
    assert not wizard.calibration_edit.isEnabled() and wizard.calibration == ""
    assert "needs no calibration" in wizard.calibration_note.text()


def test_a_calibrated_conversion_says_what_calibration_did(qtbot, wizard, tmp_path):
    """The calibration text travels with the convert request; the done page names its tokens and the
    expert matrices the text never reached (a tiny MoE, a short text: some experts stay idle)."""
    text = tmp_path / "cal.txt"
    cal = (HF_FIXTURES.parent / "texts" / "calibration_en_code.txt").read_text(encoding="utf-8")[:120]
    text.write_text(cal, encoding="utf-8")  # 55 tokens: a few of the tiny qwen3_moe's experts stay idle
    inspect(qtbot, wizard, HF_FIXTURES / "qwen3_moe")
    wizard._next()
    wizard.quant_buttons["int4"].setChecked(True)
    wizard.calibration_edit.setText(str(text))
    requests = []
    wizard.convert_requested.connect(lambda *args: requests.append(args))
    qtbot.mouseClick(wizard.next_button, Qt.LeftButton)
    assert "calibration text cal.txt" in wizard.tensor_label.text()  # the forward reports no progress: say so
    qtbot.waitUntil(lambda: wizard.state in ("done", "failed"), timeout=60_000)
    assert wizard.state == "done", wizard.outcome.text()
    assert requests and requests[0][2:] == ("int4", True, str(text))
    c = wizard.result.calibration
    assert c["tokens"] > 0 and c["expert_matrices"] > c["unrouted_expert_matrices"] > 0, c
    outcome = wizard.outcome.text()
    assert f"Calibrated on {c['tokens']:,} tokens: {c['weighted_matrices']} matrices" in outcome
    assert f"{c['unrouted_expert_matrices']} of {c['expert_matrices']} expert matrices were never routed" in outcome
    open_model_dir(wizard.target, verify=True)
    every = wizard.calibration_outcome({**c, "unrouted_expert_matrices": 0})
    assert every.endswith(f"The text reached all {c['expert_matrices']} expert matrices.")
    assert wizard.calibration_outcome({**c, "expert_matrices": 0}).endswith("rounded by importance.")  # dense


def test_in_chinese_the_new_options_read_in_chinese(qtbot, qapp, tmp_path):
    from ui import i18n
    from ui.wizard import ConvertWizard
    translators = i18n.install(qapp, "zh_CN")
    try:
        gc.collect()
        w = ConvertWizard(None, tmp_path)
        qtbot.addWidget(w)
        w.show()
        inspect(qtbot, w, HF_FIXTURES / "mixtral")
        facts = w.facts.text()  # the source's facts too (they were English in the Chinese wizard)
        assert "<b>架构</b>" in facts and "每个词元选用 2 个专家" in facts and "Hugging Face 文件夹" in facts
        assert "per token" not in facts and "Layers" not in facts
        w._next()
        assert w.calibration_button.text() == "校准文本…" and w.calibration_edit.accessibleName() == "校准文本"
        assert w.quant_cells["q4_k_m"][2].text() == "困惑度 +4.6%，88% 下一词元相同"
        assert "质量：这是单个模型的数据" in w.quality_note.text()
        assert "损失明显" in w.quant_buttons["int4"].accessibleDescription()
        w.close()
    finally:
        i18n.uninstall(qapp, translators)


def test_the_table_says_whose_figures_they_are(tmp_path):
    """measured_on reads the model's storage format from its file name; a row measured from a file
    already in a choice's own format (Q4_1 for int4) is flagged, one from an f16 file is not."""
    import json

    from app.quality_table import already_stored, measured_on
    rows = [{"by": "colibri", "format": "int4", "calibrated": False, "positions": 510}]
    for model, stored in (("SmolLM2-135M-Instruct.Q4_1.gguf", True), ("SmolLM2-135M-Instruct.F16.gguf", False),
                          ("some-model", False)):
        path = tmp_path / "quality.json"
        path.write_text(json.dumps({"model": model, "rows": rows}), encoding="utf-8")
        assert measured_on(path)["model"] == model and measured_on(path)["positions"] == 510
        assert already_stored("int4", path) is stored and not already_stored("int8", path)
        assert not already_stored("q4_k_m", path)  # a mix: no single format to have been stored in
    assert measured_on(tmp_path / "none.json") is None and not already_stored("int4", tmp_path / "none.json")


@pytest.mark.parametrize("fixture", ["mixtral", "qwen3_moe"])
def test_a_new_user_converts_an_moe_model_in_the_wizard_and_chats_with_it(qtbot, tmp_path, monkeypatch, fixture):
    """"Done when": from the chat window's own buttons, an HF MoE folder is converted, opened in the
    chat, and a message sent gets a streamed reply that is kept in the history."""
    from app import settings as S
    from app.history import History
    from ui.main_window import MainWindow
    from ui.wizard import ConvertWizard
    monkeypatch.setenv("COLIBRI_HOME", str(tmp_path))
    gc.collect()
    settings = S.load()
    settings.sampling = {"temperature": 0.0, "max_tokens": 6}
    w = MainWindow(settings, History())
    qtbot.addWidget(w)
    w.show()
    w.model_picker.activated.emit(w.model_picker.findData("__import__"))  # the picker's "Import…"
    wizard = w.findChild(ConvertWizard, "convert_wizard")
    assert wizard is not None and wizard.isVisible()
    wizard.path_edit.setText(str(HF_FIXTURES / fixture))  # typed or pasted
    qtbot.keyClick(wizard.path_edit, Qt.Key_Return)
    qtbot.waitUntil(lambda: wizard.summary is not None, timeout=20_000)
    assert "expert" in wizard.facts.text().lower() and wizard.next_button.isEnabled()
    qtbot.mouseClick(wizard.next_button, Qt.LeftButton)
    wizard.quant_buttons["int4"].click()
    assert wizard.name_edit.text() == f"{fixture}-int4"
    qtbot.mouseClick(wizard.next_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: wizard.state in ("done", "failed"), timeout=60_000)
    assert wizard.state == "done", wizard.source_status.text()
    with qtbot.waitSignal(w.flow.ready, timeout=120_000) as ready:
        qtbot.mouseClick(wizard.open_button, Qt.LeftButton)
    assert ready.args[0].model == f"{fixture}-int4" and w.model_picker.currentText() == f"{fixture}-int4"
    w.input.setPlainText("Hello, MoE")
    qtbot.keyClick(w.input, Qt.Key_Return)
    qtbot.waitUntil(lambda: w.busy == "", timeout=60_000)
    user, reply = w.history.messages(w.conv_id)
    assert user.content == "Hello, MoE" and reply.role == "assistant"
    assert reply.stats["generated_tokens"] == 6 and reply.facts["model"] == f"{fixture}-int4"
    assert "6 tokens" in w.view.toPlainText() and "Regenerate" in w.view.toPlainText()
    w.close()


def test_the_options_rows_stay_readable_in_a_short_window(qtbot, wizard):
    """Screenshot 12 of session 24: at 760x560 the quantization rows were drawn over each other."""
    inspect(qtbot, wizard, HF_FIXTURES / "mixtral")
    wizard._next()
    wizard.resize(760, 560)
    qtbot.wait(50)
    buttons = list(wizard.quant_buttons.values())
    tops = [b.mapTo(wizard.options_scroll.widget(), b.rect().topLeft()).y() for b in buttons]
    assert all(b.height() >= b.sizeHint().height() for b in buttons)
    assert all(t2 - t1 >= buttons[0].sizeHint().height() for t1, t2 in zip(tops, tops[1:]))
    cells = [c for row in wizard.quant_cells.values() for c in row]
    assert all(c.width() >= c.sizeHint().width() for c in cells)  # no figure cut at the right edge
