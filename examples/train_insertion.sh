#!/usr/bin/env bash
# Train the Insertion Transformer: ours (arch insertion*, balanced-binary-tree or uniform slot loss)
# or fairseq's built-in insertion_transformer with identical settings.
#
#   examples/train_insertion.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#   LOSS=uniform examples/train_insertion.sh DATA_BIN SAVE_DIR
#   SOFTMAX=joint examples/train_insertion.sh DATA_BIN SAVE_DIR   # Stern et al.'s joint p(content, slot)
#   IMPL=fairseq examples/train_insertion.sh DATA_BIN SAVE_DIR     # the same loss: --label-tau TAU
#   NOISE=fairseq SPAN_TARGETS=fairseq ALIGN=leftmost examples/train_insertion.sh DATA_BIN SAVE_DIR
#                                      # ours with fairseq's loss (docs/nat.md, "Training like fairseq")
#
# Environment overrides: those of examples/lib/train_nat.sh (LAYERS DIM FFN HEADS DROPOUT
# LABEL_SMOOTHING LR WARMUP MAX_TOKENS MAX_UPDATE SEED THREADS SAVE_INTERVAL_UPDATES AVG INIT_FROM)
# plus LOSS=binary_tree|uniform, TAU=1.0 (both IMPLs; fairseq's: --label-tau TAU, or unset for
# uniform), SOFTMAX=slot|joint, END=pad|eos (the end-of-slot label;
# eos: the label before the option), NOISE=paper|fairseq (canvas keeps U{0..n} or U{0..n-1} target tokens)
# SPAN_TARGETS=sum|fairseq (a token repeated in a span: weights summed, or fairseq's last one) and
# ALIGN=rightmost|leftmost (a repeated canvas token's target position; leftmost: fairseq's libnat) (ours).
# Resumes from SAVE_DIR/checkpoint_last.pt.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 2 ]]; then sed -n '2,${/^#/!q;p;}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
EXTRA=("$@")
IMPL="${IMPL:-ours}"
case "$IMPL" in
  ours)    SYS=(--task nat_translation --arch insertion --criterion insertion_loss
                --insertion-loss "${LOSS:-binary_tree}" --insertion-tau "${TAU:-1.0}"
                --insertion-softmax "${SOFTMAX:-slot}" --insertion-end-symbol "${END:-pad}"
                --deletion-noise "${NOISE:-paper}" --insertion-span-targets "${SPAN_TARGETS:-sum}"
                --insertion-alignment "${ALIGN:-rightmost}") ;;
  fairseq) SYS=(--task translation_lev --noise random_delete --arch insertion_transformer --criterion nat_loss)
           case "${LOSS:-binary_tree}" in  # fairseq's balanced binary tree: --label-tau (unset: uniform)
             binary_tree) SYS+=(--label-tau "${TAU:-1.0}") ;;
             uniform) ;;
             *) echo "error: LOSS must be 'binary_tree' or 'uniform', got '$LOSS'" >&2; exit 1 ;;
           esac ;;
  *) echo "error: IMPL must be 'ours' or 'fairseq', got '$IMPL'" >&2; exit 1 ;;
esac
NAT_EXTRA=()
# shellcheck source=lib/train_nat.sh
source "$SCRIPT_DIR/lib/train_nat.sh"
