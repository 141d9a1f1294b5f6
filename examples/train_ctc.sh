#!/usr/bin/env bash
# Train CTC non-autoregressive translation (arch ctc_nat, criterion ctc_nat_loss).
#
#   examples/train_ctc.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#
# Environment overrides: those of examples/lib/train_nat.sh (LAYERS DIM FFN HEADS DROPOUT
# LABEL_SMOOTHING LR WARMUP MAX_TOKENS MAX_UPDATE SEED THREADS SAVE_INTERVAL_UPDATES AVG INIT_FROM)
# plus RATIO=2 (--upsample-ratio: alignment positions per source token) and GLAT=START-END (GLAT+CTC:
# glancing over the best CTC alignment, the share of the first pass' wrong positions revealed going
# linearly from START to END over MAX_UPDATE, e.g. GLAT=0.5-0.3; default 0-0: plain CTC).  Training pairs whose target
# does not fit in RATIO x source length are filtered and counted: ctc_filtered in the train.log lines
# (per epoch in the end-of-epoch line).  Resumes from SAVE_DIR/checkpoint_last.pt; log
# SAVE_DIR/train.log; the averaged checkpoint is printed on the last line.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 2 ]]; then sed -n '2,${/^#/!q;p;}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
EXTRA=("$@")
RATIO="${RATIO:-2}"
[[ "$RATIO" =~ ^[1-9][0-9]*$ ]] || { echo "error: RATIO must be an integer >= 1, got '$RATIO'" >&2; exit 1; }
SYS=(--task nat_translation --arch ctc_nat --criterion ctc_nat_loss)
# shellcheck source=lib/glancing.sh
source "$SCRIPT_DIR/lib/glancing.sh" 0-0
NAT_EXTRA=(--upsample-ratio "$RATIO")
[[ "$GLAT" =~ ^0*\.?0*-0*\.?0*$ ]] || NAT_EXTRA+=("${GLAT_ARGS[@]}")
# shellcheck source=lib/train_nat.sh
source "$SCRIPT_DIR/lib/train_nat.sh"
