#!/usr/bin/env bash
# ListOps accuracy per attention variant (same budget for every row) + majority rate + no-brackets
# ablation of `full` -> benchmarks/results/attention_listops.json.
#
#   bash examples/benchmark/attention_listops.sh
#
# Settings (environment): MIN_LEN=128 MAX_LEN=512 TRAIN=20000 VALID=1000 TEST=1000 SEED=1
#   MAX_UPDATE=1500 BATCH=32 THREADS=2 WORK=runs/listops OUT=benchmarks/results/attention_listops.json
#   VARIANTS="full local ..." (default: all)  SPEED=benchmarks/results/attention_speed.json (bubble chart)
# Then draws ${OUT%.json}.png (accuracy vs speed, bubble area = memory) and regenerates the generated docs tables (benchmarks.tables --update-all).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python )}"
export PATH="$(dirname "$PYTHON"):$PATH"
MIN_LEN="${MIN_LEN:-128}"; MAX_LEN="${MAX_LEN:-512}"; TRAIN="${TRAIN:-20000}"; VALID="${VALID:-1000}"
TEST="${TEST:-1000}"; SEED="${SEED:-1}"; MAX_UPDATE="${MAX_UPDATE:-1500}"; BATCH="${BATCH:-32}"
THREADS="${THREADS:-2}"; WORK="${WORK:-runs/listops}"; OUT="${OUT:-benchmarks/results/attention_listops.json}"
DATA="$WORK/data_${MIN_LEN}_${MAX_LEN}"; DATA_NB="$WORK/data_${MIN_LEN}_${MAX_LEN}_nobrackets"
gen() { "$PYTHON" -m fairseq_nat_ext.data.listops --out "$1" --train "$TRAIN" --valid "$VALID" --test "$TEST" \
          --min-length "$MIN_LEN" --max-length "$MAX_LEN" --seed "$SEED" "${@:2}"; }
[[ -s "$DATA/test.label" ]] || gen "$DATA"
[[ -s "$DATA_NB/test.label" ]] || gen "$DATA_NB" --no-brackets
VARIANT_ARGS=(); [[ -n "${VARIANTS:-}" ]] && read -r -a VARIANT_ARGS <<< "$VARIANTS" && VARIANT_ARGS=(--variants "${VARIANT_ARGS[@]}")
"$PYTHON" -m benchmarks.attention_listops --data "$DATA" --no-brackets-data "$DATA_NB" \
  --out "$OUT" --work "$WORK" --max-update "$MAX_UPDATE" --batch-size "$BATCH" --threads "$THREADS" \
  "${VARIANT_ARGS[@]}"
# the LRA-style chart (speed and memory at N=4096 from the speed study, when it has been run) and the generated docs tables
SPEED="${SPEED:-benchmarks/results/attention_speed.json}"
if [[ -f "$SPEED" ]]; then
  "$PYTHON" -m benchmarks.attention_plots bubble "$SPEED" "$OUT" "${OUT%.json}.png"
fi
"$PYTHON" -m benchmarks.tables --update-all \
  || echo "[attention_listops.sh] the generated docs pages were not all updated (see the error above)" >&2
