"""Attachments are bounded by the work of reading them, not by the file's size, and read off the GUI
thread: a few KB of PDF whose page draws one form a thousand times is stopped at the character cap
or the time cap, and the window keeps painting meanwhile."""
from __future__ import annotations

import time

import pytest
import test_ui_main_window as M
from pypdf import PdfWriter
from pypdf.generic import ArrayObject, DecodedStreamObject, DictionaryObject, FloatObject, NameObject
from PySide6.QtCore import QTimer
from test_attachments import make_pdf

from app import attachments as A
from app.attachments import AttachmentError, read_attachment

home = M.home


def crafted_pdf(path, depth: int = 5, fan: int = 10, leaf: str = "A " * 500):
    """One page drawing a form that draws a form ... `fan` times per level: a few KB of file, millions of
    characters of text (pypdf stops at 5,000 form invocations: seconds of work)."""
    w = PdfWriter()
    font = w._add_object(DictionaryObject({NameObject("/Type"): NameObject("/Font"),
                                           NameObject("/Subtype"): NameObject("/Type1"),
                                           NameObject("/BaseFont"): NameObject("/Helvetica")}))
    fonts = DictionaryObject({NameObject("/F1"): font})

    def form(data: bytes, resources: DictionaryObject):
        s = DecodedStreamObject()
        s.set_data(data)
        s.update({NameObject("/Type"): NameObject("/XObject"), NameObject("/Subtype"): NameObject("/Form"),
                  NameObject("/BBox"): ArrayObject([FloatObject(0), FloatObject(0), FloatObject(300), FloatObject(200)]),
                  NameObject("/Resources"): resources})
        return w._add_object(s)

    def calling(x) -> DictionaryObject:
        return DictionaryObject({NameObject("/XObject"): DictionaryObject({NameObject("/X"): x}),
                                 NameObject("/Font"): fonts})
    x = form(f"BT /F1 12 Tf 20 100 Td ({leaf}) Tj ET".encode(), DictionaryObject({NameObject("/Font"): fonts}))
    for _ in range(depth - 1):
        x = form(b"/X Do " * fan, calling(x))
    page = w.add_blank_page(300, 200)
    page[NameObject("/Resources")] = calling(x)
    s = DecodedStreamObject()
    s.set_data(b"/X Do " * fan)
    page[NameObject("/Contents")] = w._add_object(s)
    w.write(path)
    return path


def test_the_character_cap_stops_extraction_before_the_whole_text_exists(tmp_path):
    path = crafted_pdf(tmp_path / "bomb.pdf")
    assert path.stat().st_size < 8192
    with pytest.raises(AttachmentError, match=r"bomb.pdf: more than the 2,000,000 characters an attachment may have "
                                              r"\(stopped on page 1\)"):
        read_attachment(path)


def test_the_time_and_page_caps_stop_extraction(tmp_path, monkeypatch):
    path = crafted_pdf(tmp_path / "slow.pdf", leaf="A ")
    t0 = time.perf_counter()
    with pytest.raises(AttachmentError, match=r"slow.pdf: reading its text took more than 0.3 s \(stopped on page 1\)"):
        read_attachment(path, seconds=0.3)
    assert time.perf_counter() - t0 < 1.5
    monkeypatch.setattr(A, "MAX_PAGES", 2)
    with pytest.raises(AttachmentError, match=r"three.pdf: 3 pages is more than the 2 an attachment may have"):
        read_attachment(make_pdf(tmp_path / "three.pdf", ["a", "b", "c"]))


def test_a_reader_that_fails_in_any_way_is_the_attachments_error(tmp_path):
    path = tmp_path / "loop.pdf"  # a page tree whose kids are itself
    path.write_bytes(b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
                     b"2 0 obj << /Type /Pages /Kids [2 0 R] /Count 1 >> endobj\n"
                     b"trailer << /Root 1 0 R >>\n%%EOF\n")
    with pytest.raises(AttachmentError, match=r"loop.pdf: not a readable PDF"):
        read_attachment(path)


@pytest.mark.qt_log_level_fail("WARNING")
@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_the_window_keeps_painting_while_a_pdf_is_read(qtbot, home, tmp_path, monkeypatch):
    import threading
    w = M.open_window(qtbot, None, wait=False)
    path = crafted_pdf(tmp_path / "bomb.pdf")
    readers = []
    real_read = A.read_attachment
    monkeypatch.setattr(A, "read_attachment", lambda p: readers.append(threading.current_thread()) or real_read(p))
    ticks = []
    timer = QTimer(interval=20, timeout=lambda: ticks.append(time.perf_counter()))
    timer.start()
    t0 = time.perf_counter()
    w.attach(path)
    assert time.perf_counter() - t0 < 0.5  # the GUI thread only started the job
    qtbot.waitUntil(lambda: bool(M.dialogs("error_dialog")), timeout=60_000)
    timer.stop()
    box = M.dialogs("error_dialog")[0]
    assert "more than the 2,000,000 characters" in box.informativeText() and not w.tray.items
    # read on a thread of its own while the event loop went on (how often it ticked depends on what else
    # holds the interpreter: in the full suite, earlier tests' compiles on their threads; not asserted)
    assert readers and threading.main_thread() not in readers and ticks
    box.close()
    pdf = make_pdf(tmp_path / "fine.pdf", ["Hello from a PDF"])
    w.attach(pdf)
    qtbot.waitUntil(lambda: any(a.name == "fine.pdf" for a in w.tray.items.values()), timeout=30_000)
    assert "Hello from a PDF" in next(iter(w.tray.items.values())).text
