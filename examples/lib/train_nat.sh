# Shared body of the NAT training recipes (sourced, not run).  The caller sets:
#   SCRIPT_DIR, DATA_BIN, SAVE_DIR, SYS (array: task/arch/criterion flags), EXTRA (array: its "$@"),
#   and may set NAT_EXTRA (array: method-specific flags such as --length-loss-factor).
# Environment overrides (the same for every NAT recipe, so systems differ only in SYS):
#   LAYERS=3 DIM=256 FFN=4*DIM HEADS=4 DROPOUT=0.3 LABEL_SMOOTHING=0.1 LR=1e-3 WARMUP=400
#   MAX_TOKENS=4096 MAX_UPDATE=1000 SEED=1 THREADS=$(nproc) SAVE_INTERVAL_UPDATES=200 AVG=5
#   INIT_FROM=AT.pt: start from an autoregressive Transformer's weights (fairseq_nat_ext.init_from_at)
# Training resumes from the newest intact checkpoint in SAVE_DIR (fairseq_nat_ext/checkpoint_resume.py:
# checkpoint_last.pt, or --restore-file of a newer one when a kill left checkpoint_last.pt truncated; the
# choice is logged); log: SAVE_DIR/train.log; the averaged checkpoint (or checkpoint_last.pt with AVG=0)
# is printed on the last line.
USER_DIR="$(cd "$SCRIPT_DIR/.." && pwd)/fairseq_nat_ext"
[[ -d "$DATA_BIN" ]] || { echo "error: DATA_BIN $DATA_BIN is not a directory" >&2; exit 1; }
LAYERS="${LAYERS:-3}"; DIM="${DIM:-256}"; FFN="${FFN:-$((4 * DIM))}"; HEADS="${HEADS:-4}"
DROPOUT="${DROPOUT:-0.3}"; LABEL_SMOOTHING="${LABEL_SMOOTHING:-0.1}"
LR="${LR:-1e-3}"; WARMUP="${WARMUP:-400}"; MAX_TOKENS="${MAX_TOKENS:-4096}"
# shellcheck source=common.sh
source "$SCRIPT_DIR/lib/common.sh"
MAX_UPDATE="${MAX_UPDATE:-1000}"; SEED="${SEED:-1}"; THREADS="${THREADS:-$(default_cores)}"
SAVE_INTERVAL_UPDATES="${SAVE_INTERVAL_UPDATES:-200}"; AVG="${AVG:-5}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$THREADS}"
mkdir -p "$SAVE_DIR"
# ENCODER_ONLY=1 (single-stack models such as kermit): no decoder sizes, embeddings are one table anyway
SIZE=(--encoder-layers "$LAYERS" --encoder-embed-dim "$DIM" --encoder-ffn-embed-dim "$FFN" --encoder-attention-heads "$HEADS")
if [[ "${ENCODER_ONLY:-0}" != 1 ]]; then
  SIZE+=(--share-all-embeddings --decoder-layers "$LAYERS" --decoder-embed-dim "$DIM" --decoder-ffn-embed-dim "$FFN"
         --decoder-attention-heads "$HEADS")
fi
ARGS=("$DATA_BIN" --user-dir "$USER_DIR" "${SYS[@]}" ${NAT_EXTRA[@]+"${NAT_EXTRA[@]}"} \
  --apply-bert-init "${SIZE[@]}" --dropout "$DROPOUT" \
  --label-smoothing "$LABEL_SMOOTHING" --optimizer adam --adam-betas '(0.9,0.98)' --lr "$LR" \
  --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" --weight-decay 0.01 --clip-norm 5.0 \
  --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --seed "$SEED" --num-workers 0 \
  --save-dir "$SAVE_DIR" --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates "$((AVG > 2 ? AVG : 2))" \
  --keep-last-epochs "$((AVG > 2 ? AVG : 2))" --log-format simple --log-interval 20 ${EXTRA[@]+"${EXTRA[@]}"})
RESUME_OUT="$("${PYTHON:-python}" "$USER_DIR/checkpoint_resume.py" "$SAVE_DIR" --log "$SAVE_DIR/train.log")" || exit 1
RESUME=()
[[ -n "$RESUME_OUT" ]] && mapfile -t RESUME <<<"$RESUME_OUT"
ARGS+=(${RESUME[@]+"${RESUME[@]}"})
if [[ -n "${INIT_FROM:-}" && ${#RESUME[@]} -eq 0 ]]; then
  # Same start for every system: copy the AT model's weights into the freshly built NAT model.
  INIT_CKPT="$SAVE_DIR/init_from_at.pt"
  if [[ ! -f "$SAVE_DIR/checkpoint_last.pt" && ! -f "$INIT_CKPT" ]]; then
    python -m fairseq_nat_ext.init_from_at --teacher "$INIT_FROM" --out "$INIT_CKPT.tmp" -- "${ARGS[@]}" \
      2>&1 | tee -a "$SAVE_DIR/train.log"
    mv "$INIT_CKPT.tmp" "$INIT_CKPT"
  fi
  # (fairseq refuses it together with --restore-file; a resumed run has its weights anyway)
  ARGS+=(--finetune-from-model "$INIT_CKPT")
fi
fairseq-train "${ARGS[@]}" 2>&1 | tee -a "$SAVE_DIR/train.log"
if [[ "$AVG" -gt 0 ]]; then
  "$SCRIPT_DIR/average_checkpoints.sh" "$SAVE_DIR" "$AVG" "$SAVE_DIR/checkpoint_avg.pt" >&2
  echo "$SAVE_DIR/checkpoint_avg.pt"
else
  echo "$SAVE_DIR/checkpoint_last.pt"
fi
