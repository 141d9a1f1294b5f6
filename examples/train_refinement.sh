#!/usr/bin/env bash
# Train iterative refinement (arch iterative_refinement, criterion iterative_refinement_loss), or
# fairseq's own iterative_nonautoregressive_transformer with the same settings.
#
#   examples/train_refinement.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#   IMPL=fairseq examples/train_refinement.sh DATA_BIN SAVE_DIR  # fairseq:iterative_nonautoregressive_transformer
#
# Both: STEPS=4 refinement passes per training step (ours --train-refine-steps, fairseq's --train-step),
# DAE=0.5 (--dae-ratio: per sentence and pass, read the corrupted reference instead of the previous
# output).  Ours only: CORRUPT_REPLACE=0.1 CORRUPT_REPEAT=0.1 CORRUPT_SWAP=0.1 (per-token
# probabilities of the three noises; fairseq's fixed scheme draws one of the three with total
# probability 0.33).  Environment overrides: those of examples/lib/train_nat.sh (LAYERS DIM FFN HEADS
# DROPOUT LABEL_SMOOTHING LR WARMUP MAX_TOKENS MAX_UPDATE SEED THREADS SAVE_INTERVAL_UPDATES AVG
# INIT_FROM) plus LENGTH_LOSS=0.1.  Resumes from SAVE_DIR/checkpoint_last.pt; log SAVE_DIR/train.log;
# the averaged checkpoint is printed on the last line.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 2 ]]; then sed -n '2,${/^#/!q;p;}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
EXTRA=("$@")
IMPL="${IMPL:-ours}"; STEPS="${STEPS:-4}"; DAE="${DAE:-0.5}"
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || { echo "error: STEPS must be an integer >= 1, got '$STEPS'" >&2; exit 1; }
case "$IMPL" in
  ours)
    SYS=(--task nat_translation --arch iterative_refinement --criterion iterative_refinement_loss)
    NAT_EXTRA=(--train-refine-steps "$STEPS" --dae-ratio "$DAE" --corrupt-replace "${CORRUPT_REPLACE:-0.1}"
               --corrupt-repeat "${CORRUPT_REPEAT:-0.1}" --corrupt-swap "${CORRUPT_SWAP:-0.1}") ;;
  fairseq)
    SYS=(--task translation_lev --noise full_mask --arch iterative_nonautoregressive_transformer --criterion nat_loss)
    NAT_EXTRA=(--train-step "$STEPS" --dae-ratio "$DAE") ;;
  *) echo "error: IMPL must be 'ours' or 'fairseq', got '$IMPL'" >&2; exit 1 ;;
esac
NAT_EXTRA+=(--length-loss-factor "${LENGTH_LOSS:-0.1}")
# shellcheck source=lib/train_nat.sh
source "$SCRIPT_DIR/lib/train_nat.sh"
