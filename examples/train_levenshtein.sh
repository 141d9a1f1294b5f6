#!/usr/bin/env bash
# Train the Levenshtein Transformer: ours (arch levenshtein*, our oracle, paper roll-in) or fairseq's
# built-in levenshtein_transformer (libnat oracle) with identical settings.
#
#   examples/train_levenshtein.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#   IMPL=fairseq examples/train_levenshtein.sh DATA_BIN SAVE_DIR
#
# Environment overrides: those of examples/lib/train_nat.sh (LAYERS DIM FFN HEADS DROPOUT
# LABEL_SMOOTHING LR WARMUP MAX_TOKENS MAX_UPDATE SEED THREADS SAVE_INTERVAL_UPDATES AVG INIT_FROM)
# plus ROLLIN=paper|fairseq and NOISE=fairseq|paper (y0 keeps U{0..n-1} target tokens, fairseq's range, or
# U{0..n}, what the published rows were trained with) (ours).  Resumes from SAVE_DIR/checkpoint_last.pt;
# log SAVE_DIR/train.log.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 2 ]]; then sed -n '2,${/^#/!q;p;}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
EXTRA=("$@")
IMPL="${IMPL:-ours}"
case "$IMPL" in
  ours)    SYS=(--task nat_translation --arch levenshtein --criterion levenshtein_loss --levt-rollin "${ROLLIN:-paper}"
                --deletion-noise "${NOISE:-fairseq}") ;;
  fairseq) SYS=(--task translation_lev --noise random_delete --arch levenshtein_transformer --criterion nat_loss) ;;
  *) echo "error: IMPL must be 'ours' or 'fairseq', got '$IMPL'" >&2; exit 1 ;;
esac
NAT_EXTRA=()
# shellcheck source=lib/train_nat.sh
source "$SCRIPT_DIR/lib/train_nat.sh"
