"""The interface language: Qt translators for Colibri's strings (resources/i18n/colibri_<lang>.qm) and
Qt's own, chosen by the `language` setting.

The .qm files are committed next to their .ts sources; after editing a .ts, run `pyside6-lrelease`.
`pyside6-lupdate` cannot see the strings passed through a helper (`_tr`) and marks them vanished:
keep them (never run it with -no-obsolete).
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
    """Change a running app's language (each widget re-reads its texts); the new translators (keep them)."""
    uninstall(app, old)
    return install(app, language)
