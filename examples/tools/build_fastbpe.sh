#!/usr/bin/env bash
# Build fastBPE's command-line tool `fast` (used by examples/prepare_data.sh) from the
# fastbpe 0.1.0 source package on PyPI, if it is not there yet.
#
#   bash examples/tools/build_fastbpe.sh            # installs $VIRTUAL_ENV/bin/fast,
#                                                   # else <repo>/.venv/bin/fast
#   FAST_BIN=/some/where/fast bash examples/tools/build_fastbpe.sh
#
# Needs: python3 with pip (network access to the package index), g++.
# Prints the path of the binary on stdout (progress goes to stderr).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -n "${FAST_BIN:-}" ]]; then
    DEST="$FAST_BIN"
elif [[ -n "${VIRTUAL_ENV:-}" ]]; then
    DEST="$VIRTUAL_ENV/bin/fast"
else
    DEST="$REPO/.venv/bin/fast"
fi

if [[ -x "$DEST" ]]; then
    echo "$DEST"
    exit 0
fi

if [[ -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"; else PY="${PYTHON:-python3}"; fi
command -v g++ >/dev/null || { echo "error: g++ not found (apt-get install g++)" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "[build_fastbpe] downloading the fastbpe==0.1.0 source package" >&2
"$PY" -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
    fastbpe==0.1.0 -d "$WORK" >&2
SDIST="$(ls "$WORK"/fastBPE-0.1.0.tar.gz "$WORK"/fastbpe-0.1.0.tar.gz 2>/dev/null | head -n 1 || true)"
[[ -n "$SDIST" ]] || { echo "error: fastbpe 0.1.0 sdist not found after pip download" >&2; exit 1; }
tar -xzf "$SDIST" -C "$WORK"
SRC_DIR="$(dirname "$(ls "$WORK"/*/fastBPE/main.cc | head -n 1)")"
[[ -f "$SRC_DIR/main.cc" && -f "$SRC_DIR/fastBPE.hpp" ]] || {
    echo "error: fastBPE/main.cc or fastBPE.hpp missing from $SDIST" >&2; exit 1; }

echo "[build_fastbpe] compiling $SRC_DIR/main.cc -> $DEST" >&2
mkdir -p "$(dirname "$DEST")"
g++ -std=c++11 -O3 -pthread -I"$SRC_DIR" "$SRC_DIR/main.cc" -o "$WORK/fast"
mv -f "$WORK/fast" "$DEST"
echo "$DEST"
