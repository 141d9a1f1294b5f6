#!/usr/bin/env bash
# Train the Glancing Transformer (arch glat, criterion glat_loss; Qian et al. 2021): a one-pass NAT whose
# decoder reads the source copied to the predicted length, trained with glancing.
#
#   examples/train_glat.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#
# Environment overrides: those of examples/lib/train_nat.sh (LAYERS DIM FFN HEADS DROPOUT
# LABEL_SMOOTHING LR WARMUP MAX_TOKENS MAX_UPDATE SEED THREADS SAVE_INTERVAL_UPDATES AVG INIT_FROM) plus
# GLAT=START-END (the share of the first pass' wrong tokens revealed, linear from START to END over
# MAX_UPDATE; default 0.5-0.3 as the paper; 0-0: the vanilla NAT), COPY=uniform|soft (--glat-copy, the
# decoder input), LENGTH_LOSS=0.1 (--length-loss-factor).  Resumes from SAVE_DIR/checkpoint_last.pt; log
# SAVE_DIR/train.log (glat_ratio, glat_revealed); the averaged checkpoint is printed on the last line.
# Decode with fairseq-generate ... --iter-decode-with-beam L (length candidates; one decoder pass).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 2 ]]; then sed -n '2,${/^#/!q;p;}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
EXTRA=("$@")
COPY="${COPY:-uniform}"
[[ "$COPY" == uniform || "$COPY" == soft ]] || { echo "error: COPY must be 'uniform' or 'soft', got '$COPY'" >&2; exit 1; }
# shellcheck source=lib/glancing.sh
source "$SCRIPT_DIR/lib/glancing.sh" 0.5-0.3
SYS=(--task nat_translation --arch glat --criterion glat_loss)
NAT_EXTRA=(--glat-copy "$COPY" --length-loss-factor "${LENGTH_LOSS:-0.1}" "${GLAT_ARGS[@]}")
# shellcheck source=lib/train_nat.sh
source "$SCRIPT_DIR/lib/train_nat.sh"
