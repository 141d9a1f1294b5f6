#!/usr/bin/env bash
# Train the Imputer (arch imputer, criterion imputer_loss).
#
#   examples/train_imputer.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#   CTC_CKPT=runs/ctc/checkpoint_avg.pt examples/train_imputer.sh DATA_BIN SAVE_DIR
#
# With CTC_CKPT the Imputer learns that CTC model's Viterbi alignments (--imputer-ctc-path) and starts
# from its weights (--finetune-from-model; CTC_INIT=0 to start from scratch, or INIT_FROM=AT.pt);
# without it, it imputes alignments with its own predictions.  State the CTC model's training
# budget separately.  Environment overrides: those of examples/lib/train_nat.sh (LAYERS DIM FFN
# HEADS DROPOUT LABEL_SMOOTHING LR WARMUP MAX_TOKENS MAX_UPDATE SEED THREADS SAVE_INTERVAL_UPDATES
# AVG INIT_FROM) plus RATIO=2 (--upsample-ratio, must equal the CTC model's), TRAIN_BLOCK=8
# (--imputer-train-block-size), LOSS=marginal|best_alignment (--imputer-loss).  Resumes from
# SAVE_DIR/checkpoint_last.pt; log SAVE_DIR/train.log; the averaged checkpoint is printed last.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 2 ]]; then sed -n '2,${/^#/!q;p;}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
EXTRA=("$@")
RATIO="${RATIO:-2}"; TRAIN_BLOCK="${TRAIN_BLOCK:-8}"; LOSS="${LOSS:-marginal}"
[[ "$RATIO" =~ ^[1-9][0-9]*$ ]] || { echo "error: RATIO must be an integer >= 1, got '$RATIO'" >&2; exit 1; }
[[ "$TRAIN_BLOCK" =~ ^[1-9][0-9]*$ ]] || { echo "error: TRAIN_BLOCK must be an integer >= 1, got '$TRAIN_BLOCK'" >&2; exit 1; }
case "$LOSS" in marginal|best_alignment) ;; *) echo "error: LOSS must be marginal or best_alignment, got '$LOSS'" >&2; exit 1 ;; esac
SYS=(--task nat_translation --arch imputer --criterion imputer_loss --imputer-loss "$LOSS")
NAT_EXTRA=(--upsample-ratio "$RATIO" --imputer-train-block-size "$TRAIN_BLOCK")
if [[ -n "${CTC_CKPT:-}" ]]; then
  [[ -f "$CTC_CKPT" ]] || { echo "error: CTC_CKPT $CTC_CKPT: no such file" >&2; exit 1; }
  NAT_EXTRA+=(--imputer-ctc-path "$CTC_CKPT")
  if [[ "${CTC_INIT:-1}" == 1 && -z "${INIT_FROM:-}" ]]; then
    NAT_EXTRA+=(--finetune-from-model "$CTC_CKPT")
  fi
fi
# shellcheck source=lib/train_nat.sh
source "$SCRIPT_DIR/lib/train_nat.sh"
