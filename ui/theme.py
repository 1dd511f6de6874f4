"""Light and dark themes: one palette per theme fills resources/style.qss and the chat's HTML."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

RESOURCES = Path(__file__).resolve().parent.parent / "resources"

PALETTES: dict[str, dict[str, str]] = {
    "light": {"bg": "#ffffff", "sidebar": "#f3f4f6", "text": "#1f2328", "muted": "#5f6670",
              "border": "#d5d9de", "hover": "#e6e9ed", "selected": "#dde6f7", "accent": "#2563eb",
              "input": "#ffffff", "button": "#f6f7f9", "danger": "#c93c37", "user": "#eef3fc",
              "assistant": "#ffffff", "code": "#f6f8fa", "code_border": "#e1e4e8", "link": "#2563eb",
              "pygments": "default"},
    "dark": {"bg": "#1e1f22", "sidebar": "#18191b", "text": "#e3e5e8", "muted": "#9ba1a9",
             "border": "#3a3d42", "hover": "#2b2d31", "selected": "#2f3a4f", "accent": "#4d8dff",
             "input": "#26282c", "button": "#2b2d31", "danger": "#d9534f", "user": "#263146",
             "assistant": "#1e1f22", "code": "#141517", "code_border": "#34373c", "link": "#7aa9ff",
             "pygments": "monokai"},
}


def palette(theme: str) -> dict[str, str]:
    return PALETTES[theme]


def style_sheet(theme: str, font_pt: int) -> str:
    qss = (RESOURCES / "style.qss").read_text()
    values = PALETTES[theme] | {"ui_pt": str(max(9, font_pt - 1)), "small_pt": str(max(8, font_pt - 2)),
                                "title_pt": str(font_pt + 1), "resources": RESOURCES.as_posix()}
    for name, value in values.items():
        qss = qss.replace("{" + name + "}", value)
    return qss


def apply(app: QApplication, theme: str, font_pt: int) -> None:
    c = PALETTES[theme]
    app.setStyle("Fusion")
    pal = QPalette()
    for role, key in [(QPalette.Window, "bg"), (QPalette.WindowText, "text"), (QPalette.Base, "input"),
                      (QPalette.AlternateBase, "sidebar"), (QPalette.Text, "text"), (QPalette.Button, "button"),
                      (QPalette.ButtonText, "text"), (QPalette.Highlight, "accent"), (QPalette.Link, "link"),
                      (QPalette.ToolTipBase, "input"), (QPalette.ToolTipText, "text"),
                      (QPalette.PlaceholderText, "muted")]:
        pal.setColor(role, QColor(c[key]))
    pal.setColor(QPalette.HighlightedText, QColor("#ffffff"))
    pal.setColor(QPalette.Disabled, QPalette.Text, QColor(c["muted"]))
    pal.setColor(QPalette.Disabled, QPalette.ButtonText, QColor(c["muted"]))
    app.setPalette(pal)
    app.setStyleSheet(style_sheet(theme, font_pt))
