#!/usr/bin/env bash
# Train the fertility NAT (arch nat_fertility, criterion nat_fertility_loss), or fairseq's own
# nonautoregressive_transformer with the same settings.
#
#   examples/train_fertility.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#   FERTILITY=attention TEACHER=teacher.pt examples/train_fertility.sh DATA_BIN SAVE_DIR
#   IMPL=fairseq examples/train_fertility.sh DATA_BIN SAVE_DIR   # fairseq:nonautoregressive_transformer
#
# Fertility supervision: FERTILITY=aligner (default; eflomal) or attention (TEACHER's cross-attention),
# written once by examples/fertility.sh into FERTILITY_DIR (default SAVE_DIR/fertility) from DATA_BIN's
# own targets, for the train and valid splits only (decoding needs none).  REINFORCE_UPDATES=N
# (default 0): after the main training, N more updates in SAVE_DIR/reinforce started from its
# checkpoint with --fertility-reinforce (REINFORCE_SAMPLES=4,
# REINFORCE_LR=LR, REINFORCE_WARMUP=WARMUP; REINFORCE_REWARD=reference (default: minus the translation
# loss against the reference) or teacher (the paper's: TEACHER's log-probability of the decoded
# translation, baseline the argmax fertilities'; needs TEACHER)); state that budget separately (it
# is not in MAX_UPDATE).
# Environment overrides: those of examples/lib/train_nat.sh (LAYERS DIM FFN HEADS DROPOUT
# LABEL_SMOOTHING LR WARMUP MAX_TOKENS MAX_UPDATE SEED THREADS SAVE_INTERVAL_UPDATES AVG INIT_FROM)
# plus MAX_FERTILITY=50, FERT_LOSS=1.0 (--fertility-loss-factor), LENGTH_LOSS=0.1 (IMPL=fairseq).
# Resumes from SAVE_DIR/checkpoint_last.pt (and SAVE_DIR/reinforce/); log SAVE_DIR/train.log; the
# final checkpoint (averaged unless AVG=0) is printed on the last line.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 2 ]]; then sed -n '2,${/^#/!q;p;}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
EXTRA=("$@")
IMPL="${IMPL:-ours}"
FERTILITY="${FERTILITY:-aligner}"; FERTILITY_DIR="${FERTILITY_DIR:-$SAVE_DIR/fertility}"
MAX_FERTILITY="${MAX_FERTILITY:-50}"; FERT_LOSS="${FERT_LOSS:-1.0}"
REINFORCE_UPDATES="${REINFORCE_UPDATES:-0}"; REINFORCE_SAMPLES="${REINFORCE_SAMPLES:-4}"
REINFORCE_REWARD="${REINFORCE_REWARD:-reference}"
case "$REINFORCE_REWARD" in
  reference) ;;
  teacher) [[ "$REINFORCE_UPDATES" == 0 || -f "${TEACHER:-}" ]] || { echo "error: REINFORCE_REWARD=teacher needs TEACHER=teacher.pt (got '${TEACHER:-}')" >&2; exit 1; } ;;
  *) echo "error: REINFORCE_REWARD must be reference or teacher, got '$REINFORCE_REWARD'" >&2; exit 1 ;;
esac
[[ "$REINFORCE_UPDATES" =~ ^[0-9]+$ ]] || { echo "error: REINFORCE_UPDATES must be an integer >= 0, got '$REINFORCE_UPDATES'" >&2; exit 1; }
case "$IMPL" in
  ours)
    case "$FERTILITY" in
      aligner) "$SCRIPT_DIR/fertility.sh" "$DATA_BIN" "$FERTILITY_DIR" aligner >&2 ;;
      attention) "$SCRIPT_DIR/fertility.sh" "$DATA_BIN" "$FERTILITY_DIR" attention "${TEACHER:-}" >&2 ;;
      *) echo "error: FERTILITY must be aligner or attention, got '$FERTILITY'" >&2; exit 1 ;;
    esac
    SYS=(--task nat_translation --arch nat_fertility --criterion nat_fertility_loss --fertility-path "$FERTILITY_DIR")
    NAT_EXTRA=(--max-fertility "$MAX_FERTILITY" --fertility-loss-factor "$FERT_LOSS") ;;
  fairseq)
    [[ "$REINFORCE_UPDATES" == 0 ]] || { echo "error: REINFORCE_UPDATES is for IMPL=ours" >&2; exit 1; }
    SYS=(--task translation_lev --noise full_mask --arch nonautoregressive_transformer --criterion nat_loss)
    NAT_EXTRA=(--src-embedding-copy --length-loss-factor "${LENGTH_LOSS:-0.1}") ;;
  *) echo "error: IMPL must be 'ours' or 'fairseq', got '$IMPL'" >&2; exit 1 ;;
esac
# shellcheck source=lib/train_nat.sh
source "$SCRIPT_DIR/lib/train_nat.sh"
if [[ "$REINFORCE_UPDATES" -gt 0 ]]; then
  # stage 2: REINFORCE fine-tuning from the main training's final checkpoint
  if [[ "$AVG" -gt 0 ]]; then MAIN_CKPT="$SAVE_DIR/checkpoint_avg.pt"; else MAIN_CKPT="$SAVE_DIR/checkpoint_last.pt"; fi
  SAVE_DIR="$SAVE_DIR/reinforce"; MAX_UPDATE="$REINFORCE_UPDATES"; unset INIT_FROM
  LR="${REINFORCE_LR:-$LR}"; WARMUP="${REINFORCE_WARMUP:-$WARMUP}"
  NAT_EXTRA+=(--fertility-reinforce --fertility-reinforce-samples "$REINFORCE_SAMPLES" --finetune-from-model "$MAIN_CKPT"
             --fertility-reinforce-reward "$REINFORCE_REWARD")
  [[ "$REINFORCE_REWARD" == teacher ]] && NAT_EXTRA+=(--fertility-teacher "$TEACHER")
  # shellcheck source=lib/train_nat.sh
  source "$SCRIPT_DIR/lib/train_nat.sh"
fi
