"""colibri: the desktop app's entry point. Until the chat window exists, it opens colibri-cli's
interactive chat on the default model (same flags)."""
from __future__ import annotations

import sys

from app.cli_chat import main as cli_main


def main(argv: list[str] | None = None) -> int:
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
