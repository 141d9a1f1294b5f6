#!/usr/bin/env bash
# Train the Levenshtein Transformer: ours (arch levenshtein*, our oracle, paper roll-in) or fairseq's
# built-in levenshtein_transformer (libnat oracle) with identical settings.
#
#   examples/train_levenshtein.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#   IMPL=fairseq examples/train_levenshtein.sh DATA_BIN SAVE_DIR
#
# Environment: LAYERS=3 DIM=256 FFN=4*DIM HEADS=4 DROPOUT=0.3 LR=5e-4 WARMUP=400 MAX_TOKENS=4096
#   MAX_UPDATE=3000 SEED=1 THREADS=2 SAVE_INTERVAL_UPDATES=200 AVG=5 ROLLIN=paper (ours: paper|fairseq)
#   INIT_FROM=AT.pt (start from an AT Transformer's weights, see fairseq_nat_ext.init_from_at)
# Resumes from SAVE_DIR/checkpoint_last.pt; log in SAVE_DIR/train.log; prints the averaged checkpoint.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
USER_DIR="$(cd "$SCRIPT_DIR/.." && pwd)/fairseq_nat_ext"
if [[ $# -lt 2 ]]; then sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
[[ -d "$DATA_BIN" ]] || { echo "error: DATA_BIN $DATA_BIN is not a directory" >&2; exit 1; }
IMPL="${IMPL:-ours}"
LAYERS="${LAYERS:-3}"; DIM="${DIM:-256}"; FFN="${FFN:-$((4 * DIM))}"; HEADS="${HEADS:-4}"
DROPOUT="${DROPOUT:-0.3}"; LR="${LR:-5e-4}"; WARMUP="${WARMUP:-400}"; MAX_TOKENS="${MAX_TOKENS:-4096}"
MAX_UPDATE="${MAX_UPDATE:-3000}"; SEED="${SEED:-1}"; THREADS="${THREADS:-2}"
SAVE_INTERVAL_UPDATES="${SAVE_INTERVAL_UPDATES:-200}"; AVG="${AVG:-5}"; ROLLIN="${ROLLIN:-paper}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$THREADS}"
case "$IMPL" in
  ours)    SYS=(--task nat_translation --arch levenshtein --criterion levenshtein_loss --levt-rollin "$ROLLIN") ;;
  fairseq) SYS=(--task translation_lev --noise random_delete --arch levenshtein_transformer --criterion nat_loss) ;;
  *) echo "error: IMPL must be 'ours' or 'fairseq', got '$IMPL'" >&2; exit 1 ;;
esac
mkdir -p "$SAVE_DIR"
ARGS=("$DATA_BIN" --user-dir "$USER_DIR" "${SYS[@]}" --share-all-embeddings --apply-bert-init \
  --encoder-layers "$LAYERS" --decoder-layers "$LAYERS" --encoder-embed-dim "$DIM" --decoder-embed-dim "$DIM" \
  --encoder-ffn-embed-dim "$FFN" --decoder-ffn-embed-dim "$FFN" \
  --encoder-attention-heads "$HEADS" --decoder-attention-heads "$HEADS" --dropout "$DROPOUT" \
  --label-smoothing 0.1 --optimizer adam --adam-betas '(0.9,0.98)' --lr "$LR" \
  --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" --weight-decay 0.01 --clip-norm 5.0 \
  --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --seed "$SEED" --num-workers 0 \
  --save-dir "$SAVE_DIR" --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates "$((AVG > 2 ? AVG : 2))" \
  --keep-last-epochs "$((AVG > 2 ? AVG : 2))" --log-format simple --log-interval 20 "$@")
if [[ -n "${INIT_FROM:-}" ]]; then
  INIT_CKPT="$SAVE_DIR/init_from_at.pt"
  if [[ ! -f "$SAVE_DIR/checkpoint_last.pt" && ! -f "$INIT_CKPT" ]]; then
    python -m fairseq_nat_ext.init_from_at --teacher "$INIT_FROM" --out "$INIT_CKPT.tmp" -- "${ARGS[@]}" \
      2>&1 | tee -a "$SAVE_DIR/train.log"
    mv "$INIT_CKPT.tmp" "$INIT_CKPT"
  fi
  ARGS+=(--finetune-from-model "$INIT_CKPT")
fi
fairseq-train "${ARGS[@]}" 2>&1 | tee -a "$SAVE_DIR/train.log"
if [[ "$AVG" -gt 0 ]]; then
  "$SCRIPT_DIR/average_checkpoints.sh" "$SAVE_DIR" "$AVG" "$SAVE_DIR/checkpoint_avg.pt" >&2
  echo "$SAVE_DIR/checkpoint_avg.pt"
else
  echo "$SAVE_DIR/checkpoint_last.pt"
fi
