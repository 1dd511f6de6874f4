"""Entry point of the frozen bundle (packaging/colibri.spec): the `colibri` command, app.gui_main.main."""
import sys

# Numba's settings (NUMBA_CACHE_DIR under the user cache folder, the threading layer, the SIMD target)
# must be in the environment before numba is first imported: numba picks a kernel's cache folder when
# the kernel is decorated, from the settings it read at import. engine/api.py imports numba before
# engine.kernels; without this line the cache would go next to the bundle's kernel sources.
import engine.kernels  # noqa: F401,E402  (first, on purpose)
from app.gui_main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
