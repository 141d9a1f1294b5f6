#!/usr/bin/env bash
# Quick start: the whole pipeline on the embedded synthetic corpus, in minutes on 2 CPU cores.
#
#   examples/quickstart.sh [OUT_DIR]        (default: quickstart_out; `make quickstart` runs it)
#
# 1. generate the corpus (fairseq_nat_ext.data.synthetic_corpus, seed 1): every source has up to
#    12 valid targets (3 synonym styles x 2 adjective orders x 2 verb positions);
# 2. prepare_data.sh: validate, Moses-tokenise, learn + apply BPE (fastBPE), binarise;
# 3. train a small autoregressive teacher (fairseq's transformer) and distil the training set;
# 4. train Mask-Predict on the raw and on the distilled targets (same budget, both initialised from
#    the teacher's weights unless NAT_INIT=none);
# 5. benchmark every system on the test set (BLEU, latency, iterations, repeat rate) and print the
#    table, plus the fraction of outputs that are a valid translation (one consistent mode).
# Budgets (updates) are set below (TEACHER_UPDATES, NAT_UPDATES; CORPUS_TRAIN, CORPUS_TEST sentences) and recorded in OUT_DIR/results.json.  Everything resumes: rerun
# the script after an interruption and finished steps are skipped.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/.." && pwd)"
OUT="$(mkdir -p "${1:-quickstart_out}" && cd "${1:-quickstart_out}" && pwd)"
PYTHON="${PYTHON:-python}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
# shellcheck source=lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${THREADS:-$(default_cores)}}"
TEACHER_UPDATES="${TEACHER_UPDATES:-500}"
NAT_UPDATES="${NAT_UPDATES:-400}"
CORPUS_TRAIN="${CORPUS_TRAIN:-20000}"; CORPUS_TEST="${CORPUS_TEST:-500}"
LATENCY_SENTENCES="${LATENCY_SENTENCES:-50}"
NAT_INIT="${NAT_INIT:-teacher}"   # teacher: both NAT runs start from the teacher's weights; none: random
[[ "$NAT_INIT" == teacher || "$NAT_INIT" == none ]] || { echo "error: NAT_INIT must be teacher or none, got '$NAT_INIT'" >&2; exit 1; }
say() { echo "[quickstart $(date +%H:%M:%S)] $*" >&2; }

# tiny models: 2+2 layers, d=128
export LAYERS=2 DIM=128 HEADS=4 DROPOUT=0.1 WARMUP=100 MAX_TOKENS=4096 LR=1e-3

if [[ ! -s "$OUT/raw/test.tgt" ]]; then
  say "1/5 generating the synthetic corpus"
  "$PYTHON" -m fairseq_nat_ext.data.synthetic_corpus --out "$OUT/raw" --seed 1 \
    --train "$CORPUS_TRAIN" --valid "$CORPUS_TEST" --test "$CORPUS_TEST"
fi

say "2/5 preparing data (tokenise, BPE, binarise; fairseq-preprocess log: $OUT/prep/preprocess.log)"
# 10k merges keep every word of this small vocabulary whole (the BPE step still runs as on real data)
"$SCRIPT_DIR/prepare_data.sh" "$OUT/raw" src tgt "$OUT/prep" --bpe-merges 10000 >&2
BIN="$OUT/prep/data-bin"

if [[ ! -s "$OUT/teacher/checkpoint_avg.pt" ]]; then
  say "3/5 training the teacher ($TEACHER_UPDATES updates; log: $OUT/teacher/train.log)"
  MAX_UPDATE="$TEACHER_UPDATES" SAVE_INTERVAL_UPDATES=100 AVG=3 VALIDATE_INTERVAL=1000 \
    "$SCRIPT_DIR/train_teacher.sh" "$BIN" "$OUT/teacher" >/dev/null
fi
say "3/5 distilling the training set with the teacher (beam 5; log: $OUT/distill/generate-train.log)"
"$SCRIPT_DIR/distill.sh" "$BIN" "$OUT/teacher/checkpoint_avg.pt" "$OUT/distill" --beam 5 >&2
DBIN="$OUT/distill/data-bin"

train_nat() {  # data-bin save-dir
  if [[ ! -s "$2/checkpoint_avg.pt" ]]; then
    local init=""; [[ "$NAT_INIT" == teacher ]] && init="$OUT/teacher/checkpoint_avg.pt"
    INIT_FROM="$init" MAX_UPDATE="$NAT_UPDATES" SAVE_INTERVAL_UPDATES=100 AVG=3 \
      "$SCRIPT_DIR/train_mask_predict.sh" "$1" "$2" --arch mask_predict \
      --validate-interval 1000 >/dev/null \
      || { tail -n 20 "$2/train.log" >&2; say "training failed (log: $2/train.log)"; exit 1; }
  fi
}
say "4/5 training Mask-Predict on raw targets ($NAT_UPDATES updates; log: $OUT/mp_raw/train.log)"
train_nat "$BIN" "$OUT/mp_raw"
say "4/5 training Mask-Predict on distilled targets ($NAT_UPDATES updates; log: $OUT/mp_distill/train.log)"
train_nat "$DBIN" "$OUT/mp_distill"

say "5/5 benchmarking"
RES="$OUT/results.json"
CMD="examples/quickstart.sh (teacher ${TEACHER_UPDATES} updates, mask_predict ${NAT_UPDATES} updates (init: ${NAT_INIT}), 2+2 layers d=128, 2 threads)"
bench() {  # ckpt distilled(yes/no) updates decodings...
  local ckpt="$1" dist="$2" upd="$3"; shift 3
  local flags=()
  for d in "$@"; do flags+=(--decoding "$d"); done
  local dflag=--no-distilled; [[ "$dist" == yes ]] && dflag=--distilled
  "$PYTHON" -m fairseq_nat_ext.evaluation.run --benchmark quickstart --out "$RES" \
    --data-bin "$BIN" --raw-ref "$OUT/prep/raw/test.tgt" --src-lang src --tgt-lang tgt \
    --system-ckpt "$ckpt" "${flags[@]}" "$dflag" --train-updates "$upd" \
    --train-log "$(dirname "$ckpt")/train.log" --threads 2 --latency-sentences "$LATENCY_SENTENCES" \
    --data-name "synthetic quick-start corpus (seed 1), test split" --command "$CMD" --no-plot >&2
}
bench "$OUT/teacher/checkpoint_avg.pt" no "$TEACHER_UPDATES" beam=1 beam=5
bench "$OUT/mp_raw/checkpoint_avg.pt" no "$NAT_UPDATES" iter=4,len_beam=3 iter=10,len_beam=3
bench "$OUT/mp_distill/checkpoint_avg.pt" yes "$NAT_UPDATES" iter=4,len_beam=3 iter=10,len_beam=3
"$PYTHON" -m fairseq_nat_ext.evaluation.run --benchmark quickstart --out "$RES" \
  --raw-ref "$OUT/prep/raw/test.tgt" --tgt-lang tgt --reference-row --command "$CMD" --no-plot >&2

echo
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m benchmarks.tables "$RES"
echo
"$PYTHON" -m fairseq_nat_ext.data.synthetic_corpus_report "$OUT/raw/test.src" "$RES"
say "finished: examples/quickstart.sh took ${SECONDS} s (the install of make quickstart not included)"
