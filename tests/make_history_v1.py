"""Writes tests/fixtures/history_v1.db with Colibri's schema-1 History (main at 7da0d92, before
message versions), for the migration test. Run it with that checkout on PYTHONPATH:
    PYTHONPATH=/path/to/colibri-at-7da0d92 python tests/make_history_v1.py
"""
from __future__ import annotations

from pathlib import Path

from app.history import SCHEMA_VERSION, History

OUT = Path(__file__).parent / "fixtures" / "history_v1.db"


def main() -> None:
    assert SCHEMA_VERSION == 1, "run this with a schema-1 Colibri on PYTHONPATH"
    OUT.unlink(missing_ok=True)
    h = History(OUT)
    a = h.create("Birds", system_prompt="Be brief.", sampling={"temperature": 0.3})
    h.add_message(a.id, "user", "Name a bird")
    h.add_message(a.id, "assistant", "Robin", {"generated_tokens": 2, "finish_reason": "stop"})
    b = h.create("Fish")
    h.add_message(b.id, "user", "Name a fish")
    h.add_message(a.id, "user", "Another?")  # the two chats' messages interleave
    h.add_message(b.id, "assistant", "Trout", {"generated_tokens": 3})
    h.add_message(a.id, "assistant", "Wren")
    h.db.execute("VACUUM")
    h.close()


if __name__ == "__main__":
    main()
