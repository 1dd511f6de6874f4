"""colibri: the desktop chat window. First run converts the default model (with a progress
dialog); later runs open straight into the chat on the last model used.

    colibri                      # the last model, or the default one
    colibri --model FOLDER|FILE.gguf
    colibri --prompt "Hello"     # no window: one reply from the same model on stdout, then exit
                                 # (also takes colibri-cli's flags, e.g. --max_tokens 64 --temperature 0)
    colibri --version
"""
from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sqlite3
import sys
import traceback

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QMessageBox

from app import model_library, qt_platform
from app import settings as app_settings
from app.history import History, HistoryError
from engine import kernels
from engine import params as P


def _crash_dialog(kind, value, tb) -> None:
    """An uncaught exception becomes a dialog (and a log line) instead of a silent failure."""
    text = "".join(traceback.format_exception(kind, value, tb))
    logging.getLogger("colibri.ui").error("uncaught exception:\n%s", text)
    if QApplication.instance() is not None:
        box = QMessageBox(QMessageBox.Critical, "Colibri: unexpected error", f"{kind.__name__}: {value}")
        box.setTextFormat(Qt.PlainText)  # an error's text is text: never rich text, never a link
        box.setDetailedText(text)
        box.exec()


def version() -> str:
    """The installed package's version; a frozen build carries the metadata (packaging/colibri.spec)."""
    try:
        return importlib.metadata.version("colibri")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (no package metadata" + (" in this build)" if getattr(sys, "frozen", False) else ")")


def answer_once(prompt: str, model: str | None, cli_flags: list[str]) -> int:
    """--prompt: no window; colibri-cli answers with the chat's model (--model, the last used, the default)."""
    from app import cli_chat
    from engine.errors import ColibriError
    from engine.model_dir import open_model_dir
    if model is None and (last := app_settings.load().model):
        try:
            open_model_dir(last)
            model = last
        except (ColibriError, OSError):
            pass  # gone or damaged: the default model, as the window would
    return cli_chat.main((["--model", model] if model else []) + cli_flags + ["--prompt", prompt])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="colibri", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a Colibri model folder or a .gguf file (default: the last one used)")
    ap.add_argument("--prompt", help="answer this one message on stdout and exit, without a window")
    ap.add_argument("--version", action="version", version=f"colibri {version()}")
    args, rest = ap.parse_known_args(argv)
    if args.prompt is not None:
        return answer_once(args.prompt, args.model, rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    missing = qt_platform.missing_packages()  # Qt would abort the process with a misleading hint
    if missing:
        print(f"Colibri's window cannot open: Qt's X11 platform plugin needs libraries this system lacks.\n"
              f"Install them with:  sudo apt-get install {' '.join(missing)}\n"
              f"(or run: bash packaging/setup.sh run, which installs them)", file=sys.stderr)
        return 1
    app = QApplication.instance() or QApplication(sys.argv[:1])
    sys.excepthook = _crash_dialog  # first: whatever fails from here on is a dialog, not a bare traceback
    from pyqtgraph.util.garbage_collector import GarbageCollector

    from ui import pyside_refcount
    pyside_refcount.install()  # a no-op unless the Qt binding has the None refcount bug
    # Garbage is collected on the GUI thread only: a collection that runs on a worker thread
    # would delete Qt objects there. The collector runs from a GUI timer instead.
    collector = GarbageCollector(interval=1.0)  # noqa: F841  (kept alive by this frame)
    app.setApplicationName("Colibri")
    app.setDesktopFileName("colibri")  # matches packaging/linux/colibri.desktop
    from PySide6.QtGui import QIcon

    from ui.theme import RESOURCES
    app.setWindowIcon(QIcon(str(RESOURCES / "colibri.png")))
    settings = app_settings.load()
    logging.getLogger("colibri").setLevel(settings.engine.get("log_level") or P.PARAMS["log_level"].default)
    kernels.setup(settings.engine.get("simd"), settings.engine.get("simd_path"))  # before the window imports them
    from ui import i18n
    from ui.main_window import MainWindow  # after the QApplication: widgets need it
    translators = i18n.install(app, settings.language)  # noqa: F841  (before any widget: kept alive here)
    try:
        history = History()
    except (HistoryError, OSError, sqlite3.Error) as e:  # e.g. a newer Colibri's database, a read-only folder
        logging.getLogger("colibri.ui").error("the conversation history cannot be opened: %s", e)
        box = QMessageBox(QMessageBox.Critical, "Colibri", app.translate("Main", "The conversation history cannot be "
                          "opened, so Colibri cannot start."))
        box.setObjectName("history_error")
        box.setTextFormat(Qt.PlainText)
        box.setInformativeText(str(e))
        box.exec()
        return 1
    notices = list(settings.notices) + ([history.notice] if history.notice else [])
    try:
        notices += [app.translate("Main", "An interrupted model replacement was undone: {path} is the previous "
                                  "model again.").format(path=p) for p in model_library.recover()]
    except OSError as e:
        notices.append(f"models: {e}")
    window = MainWindow(settings, history, translators)
    window.show()
    for notice in notices:
        box = QMessageBox(QMessageBox.Warning, "Colibri", notice, QMessageBox.Ok, window)
        box.setTextFormat(Qt.PlainText)
        box.exec()
    window.flow.start(args.model)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
