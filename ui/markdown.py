"""Markdown → the HTML subset QTextBrowser renders, with pygments colours and a Copy link per code block.

Code blocks are collected in `codes`; a block's Copy link is `<action>:N`, N its index there.
"""
from __future__ import annotations

import html

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound
from PySide6.QtCore import QCoreApplication

_FORMATTERS: dict[str, HtmlFormatter] = {}


def _formatter(style: str) -> HtmlFormatter:
    if style not in _FORMATTERS:
        _FORMATTERS[style] = HtmlFormatter(noclasses=True, nowrap=True, style=style)
    return _FORMATTERS[style]


class MarkdownRenderer:
    def __init__(self, colors: dict[str, str], action: str = "copy"):
        self.c = colors
        self.action = action  # the scheme of the Copy links: ChatView's per-render token + ":copy"
        # breaks: a single newline is a line break, as in chat apps (lists, poems and addresses written one
        # per line stay so; commonmark would join them into one line)
        self.md = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True}).enable("table")
        self.md.renderer.rules["fence"] = self._fence
        self.md.renderer.rules["code_block"] = self._fence
        self.codes: list[str] = []

    def _fence(self, tokens, idx, options, env) -> str:
        tok = tokens[idx]
        lang = (tok.info or "").strip().split(" ")[0]
        try:
            lexer = get_lexer_by_name(lang) if lang else TextLexer()
        except ClassNotFound:
            lexer = TextLexer()
        code = tok.content.rstrip("\n")
        self.codes.append(code)
        body = highlight(code, lexer, _formatter(self.c["pygments"])).rstrip("\n")
        c = self.c
        copy = QCoreApplication.translate("ChatView", "Copy")
        link = f'<a href="{self.action}:{len(self.codes) - 1}" style="color: {c["link"]}; text-decoration: none">{copy}</a>'
        return (f'<table width="100%" cellspacing="0" cellpadding="8" border="0" style="margin-top: 4px; '
                f'margin-bottom: 6px"><tr><td bgcolor="{c["code_border"]}"><span style="color: {c["muted"]}">'
                f'{html.escape(lang or "code")}</span> &nbsp;·&nbsp; {link}</td></tr>'
                f'<tr><td bgcolor="{c["code"]}"><pre style="margin: 0; white-space: pre-wrap">{body}</pre></td></tr></table>\n')

    def render(self, text: str) -> str:
        return self.md.render(text)
