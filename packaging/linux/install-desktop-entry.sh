#!/usr/bin/env bash
# Adds Colibri to the desktop's application menu for this user: run it from the bundle's folder
# (dist/colibri/install-desktop-entry.sh). Writes ~/.local/share/applications/colibri.desktop (Exec = this
# bundle's colibri) and the icon into ~/.local/share/icons/hicolor/256x256/apps/. Remove both to undo.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
data="${XDG_DATA_HOME:-$HOME/.local/share}"
mkdir -p "$data/applications" "$data/icons/hicolor/256x256/apps"
install -m 644 "$here/colibri.png" "$data/icons/hicolor/256x256/apps/colibri.png"
sed -e "s|^Exec=colibri|Exec=\"$here/colibri\"|" -e "s|^TryExec=colibri|TryExec=$here/colibri|" \
  "$here/colibri.desktop" > "$data/applications/colibri.desktop"
command -v update-desktop-database >/dev/null && update-desktop-database -q "$data/applications" || true
echo "installed $data/applications/colibri.desktop"
