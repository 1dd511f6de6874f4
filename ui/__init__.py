"""Colibri's desktop window (PySide6 Widgets). Talks to the engine only through app/."""
