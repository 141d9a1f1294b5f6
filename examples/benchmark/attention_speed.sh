#!/usr/bin/env bash
# Attention speed/memory study: one layer (8 heads x 64, batch 1, fp32), forward+backward, every
# variant at N = 512 ... 16384, each (variant, N) in a fresh process, plus the peer packages.
#
#   bash examples/benchmark/attention_speed.sh            (CPU; DEVICE=cuda on a GPU machine)
#
# Settings (environment): DEVICE=cpu THREADS=2 NS="512 1024 2048 4096 8192 16384"
#   PEERS_DIR=runs/attention_peers (peer packages are pip-installed there, never into .venv)
#   OUT=benchmarks/results/attention_speed.json  TIMEOUT=900 (s per run)  MEM_LIMIT_GB=20
#   ROUNDS=1 (whole passes over every row, one after the other; each row is the median pass)
# Then draws ${OUT%.json}.png (time and memory against N) and regenerates the generated docs tables (benchmarks.tables --update-all).
# Run it on an otherwise idle machine: the rows are timings.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python )}"
DEVICE="${DEVICE:-cpu}"; THREADS="${THREADS:-2}"; NS="${NS:-512 1024 2048 4096 8192 16384}"
PEERS_DIR="${PEERS_DIR:-$REPO/runs/attention_peers}"; OUT="${OUT:-benchmarks/results/attention_speed.json}"
TIMEOUT="${TIMEOUT:-900}"; MEM_LIMIT_GB="${MEM_LIMIT_GB:-20}"; ROUNDS="${ROUNDS:-1}"
if [[ ! -d "$PEERS_DIR/performer_pytorch" ]]; then
  "$PYTHON" -m pip install -q --target "$PEERS_DIR" --no-deps local-attention linformer performer-pytorch \
    reformer-pytorch sinkhorn-transformer routing-transformer einops axial-positional-embedding \
    product-key-memory hyper-connections colt5-attention mixture-of-experts
fi
# shellcheck disable=SC2086  # NS is a list
ATTENTION_PEERS_PATH="$PEERS_DIR" OMP_NUM_THREADS="$THREADS" "$PYTHON" -m benchmarks.attention_speed \
  --out "$OUT" --n $NS --device "$DEVICE" --threads "$THREADS" --timeout "$TIMEOUT" \
  --mem-limit-gb "$MEM_LIMIT_GB" --rounds "$ROUNDS" --peers
"$PYTHON" -m benchmarks.attention_plots curves "$OUT" "${OUT%.json}.png"
"$PYTHON" -m benchmarks.tables --update-all \
  || echo "[attention_speed.sh] the generated docs pages were not all updated (see the error above)" >&2
