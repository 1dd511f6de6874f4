"""The model conversion wizard: pick a source, see what it is, choose how to store it, convert.

Three pages: Source (with the models already on the disk), Options (quantization with each choice's size, memory and measured quality
cost, calibration text, expert files, name) and Convert (progress with Cancel, then "Open in chat").
Inspection and conversion run on the wizard's own thread (app.convert_worker), so chatting
goes on; Cancel leaves nothing behind.
"""
from __future__ import annotations

import html
import time
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QElapsedTimer, Qt, QThread, QTimer, Signal
from PySide6.QtWidgets import (QAbstractItemView, QFrame, QScrollArea, QButtonGroup, QDialog, QFileDialog, QGridLayout, QGroupBox, QHBoxLayout,
                               QHeaderView, QLabel, QLineEdit, QProgressBar, QPushButton, QRadioButton,
                               QStackedWidget, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from app.model_info import CONTEXT, QUANTIZE, QUANTIZE_HELP, ModelSummary, default_target, human_bytes, size_note
from app.quality_table import already_stored, expected_cost, measured_on
from app.convert_worker import ConvertWorker
from ui import pyside_refcount
from ui.boxes import fill
from ui.found_models import FoundModelsPanel

SOURCE, OPTIONS, CONVERT = range(3)
CALIBRATED = ("int8", "q4_k_m", "int4")  # the choices whose rounding a calibration text weights


def _muted(text: str = "", name: str = "") -> QLabel:
    return QLabel(text, objectName=name or "help", wordWrap=True)


def eta_text(elapsed: float, fraction: float) -> str:
    """', about 1 min 20 s left' once there is enough progress to extrapolate from."""
    if fraction < 0.02 or elapsed < 1.0 or fraction >= 1.0:
        return ""
    left = elapsed * (1.0 - fraction) / fraction
    return f", about {int(left // 60)} min {int(left % 60)} s left" if left >= 60 else f", about {left:.0f} s left"


class ConvertWizard(QDialog):
    inspect_requested = Signal(str)
    # source, target folder, quantization, one file per expert, calibration text ("" for none)
    convert_requested = Signal(str, str, str, bool, str)
    open_requested = Signal(str)  # "Open in chat": the converted model folder

    def __init__(self, parent: QWidget | None, models: Path, source: str | None = None):
        super().__init__(parent)
        pyside_refcount.install()
        self.setObjectName("convert_wizard")
        self.setWindowTitle(self.tr("Convert a model"))
        self.resize(1100, 760)  # the found models' columns, on a 1366-px screen
        self.models = Path(models)
        self.summary: ModelSummary | None = None
        self.result = None  # the engine's ConvertResult once converted
        self.state = "idle"  # idle, inspecting, converting, done, cancelled, failed
        self.progress_seen: list[float] = []
        self.thread = QThread(objectName="convert_thread")
        self.worker = ConvertWorker()
        self.worker.moveToThread(self.thread)
        w = self.worker
        for signal, slot in ((self.inspect_requested, w.inspect), (self.convert_requested, w.convert),
                             (w.inspected, self._inspected), (w.reading, self._read_progress),
                             (w.progress, self._progress), (w.converted, self._converted),
                             (w.cancelled, self._cancelled), (w.failed, self._failed)):
            signal.connect(slot)
        self.thread.start()
        self._build()
        for b in self.findChildren(QPushButton):  # Enter in the path field reads the path; it presses no button
            b.setAutoDefault(False)
        self._go(SOURCE)
        if source:
            self.set_source(source)

    # --- pages -------------------------------------------------------------------------------
    def _build(self) -> None:
        self.pages = QStackedWidget()
        self.pages.addWidget(self._source_page())
        options = QScrollArea(objectName="options_scroll", widgetResizable=True, frameShape=QFrame.NoFrame)
        options.setWidget(self._options_page())  # a short screen scrolls the options instead of squeezing rows
        options.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)  # as wide as its rows need, never sideways
        self.options_scroll = options
        self.pages.addWidget(options)
        self.pages.addWidget(self._convert_page())
        self.step_label = QLabel(objectName="title")
        self.back_button = QPushButton(self.tr("Back"))
        self.back_button.clicked.connect(lambda: self._go(self.pages.currentIndex() - 1))
        self.next_button = QPushButton(self.tr("Next"), objectName="primary")
        self.next_button.clicked.connect(self._next)
        self.close_button = QPushButton(self.tr("Close"))
        self.close_button.clicked.connect(self.close)
        row = fill(QHBoxLayout(), 1, self.back_button, self.next_button, self.close_button)
        fill(QVBoxLayout(self), self.step_label, (self.pages, 1), row, margins=(18, 14, 18, 14))

    def _source_page(self) -> QWidget:
        page = QWidget()
        self.path_edit = QLineEdit(objectName="source_path", clearButtonEnabled=True,
                                   placeholderText=self.tr("type or paste a .gguf file, or a folder with config.json "
                                                           "and *.safetensors"))
        self.path_edit.setAccessibleName(self.tr("Model source"))
        self.path_edit.setAccessibleDescription(self.tr("The path of the model to convert; Enter reads it"))
        # a typed or pasted path is read once the typing pauses (or at Enter)
        self.path_timer = QTimer(self, objectName="source_path_timer", singleShot=True, interval=600)
        self.path_timer.timeout.connect(self._typed_path)
        self.path_edit.textEdited.connect(lambda _: self.path_timer.start())
        self.path_edit.returnPressed.connect(self._typed_path)
        gguf = QPushButton(self.tr("GGUF file…"))
        gguf.setAccessibleName(self.tr("Choose a GGUF file"))
        gguf.clicked.connect(self._pick_gguf)
        folder = QPushButton(self.tr("Hugging Face folder…"))
        folder.setAccessibleName(self.tr("Choose a Hugging Face model folder"))
        folder.clicked.connect(self._pick_folder)
        row = fill(QHBoxLayout(), (self.path_edit, 1), gguf, folder)
        self.source_status = _muted(name="source_status")
        self.read_bar = QProgressBar(objectName="read_progress", minimum=0, maximum=0, textVisible=False)
        self.read_bar.setAccessibleName(self.tr("Reading the source"))
        self.read_bar.setFixedHeight(6)
        self.read_bar.hide()
        self.read_clock = QElapsedTimer()
        self.read_timer = QTimer(self, objectName="read_timer", interval=250)
        self.read_timer.timeout.connect(self._reading)
        self.facts = QLabel(objectName="facts", wordWrap=True, textFormat=Qt.RichText)
        self.facts.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.facts.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        intro = _muted(self.tr("Colibri runs models converted into its own folder format. Pick the model to "
                               "convert: a GGUF file (as llama.cpp uses) or a Hugging Face folder with its "
                               "config.json and *.safetensors weights. Nothing is downloaded and the source "
                               "is never changed."))
        self.library = FoundModelsPanel()  # the models already on the disk, instead of an empty page
        self.library.chosen.connect(self.set_source)
        self.library.refresh()
        fill(QVBoxLayout(page), intro, row, self.read_bar, self.source_status, (self.library, 2), (self.facts, 1))
        return page

    def _options_page(self) -> QWidget:
        page = QWidget()
        qbox = QGroupBox(self.tr("Quantization: how each weight is stored"))
        ql = QVBoxLayout(qbox)
        self.quant_group = QButtonGroup(self)
        self.quant_buttons: dict[str, QRadioButton] = {}
        # one row per choice, as a model list reads: name, what it is, size on disk, memory, measured cost
        self.quant_cells: dict[str, tuple[QLabel, QLabel, QLabel]] = {}
        grid = QGridLayout()
        grid.setHorizontalSpacing(14)
        grid.setColumnStretch(1, 1)
        for col, head in ((2, self.tr("on disk")), (3, self.tr("memory from")),
                          (4, self.tr("measured on the default model"))):
            grid.addWidget(QLabel(f"<b>{html.escape(head)}</b>", objectName="quant_header"), 0, col)
        for row, q in enumerate(QUANTIZE, 1):
            b = QRadioButton(q, objectName=f"quant_{q}")
            self.quant_group.addButton(b)
            b.setAccessibleName(q)
            self.quant_buttons[q] = b
            b.toggled.connect(lambda on: on and self._update_options())
            cells = (QLabel(objectName=f"size_{q}"), QLabel(objectName=f"memory_{q}"),
                     QLabel(objectName=f"quality_{q}"))
            self.quant_cells[q] = cells
            grid.addWidget(b, row, 0)
            grid.addWidget(QLabel(self.tr(QUANTIZE_HELP[q]), objectName="help"), row, 1)
            for col, cell in enumerate(cells, 2):
                cell.setAlignment((Qt.AlignLeft if col == 4 else Qt.AlignRight) | Qt.AlignVCenter)
                grid.addWidget(cell, row, col)
        self.size_note, self.quality_note = _muted(name="size_note"), _muted(name="quality_note")
        fill(ql, grid, self.size_note, self.quality_note)
        cbox = QGroupBox(self.tr("Calibration (optional)"))
        cl = QVBoxLayout(cbox)
        self.calibration_edit = QLineEdit(objectName="calibration_path", clearButtonEnabled=True,
                                          placeholderText=self.tr("none: every weight counts the same"))
        self.calibration_edit.setAccessibleName(self.tr("Calibration text"))
        self.calibration_edit.setAccessibleDescription(self.tr("A text file the converter runs the model over, "
                                                               "to round the weights that matter most more carefully"))
        self.calibration_edit.textChanged.connect(lambda _: self._update_options())
        self.calibration_button = QPushButton(self.tr("Calibration text…"), objectName="calibration_button")
        self.calibration_button.setAccessibleName(self.tr("Choose a calibration text file"))
        self.calibration_button.clicked.connect(self._pick_calibration)
        self.calibration_note = _muted(name="calibration_note")
        fill(cl, fill(QHBoxLayout(), (self.calibration_edit, 1), self.calibration_button), self.calibration_note)
        ebox = QGroupBox(self.tr("Expert files"))
        self.split_expert = QRadioButton(self.tr("One file per expert: a token reads only the experts it uses "
                                                 "(recommended)"), objectName="split_expert", checked=True)
        self.split_layer = QRadioButton(self.tr("One file per layer: fewer, larger files"), objectName="split_layer")
        fill(QVBoxLayout(ebox), self.split_expert, self.split_layer)
        self.memory_table = QTableWidget(0, 3, objectName="memory_table")
        self.memory_table.setHorizontalHeaderLabels([self.tr("experts in memory per layer"), self.tr("memory needed"),
                                                     self.tr("what it means")])
        self.memory_table.setAccessibleName(self.tr("Memory by expert cache size"))
        self.memory_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.memory_table.setSelectionMode(QAbstractItemView.NoSelection)
        self.memory_table.verticalHeader().hide()
        self.memory_table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeToContents)
        self.memory_table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeToContents)
        self.memory_table.horizontalHeader().setSectionResizeMode(2, QHeaderView.Stretch)
        self.memory_table.setMinimumHeight(130)
        self.memory_note = _muted(name="memory_note")
        mbox = QGroupBox(self.tr("Memory by expert cache size"))
        fill(QVBoxLayout(mbox), self.memory_table, self.memory_note)
        self.name_edit = QLineEdit(objectName="target_name")
        self.name_edit.setAccessibleName(self.tr("Save as"))
        self.name_edit.textEdited.connect(lambda _: self._update_target())
        self.target_label = _muted(name="target")
        save_as = QLabel(self.tr("&Save as"))
        save_as.setBuddy(self.name_edit)
        nrow = fill(QHBoxLayout(), save_as, (self.name_edit, 1))
        fill(QVBoxLayout(page), qbox, cbox, ebox, (mbox, 1), nrow, self.target_label)
        return page

    def _convert_page(self) -> QWidget:
        page = QWidget()
        self.convert_title = QLabel(objectName="convert_title", wordWrap=True)
        self.bar = QProgressBar(objectName="convert_progress", minimum=0, maximum=1000)
        self.tensor_label = _muted(name="tensor")
        self.cancel_button = QPushButton(self.tr("Cancel"), objectName="cancel_convert")
        self.cancel_button.setAccessibleName(self.tr("Cancel the conversion"))
        self.cancel_button.clicked.connect(self.cancel)
        self.outcome = QLabel(objectName="outcome", wordWrap=True)
        self.open_button = QPushButton(self.tr("Open in chat"), objectName="primary")
        self.open_button.clicked.connect(self.open_in_chat)
        row = fill(QHBoxLayout(), self.cancel_button, 1, self.open_button)
        fill(QVBoxLayout(page), self.convert_title, self.bar, self.tensor_label, self.outcome, row, 1)
        return page

    # --- navigation --------------------------------------------------------------------------
    def _go(self, page: int) -> None:
        self.pages.setCurrentIndex(page)
        titles = [self.tr("1 · Choose the source"), self.tr("2 · Choose how to store it"), self.tr("3 · Convert")]
        self.step_label.setText(titles[page])
        self._update_buttons()

    def _update_buttons(self) -> None:
        page, busy = self.pages.currentIndex(), self.state in ("inspecting", "converting")
        self.back_button.setEnabled(page > SOURCE and not busy)
        self.next_button.setVisible(page < CONVERT)
        self.next_button.setText(self.tr("Convert") if page == OPTIONS else self.tr("Next"))
        self.next_button.setEnabled(not busy and self.summary is not None
                                    and (page != OPTIONS or bool(self.name_edit.text().strip())))
        self.cancel_button.setVisible(self.state == "converting")
        self.open_button.setVisible(self.state == "done")
        # one Cancel while converting (beside the progress bar); Close when there is nothing to cancel
        self.close_button.setText(self.tr("Close"))
        self.close_button.setVisible(not (page == CONVERT and self.state == "converting"))
        for b in (self.back_button, self.next_button, self.close_button, self.open_button):
            b.setAccessibleName(b.text())

    def _next(self) -> None:
        if self.pages.currentIndex() == SOURCE:
            self._go(OPTIONS)
        elif self.pages.currentIndex() == OPTIONS:
            self.start_conversion()

    # --- source ------------------------------------------------------------------------------
    def _pick_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, self.tr("Choose a GGUF file"), str(Path.home()), "GGUF (*.gguf)")
        if path:
            self.set_source(path)

    def _pick_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, self.tr("Choose a Hugging Face model folder"), str(Path.home()))
        if path:
            self.set_source(path)

    def _typed_path(self) -> None:
        self.path_timer.stop()
        text = self.path_edit.text().strip().strip("'\"")
        if not text or (self.summary is not None and str(self.summary.source) == text) or text == self._reading_path:
            return
        p = Path(text).expanduser()
        if p.is_file() or p.is_dir():
            self.set_source(str(p))
        else:
            self.source_status.setStyleSheet("")
            self.source_status.setText(self.tr("No file or folder at {path}").format(path=text))

    _reading_path = ""

    def set_source(self, path: str) -> None:
        """Read what `path` is, on the worker thread; the Source page shows it when it comes."""
        self.summary, self.state = None, "inspecting"
        self._reading_path = path
        if self.path_edit.text().strip() != path:
            self.path_edit.setText(path)
        self.source_status.setStyleSheet("")
        try:
            self._reading_size = Path(path).stat().st_size if Path(path).is_file() else 0
        except OSError:
            self._reading_size = 0
        self.read_clock.start()
        self._read_fraction: float | None = None
        self.read_bar.setRange(0, 0)  # busy until the reader says how far it is
        self._reading()
        self.read_bar.show()
        self.read_timer.start()
        self.facts.clear()
        self._update_buttons()
        self.inspect_requested.emit(path)

    def _reading(self) -> None:
        """"Reading model.gguf (432 MB)… 3 s": the bar moves and the seconds count while it reads."""
        name = Path(self._reading_path).name
        size = f" ({human_bytes(self._reading_size)})" if self._reading_size else ""
        secs = self.read_clock.elapsed() / 1000
        if getattr(self, "_read_fraction", None) is not None:
            self.source_status.setText(self.tr("Reading the header of {name}{size}: {pct:.0%}").format(
                name=name, size=size, pct=self._read_fraction))
            return
        self.source_status.setText(self.tr("Reading {name}{size}… {secs:.0f} s").format(name=name, size=size, secs=secs)
                                   if secs >= 1 else self.tr("Reading {name}{size}…").format(name=name, size=size))

    def _read_progress(self, source: str, fraction: float) -> None:
        """A GGUF's header is read (never its tensors): the bar shows how much of it."""
        if source != self._reading_path:
            return
        self._read_fraction = fraction
        self.read_bar.setRange(0, 1000)
        self.read_bar.setValue(int(fraction * 1000))
        self._reading()

    def _stop_reading(self) -> None:
        self.read_timer.stop()
        self.read_bar.hide()
        self._reading_path = ""

    def _inspected(self, source: str, summary: ModelSummary) -> None:
        if source != self._reading_path:
            return  # an older pick
        self._stop_reading()
        self.summary, self.state = summary, "idle"
        self.source_status.setText("")
        rows = "".join(f"<tr><td style='padding: 3px 14px 3px 0;'><b>{html.escape(k)}</b></td>"
                       f"<td style='padding: 3px 0;'>{html.escape(v)}</td></tr>" for k, v in summary.facts(
                           lambda t: QCoreApplication.translate("ModelInfo", t)))
        self.facts.setText(f"<table>{rows}</table>")
        self.quant_buttons[summary.default_quantize].setChecked(True)
        moe = summary.config.is_moe
        self.split_expert.setEnabled(moe)
        self.split_layer.setEnabled(moe)
        self._update_options(rename=True)
        self._update_buttons()

    # --- options -----------------------------------------------------------------------------
    @property
    def quantize(self) -> str:
        return next(q for q, b in self.quant_buttons.items() if b.isChecked())

    def _fit_options(self) -> None:
        """The options page as wide as its filled rows need (the window grows): a narrower page clipped them."""
        o = self.options_scroll
        o.setMinimumWidth(o.widget().minimumSizeHint().width() + o.verticalScrollBar().sizeHint().width())

    def _update_options(self, rename: bool = False) -> None:
        s = self.summary
        if s is None:
            return
        calibrated = bool(self.calibration)
        for q, b in self.quant_buttons.items():
            size, memory, quality = self.quant_cells[q]
            size.setText(human_bytes(s.sizes[q].total))
            memory.setText(human_bytes(s.memory_table(q)[0].ram_bytes))  # the fewest experts cached
            figures = self.quality_figures(q, calibrated and q in CALIBRATED)
            quality.setText(figures or "—")
            cost = self.tr("measured on the default model: {figures}").format(figures=figures) if figures else ""
            b.setAccessibleDescription(self.tr("{help}; {size} on disk, needs from {memory} of memory; {cost}").format(
                help=self.tr(QUANTIZE_HELP[q]), size=size.text(), memory=memory.text(), cost=cost))
        table = measured_on()
        note = self.tr("Quality: one model's figures, the default model's ({model}, converted from that file and "
                       "compared with its f16 over {positions} tokens); another model's cost differs.").format(
            model=table["model"], positions=table["positions"]) if table else ""
        stored = [q for q in QUANTIZE if already_stored(q)]
        if stored:
            note += " * " + self.tr("{q} shows no loss there because that file was stored in {q}'s format already; "
                                  "from 16 bits it costs more.").format(q=", ".join(stored))
        self.quality_note.setText(note)
        self.quality_note.setVisible(bool(table))
        self._fit_options()
        rounds = self.quantize in CALIBRATED
        self.calibration_edit.setEnabled(rounds)
        self.calibration_button.setEnabled(rounds)
        self.calibration_note.setText(self._calibration_note(rounds))
        note = size_note(s, self.quantize)
        self.size_note.setText(f"{self.quantize}: {note}" if note else "")
        self.size_note.setVisible(bool(note))
        rows = s.memory_table(self.quantize)
        self.memory_table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            label = self.tr("{n} of {experts}").format(n=row.experts_per_layer, experts=s.config.num_experts) \
                if s.config.is_moe else self.tr("all (dense)")
            for col, text in enumerate((label, human_bytes(row.ram_bytes), self.tr(row.note) if row.note else "")):
                item = QTableWidgetItem(text)
                item.setTextAlignment((Qt.AlignLeft if col == 2 else Qt.AlignRight) | Qt.AlignVCenter)
                self.memory_table.setItem(r, col, item)
        self.memory_note.setText(self.tr(
            "Weights always in memory ({dense}), the experts kept, and the KV cache for a {context:,}-token context "
            "in f16 ({kv}). Set the expert cache size in Settings after loading.").format(
            dense=human_bytes(s.sizes[self.quantize].dense), context=min(CONTEXT, s.config.max_position_embeddings),
            kv=human_bytes(s.kv_bytes())))
        if rename or not self.name_edit.isModified():
            self.name_edit.setText(default_target(self.models, s, self.quantize).name)
        self._update_target()

    def quality_figures(self, quantize: str, calibrated: bool = False) -> str:
        """"+4.6% perplexity, 88% same next token", the table's row for `quantize` ("" without one)."""
        cost = expected_cost(quantize, calibrated)
        if cost is None:
            return ""
        text = self.tr("{ppl:+.1f}% perplexity, {same:.0f}% same next token").format(
            ppl=cost["delta_ppl_pct"], same=cost["same_top_pct"])
        if calibrated:
            text = self.tr("calibrated: {figures}").format(figures=text)
        if already_stored(quantize):
            text += " *"  # the note under the table says why
        return text

    @property
    def calibration(self) -> str:
        """The calibration text's path, or "" (none, or a choice it does not apply to)."""
        return self.calibration_edit.text().strip().strip("'\"") if self.quantize in CALIBRATED else ""

    def _calibration_note(self, rounds: bool) -> str:
        if not rounds:
            return self.tr("Only int8, q4_k_m and int4 round weights: {q} needs no calibration.").format(
                q=self.quantize)
        path = self.calibration
        if path and not Path(path).expanduser().is_file():
            return self.tr("No file at {path}.").format(path=path)
        return self.tr("A text like the ones you will give the model (a few pages; at most 16,000 tokens are "
                       "used). The converter runs the model over it first, which adds minutes, and rounds the "
                       "weights that matter most more carefully.")

    def _pick_calibration(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, self.tr("Choose a calibration text file"), str(Path.home()),
                                              self.tr("Text (*.txt *.md);;All files (*)"))
        if path:
            self.calibration_edit.setText(path)

    @property
    def target(self) -> Path:
        return self.models / self.name_edit.text().strip()

    def _update_target(self) -> None:
        name = self.name_edit.text().strip()
        bad = not name or "/" in name or name in (".", "..")
        text = self.tr("Give the model a name.") if bad else \
            self.tr("It will be written to {path}.").format(path=self.target)
        if not bad and self.target.exists():
            text += " " + self.tr("A model with this name is in your library already: converting replaces it.")
        self.target_label.setText(text)
        self._update_buttons()
        missing = bool(self.calibration) and not Path(self.calibration).expanduser().is_file()
        self.next_button.setEnabled(self.next_button.isEnabled() and not bad and not missing)

    # --- converting --------------------------------------------------------------------------
    def start_conversion(self) -> None:
        s = self.summary
        self.state, self.result = "converting", None
        self.progress_seen = []
        self._started = time.monotonic()
        self.bar.setValue(0)
        self.convert_title.setText(self.tr("Converting {name} ({q}) into {target}").format(
            name=s.name, q=self.quantize, target=self.target))
        self.tensor_label.setText(self.tr("Opening {name}…").format(name=s.source.name))  # a big GGUF takes seconds
        calibration = self.calibration
        if calibration:  # until the forward over the text reports its first layer: say what the wait is
            self.tensor_label.setText(self.tr("Running {name} over the calibration text {text} (a few minutes)…")
                                      .format(name=s.source.name, text=Path(calibration).name))
        self.outcome.setText("")
        self.outcome.setStyleSheet("")
        self._go(CONVERT)
        self.worker.arm()  # before the request, so a Cancel pressed at once still counts
        self.convert_requested.emit(str(s.source), str(self.target), self.quantize,
                                    not s.config.is_moe or self.split_expert.isChecked(),
                                    str(Path(calibration).expanduser()) if calibration else "")

    def cancel(self) -> None:
        if self.state == "converting":
            self.worker.request_cancel()  # a threading.Event: direct, the worker's thread is busy
            self.tensor_label.setText(self.tr("Cancelling…"))

    def _progress(self, fraction: float, tensor: str) -> None:
        if self.progress_seen and fraction < self.progress_seen[-1]:  # calibration done, writing starts:
            self._started = time.monotonic()  # the time left is the new stage's own
        self.progress_seen.append(fraction)
        self.bar.setValue(int(fraction * 1000))
        self.tensor_label.setText(f"{tensor}  ({fraction:.0%}{eta_text(time.monotonic() - self._started, fraction)})")

    def _converted(self, result) -> None:
        self.state, self.result = "done", result
        self.bar.setValue(1000)
        kinds = ", ".join(f"{k} × {n}" for k, n in sorted(result.tensor_types.items(), key=lambda kv: -kv[1]))
        self.tensor_label.setText("")
        self.outcome.setText(self.tr("Done: {size} written in {seconds:.1f} s ({kinds}). The model is in your "
                                     "library.").format(size=human_bytes(result.bytes_written),
                                                        seconds=result.seconds, kinds=kinds))
        if getattr(result, "calibration", None):
            self.outcome.setText(self.outcome.text() + "\n" + self.calibration_outcome(result.calibration))
        self._update_buttons()
        self.open_button.setFocus()

    def calibration_outcome(self, c: dict) -> str:
        """What calibration did: the tokens it saw, and the expert matrices it never reached."""
        text = self.tr("Calibrated on {tokens:,} tokens: {weighted} matrices rounded by importance.").format(
            tokens=c["tokens"], weighted=c["weighted_matrices"])
        if c.get("expert_matrices") and not c.get("unrouted_expert_matrices"):
            text += " " + self.tr("The text reached all {experts} expert matrices.").format(experts=c["expert_matrices"])
        elif c.get("expert_matrices"):
            text += " " + self.tr("{unrouted} of {experts} expert matrices were never routed to by the text: "
                                  "they keep weight-only rounding.").format(
                unrouted=c["unrouted_expert_matrices"], experts=c["expert_matrices"])
        return text

    def _cancelled(self) -> None:
        self.state = "cancelled"
        self.tensor_label.setText("")
        self.outcome.setText(self.tr("Cancelled: nothing was written. Go back to change the options, or close."))
        self._update_buttons()

    def _failed(self, what: str, message: str) -> None:
        self._stop_reading()
        self.state = "failed"
        label = self.outcome if self.pages.currentIndex() == CONVERT else self.source_status
        label.setText(f"{what} failed: {message}")
        label.setStyleSheet(f"color: {self.palette().color(self.palette().ColorRole.Text).name()}; "
                            f"background: #fbe3e2; border: 1px solid #e5a5a2; border-radius: 6px; padding: 6px;")
        self.tensor_label.setText("")
        self._update_buttons()

    def open_in_chat(self) -> None:
        if self.result is not None:
            self.open_requested.emit(str(self.result.path))
            self.close()

    # --- closing -----------------------------------------------------------------------------
    def done(self, code: int) -> None:  # close(), Esc and the window's X all come here
        self.cancel()
        self.thread.quit()
        self.thread.wait()  # a cancelled conversion stops within one slice of one tensor
        super().done(code)
