"""colibri: the desktop chat window. First run converts the default model (with a progress
dialog); later runs open straight into the chat on the last model used.

    colibri                      # the last model, or the default one
    colibri --model FOLDER|FILE.gguf
"""
from __future__ import annotations

import argparse
import logging
import sys
import traceback

from PySide6.QtWidgets import QApplication, QMessageBox

from app import settings as app_settings
from app.history import History


def _crash_dialog(kind, value, tb) -> None:
    """An uncaught exception becomes a dialog (and a log line) instead of a silent failure."""
    text = "".join(traceback.format_exception(kind, value, tb))
    logging.getLogger("colibri.ui").error("uncaught exception:\n%s", text)
    if QApplication.instance() is not None:
        box = QMessageBox(QMessageBox.Critical, "Colibri: unexpected error", f"{kind.__name__}: {value}")
        box.setDetailedText(text)
        box.exec()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="colibri", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a Colibri model folder or a .gguf file (default: the last one used)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Colibri")
    from ui.main_window import MainWindow  # after the QApplication: widgets need it
    settings = app_settings.load()
    history = History()
    window = MainWindow(settings, history)
    window.show()
    for notice in settings.notices + ([history.notice] if history.notice else []):
        QMessageBox.warning(window, "Colibri", notice)
    sys.excepthook = _crash_dialog
    window.flow.start(args.model)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
