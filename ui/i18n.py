"""The interface language: Qt translators for Colibri's strings (resources/i18n/colibri_<lang>.qm) and
Qt's own (standard buttons, file dialogs), chosen by the `language` setting.

The .qm files are committed next to their .ts sources, so nothing is built at run time; after
editing a .ts, run `pyside6-lrelease resources/i18n/colibri_zh_CN.ts`. `pyside6-lupdate ui/*.py -ts …`
finds the `self.tr("…")` strings; the ones passed through a helper (`_tr` in chat_view, dashboard, model_flow,
param_form and models: parameter names, help and choices, the worker's "what failed" phrases) it
cannot see and marks vanished: keep them (never run it with -no-obsolete).
"""
from __future__ import annotations

import logging

from PySide6.QtCore import QCoreApplication, QLibraryInfo, QLocale, QTranslator

from ui.theme import RESOURCES

log = logging.getLogger("colibri.ui")

I18N = RESOURCES / "i18n"
TRANSLATED = ("zh_CN",)  # languages with a colibri_<lang>.qm; English is the source language


def resolve(language: str) -> str:
    """The language to show: "system" follows the desktop's locale when a translation exists."""
    if language != "system":
        return language
    name = QLocale.system().name()  # e.g. "zh_CN", "en_US"
    return next((t for t in TRANSLATED if name == t or name.split("_")[0] == t.split("_")[0]), "en")


def install(app: QCoreApplication, language: str) -> list[QTranslator]:
    """Install the translators for `language` on `app`; returns them (keep them alive, or remove
    them with `uninstall`). English installs none."""
    lang = resolve(language)
    if lang == "en":
        return []
    installed = []
    for directory, name in ((str(I18N), f"colibri_{lang}"),
                            (QLibraryInfo.path(QLibraryInfo.LibraryPath.TranslationsPath), f"qtbase_{lang}")):
        t = QTranslator(app)
        if t.load(name, directory):
            app.installTranslator(t)
            installed.append(t)
        else:
            log.warning("no translation %s in %s: those strings stay in English", name, directory)
    return installed


def uninstall(app: QCoreApplication, translators: list[QTranslator]) -> None:
    for t in translators:
        app.removeTranslator(t)
        t.deleteLater()


def switch(app: QCoreApplication, old: list[QTranslator], language: str) -> list[QTranslator]:
    """Change the language of a running app: every widget gets a LanguageChange event and
    re-reads its texts (MainWindow.retranslate). Returns the new translators (keep them)."""
    uninstall(app, old)
    return install(app, language)
