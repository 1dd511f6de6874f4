"""Entry point of the frozen bundle (packaging/colibri.spec): the `colibri` command, app.gui_main.main."""
import sys

from app.gui_main import main  # (which calls engine.kernels.setup() before the window imports the kernels)

if __name__ == "__main__":
    sys.exit(main())
