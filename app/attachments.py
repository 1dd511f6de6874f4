"""Files attached to a message: text, Markdown, source code and PDF, read into plain text.

The text goes to the model inside the user's message, never as structure: the tokenizer's
role-injection rule (engine/tokenizer.py) keeps a file's `<|im_end|>` as the characters it is.
A file that is not text, too big, or a PDF that is damaged, password-protected or only scanned
images is refused with an `AttachmentError` naming the file and what is wrong. A PDF is bounded by
the work of reading it, not its size (a few KB can draw millions of characters): its text is taken
page by page under a page, character and time cap, checked as each piece of text comes out, and
the window reads PDFs off its GUI thread.
"""
from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.errors import ColibriError

MAX_TEXT_BYTES = 4 * 2**20  # a text file this big is ~1M tokens: more than any local context
MAX_PDF_BYTES = 64 * 2**20
MAX_CHARS = 2_000_000  # the extracted text, PDFs included
MAX_PAGES = 5000
PDF_SECONDS = 30.0  # reading one PDF's text stops after this
SNIFF_BYTES = 8192  # how much is looked at to tell text from binary

MARKDOWN = {".md", ".markdown", ".mdx", ".rst"}
CODE = {".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".cu", ".rs", ".go", ".java", ".kt", ".js", ".ts",
        ".tsx", ".jsx", ".rb", ".php", ".swift", ".cs", ".m", ".scala", ".sh", ".bash", ".zsh", ".ps1", ".sql",
        ".lua", ".r", ".jl", ".hs", ".ml", ".ex", ".exs", ".zig", ".toml", ".yaml", ".yml", ".json", ".xml",
        ".html", ".css", ".ini", ".cfg", ".cmake", ".mk", ".dockerfile", ".tex"}
FILE_FILTER = "Text, Markdown, code and PDF (*.txt *.md *.markdown *.rst *.log *.csv *.pdf " + \
    " ".join(f"*{e}" for e in sorted(CODE)) + ");;All files (*)"


class AttachmentError(ColibriError):
    """A file that cannot be attached, and why."""


@dataclass(frozen=True)
class Attachment:
    name: str  # the file's name (no folder: the model and the history need no more)
    kind: str  # "text", "markdown", "code" or "pdf"
    text: str
    tokens: int | None = None  # counted by the loaded model (None until it has)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def kind_of(path: Path) -> str:
    ext = path.suffix.lower()
    if ext == ".pdf":
        return "pdf"
    if ext in MARKDOWN:
        return "markdown"
    if ext in CODE or path.name.lower() in ("makefile", "dockerfile", "cmakelists.txt"):
        return "code"
    return "text"


def _decode(raw: bytes, name: str) -> str:
    """UTF-8 (a BOM allowed) or UTF-16 with its BOM; anything else with NUL bytes or invalid
    UTF-8 is binary as far as a chat is concerned."""
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            return raw.decode("utf-16")
        except UnicodeDecodeError as e:
            raise AttachmentError(f"{name}: not valid UTF-16 text (byte {e.start})") from None
    if b"\0" in raw[:SNIFF_BYTES]:
        raise AttachmentError(f"{name}: a binary file, not text (attach text, Markdown, code or PDF)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise AttachmentError(f"{name}: not UTF-8 text (invalid byte at {e.start}); save it as UTF-8 "
                              f"and attach it again") from None


def _pdf_pages(reader: Any, name: str, seconds: float) -> list[str]:
    """Each page's text, stopped (AttachmentError) as soon as a cap is passed: pypdf hands every
    piece of text to the visitor as it goes, so a page that would draw millions of characters
    is cut off inside its extraction."""
    if len(reader.pages) > MAX_PAGES:
        raise AttachmentError(f"{name}: {len(reader.pages):,} pages is more than the {MAX_PAGES:,} an attachment "
                              f"may have")
    deadline, chars, pages = time.monotonic() + seconds, 0, []
    for number, page in enumerate(reader.pages, 1):
        def visit(text: str, *_: Any, page_number: int = number) -> None:
            nonlocal chars
            chars += len(text)
            if chars > MAX_CHARS:
                raise AttachmentError(f"{name}: more than the {MAX_CHARS:,} characters an attachment may have "
                                      f"(stopped on page {page_number})")
            if time.monotonic() > deadline:
                raise AttachmentError(f"{name}: reading its text took more than {seconds:g} s (stopped on page "
                                      f"{page_number})")
        visit("")
        pages.append(page.extract_text(visitor_text=visit) or "")
    return pages


def _pdf_text(path: Path, seconds: float = PDF_SECONDS) -> str:
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError
    name = path.name
    try:
        reader = PdfReader(path)
        if reader.is_encrypted and not reader.decrypt(""):  # an owner password alone still opens
            raise AttachmentError(f"{name}: the PDF is password-protected; save an unprotected copy to attach it")
        pages = _pdf_pages(reader, name, seconds)
    except AttachmentError:
        raise
    except FileNotDecryptedError:
        raise AttachmentError(f"{name}: the PDF is password-protected; save an unprotected copy to attach it") \
            from None
    except Exception as e:  # noqa: BLE001 - whatever a hostile file makes the reader raise is this file's error
        raise AttachmentError(f"{name}: not a readable PDF ({e})") from None
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise AttachmentError(f"{name}: the PDF has no text layer ({len(pages)} pages; a scan needs OCR first)")
    return text


def is_pdf(path: str | Path) -> bool:
    """A PDF by its name or its first bytes (the kind whose reading is work, not a decode)."""
    p = Path(path)
    if kind_of(p) == "pdf":
        return True
    try:
        with open(p, "rb") as f:
            return f.read(5) == b"%PDF-"
    except OSError:
        return False


def read_attachment(path: str | Path, seconds: float = PDF_SECONDS) -> Attachment:
    """The file's text, ready to send; AttachmentError says why a file cannot be attached.
    `seconds`: how long a PDF's text may take to read."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise AttachmentError(f"{p.name}: {e.strerror or e}") from None
    if not p.is_file():
        raise AttachmentError(f"{p.name}: not a file")
    kind = kind_of(p)
    cap = MAX_PDF_BYTES if kind == "pdf" else MAX_TEXT_BYTES
    if size > cap:
        raise AttachmentError(f"{p.name}: {size / 2**20:.1f} MB is more than the {cap // 2**20} MB a "
                              f"{'PDF' if kind == 'pdf' else 'text file'} may have")
    if kind == "pdf":
        text = _pdf_text(p, seconds)
    else:
        try:
            raw = p.read_bytes()
        except OSError as e:
            raise AttachmentError(f"{p.name}: {e.strerror or e}") from None
        if raw.startswith(b"%PDF-"):
            kind, text = "pdf", _pdf_text(p, seconds)
        else:
            text = _decode(raw, p.name)
    if len(text) > MAX_CHARS:
        raise AttachmentError(f"{p.name}: {len(text):,} characters of text is more than the {MAX_CHARS:,} "
                              f"an attachment may have")
    if not text.strip():
        raise AttachmentError(f"{p.name}: the file is empty")
    return Attachment(p.name, kind, text.replace("\r\n", "\n"))


def _fence(text: str) -> str:
    """A Markdown fence longer than any backtick run in the text, so the file cannot close it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def with_attachments(content: str, attachments: list[dict] | list[Attachment]) -> str:
    """The message as the model reads it: the user's text, then each file fenced under its name."""
    parts = [content] if content else []
    for a in attachments:
        a = a if isinstance(a, dict) else a.as_dict()
        fence = _fence(a["text"])
        parts.append(f"Attached file: {a['name']}\n{fence}\n{a['text']}\n{fence}")
    return "\n\n".join(parts)
