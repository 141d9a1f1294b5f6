#!/usr/bin/env bash
# Train Mask-Predict (ours, arch mask_predict*) or fairseq's built-in CMLM with identical settings.
#
#   examples/train_mask_predict.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#   IMPL=fairseq examples/train_mask_predict.sh DATA_BIN SAVE_DIR     # fairseq:cmlm_transformer
#
# Both systems get the same model size, data, optimiser, schedule, batch and number of updates;
# only the implementation differs (ours: task nat_translation + mask_predict_loss; fairseq's:
# task translation_lev --noise random_mask + nat_loss).  Environment overrides: those of
# examples/lib/train_nat.sh (LAYERS DIM FFN HEADS DROPOUT LABEL_SMOOTHING LR WARMUP MAX_TOKENS
# MAX_UPDATE SEED THREADS SAVE_INTERVAL_UPDATES AVG INIT_FROM) plus LENGTH_LOSS=0.1.
# Training resumes from SAVE_DIR/checkpoint_last.pt, so a killed run is restarted by running the same
# command.  Log: SAVE_DIR/train.log.  The averaged checkpoint is printed on the last line.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 2 ]]; then sed -n '2,${/^#/!q;p;}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
EXTRA=("$@")
IMPL="${IMPL:-ours}"
case "$IMPL" in
  ours)    SYS=(--task nat_translation --arch mask_predict --criterion mask_predict_loss) ;;
  fairseq) SYS=(--task translation_lev --noise random_mask --arch cmlm_transformer --criterion nat_loss) ;;
  *) echo "error: IMPL must be 'ours' or 'fairseq', got '$IMPL'" >&2; exit 1 ;;
esac
NAT_EXTRA=(--length-loss-factor "${LENGTH_LOSS:-0.1}")
# shellcheck source=lib/train_nat.sh
source "$SCRIPT_DIR/lib/train_nat.sh"
