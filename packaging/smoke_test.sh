#!/usr/bin/env bash
# packaging/smoke_test.sh — build the desktop bundle, then run it as a user would, headless (docs/packaging.md).
#   packaging/smoke_test.sh                 build (packaging/build), then test dist/colibri
#   SKIP_BUILD=1 packaging/smoke_test.sh    test the bundle already in dist/colibri
# Not part of pytest: it takes minutes and a few hundred MB of disk.
# Each run of the bundle has a clean environment (no venv, no PYTHONPATH, cwd = /) and its own COLIBRI_HOME:
#   1. --version and --help exit 0;
#   2. --prompt on a fresh home converts the default model from the bundle's data, prints a non-empty
#      reply on stdout and exits 0; a second --prompt recompiles no numba kernel (the cache dir is unchanged);
#   3. the window (QT_QPA_PLATFORM=offscreen) on a fresh home: first start converts with the progress dialog
#      and opens the chat; the second start must reach a loaded, warm model within SECOND_START_LIMIT_S
#      (default 5). "Ready" is when the app saves settings.json, which it does once the model is loaded.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_BUILD:-0}" = 1 ] || packaging/build
BUNDLE="$(pwd)/dist/colibri/colibri"
LIMIT="${SECOND_START_LIMIT_S:-5}"
PROMPT="Write one short sentence about hummingbirds."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "SMOKE TEST FAILED: $*"; for f in "$work"/*.err; do echo "--- $f"; tail -20 "$f"; done; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
run() {  # run HOME_DIR ARGS...: the bundle in a clean environment (exec: `run … &` gives the app's pid)
  local home="$1"; shift
  cd / && exec env -i HOME="$HOME" PATH=/usr/bin:/bin LANG=C.UTF-8 QT_QPA_PLATFORM=offscreen \
    COLIBRI_HOME="$home" "$BUNDLE" "$@"
}
numba_cache() { { find "$1/cache/numba" -type f -printf '%P %s %T@\n' 2>/dev/null || true; } | sort; }

echo "== bundle: $(du -sh dist/colibri | cut -f1)"
(run "$work/h0" --version) > "$work/version.out" 2> "$work/version.err" || fail "--version exited $?"
grep -Eq '^colibri [0-9]' "$work/version.out" || fail "--version printed: $(cat "$work/version.out")"
echo "== --version: $(cat "$work/version.out")"
(run "$work/h0" --help) > "$work/help.out" 2> "$work/help.err" || fail "--help exited $?"
grep -q -- "--prompt" "$work/help.out" || fail "--help does not mention --prompt"
echo "== --help: ok ($(wc -l < "$work/help.out") lines)"

# --- headless: one prompt, first run then second run ---------------------------------------------
for n in 1 2; do
  t=$(now)
  (run "$work/h1" --prompt "$PROMPT" --max_tokens 48 --temperature 0) \
    > "$work/prompt$n.out" 2> "$work/prompt$n.err" || fail "--prompt run $n exited $?"
  secs=$(since "$t")
  [ -n "$(tr -d '[:space:]' < "$work/prompt$n.out")" ] || fail "--prompt run $n: empty reply"
  echo "== --prompt run $n: exit 0 in $secs s; $(grep -o 'ready ([0-9.]* s)' "$work/prompt$n.err" | sed 's/ready/warm-up/')"
  echo "   reply: $(tr '\n' ' ' < "$work/prompt$n.out")"
  numba_cache "$work/h1" > "$work/numba$n.txt"
done
grep -q "converting the default model" "$work/prompt1.err" || fail "run 1 did not convert the default model"
[ -s "$work/numba1.txt" ] || fail "no numba cache under COLIBRI_HOME/cache/numba"
cmp -s "$work/numba1.txt" "$work/numba2.txt" || fail "run 2 recompiled kernels: $(diff "$work/numba1.txt" "$work/numba2.txt" | head)"
echo "== numba cache: $(wc -l < "$work/numba1.txt") files under COLIBRI_HOME/cache/numba, unchanged by run 2"

# --- the window: first start (conversion with the progress dialog), second start (timed) ----------
ready_after() {  # ready_after LABEL HOME: start the window, wait for settings.json to be (re)written
  local settings="$2/data/settings.json" before t pid
  before=$(stat -c %i:%Y "$settings" 2>/dev/null || echo none)
  t=$(now)
  run "$2" > "$work/$1.out" 2> "$work/$1.err" &
  pid=$!
  while [ "$(stat -c %i:%Y "$settings" 2>/dev/null || echo none)" = "$before" ]; do
    kill -0 "$pid" 2>/dev/null || fail "$1: the app exited before its model was ready"
    awk -v s="$(since "$t")" 'BEGIN { exit !(s > 300) }' && { kill "$pid"; fail "$1: not ready after 300 s"; }
    sleep 0.05
  done
  since "$t" > "$work/$1.secs"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
ready_after gui1 "$work/h2"
echo "== window, first start (converts the default model, compiles kernels): chat ready in $(cat "$work/gui1.secs") s"
ready_after gui2 "$work/h2"
second=$(cat "$work/gui2.secs")
echo "== window, second start: chat ready in $second s (limit $LIMIT s)"
awk -v s="$second" -v l="$LIMIT" 'BEGIN { exit !(s <= l) }' || fail "second start took $second s > $LIMIT s"
echo "SMOKE TEST PASSED"
