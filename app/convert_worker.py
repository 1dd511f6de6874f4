"""The conversion wizard's worker: a source inspected and converted on the wizard's own thread, not
the engine's, so chatting goes on meanwhile; Cancel is a threading.Event set from the GUI thread."""
from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from app import model_library
from app.paths import models_dir
from app.worker import EngineWorker, throttled
from engine.errors import ConversionCancelled


class ConvertWorker(QObject):
    """Inspects and converts one source at a time; its slots run on the wizard's thread."""
    inspected = Signal(str, object)  # source, ModelSummary
    reading = Signal(str, float)  # source, fraction of its header read (GGUF; a folder says nothing)
    progress = Signal(float, str)  # fraction done, tensor name
    converted = Signal(object)  # engine ConvertResult
    cancelled = Signal()
    failed = Signal(str, str)  # what was being done, the specific error

    def __init__(self, copy_gguf: bool = False):
        """`copy_gguf`: a GGUF kept in its own formats is copied into the model folder too; by default the
        folder indexes it and the model runs from the GGUF itself (no second copy)."""
        super().__init__()
        self._cancel = threading.Event()
        self.copy_gguf = copy_gguf

    def arm(self) -> None:
        self._cancel.clear()

    def request_cancel(self) -> None:
        self._cancel.set()

    _fail = EngineWorker._fail

    @Slot(str)
    def inspect(self, source: str) -> None:
        from app.model_info import inspect
        try:
            self.inspected.emit(source, inspect(source, throttled(lambda f: self.reading.emit(source, f))))
        except Exception as e:  # noqa: BLE001 - an unreadable source is a message in the wizard
            self._fail(f"Reading {Path(source).name}", e)

    @Slot(str, str, str, bool, str)
    def convert(self, source: str, target: str, quantize: str, split_experts: bool, calibration: str = "") -> None:
        """`calibration`: a text file whose activations weight the rounding ("" for none)."""
        from engine.convert.convert import convert, in_place_refusal
        send = throttled(self.progress.emit)
        in_place = not self.copy_gguf and Path(source).is_file() and \
            in_place_refusal("gguf", quantize or "keep", split_experts, calibration) is None
        try:
            result = convert(source, target, quantize, split_experts=split_experts, force=True, in_place=in_place,
                             progress=lambda p: send(p.fraction, p.tensor), cancel=self._cancel,
                             calibration_data=calibration or None)
            if Path(target).parent == models_dir():
                model_library.record_source(result.path, source)
            self.converted.emit(result)
        except ConversionCancelled:
            self.cancelled.emit()
        except Exception as e:  # noqa: BLE001
            self._fail(f"Converting {Path(source).name}", e)
