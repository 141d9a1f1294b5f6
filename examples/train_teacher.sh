#!/usr/bin/env bash
# Train an autoregressive fairseq `transformer` teacher, then average its last checkpoints.
#
#   examples/train_teacher.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#
# Defaults are the Multi30K teacher of shared/data/multi30k-teacher/README.md; each can be
# overridden by an environment variable:
#   LAYERS=3 (encoder and decoder; ENC_LAYERS / DEC_LAYERS override each side)
#   DIM=256  FFN=4*DIM  HEADS=4  DROPOUT=0.3  LABEL_SMOOTHING=0.1
#   LR=1e-3  WARMUP=400  MAX_TOKENS=4096  MAX_UPDATE=1300  SEED=1
#   MAX_EPOCH=0 (0: no limit)   LOG_INTERVAL=50   VALIDATE_INTERVAL=1 (epochs)
#   AVG=5                 average the last AVG checkpoints (0: skip averaging; fewer are
#                         averaged when fewer exist)
#   SAVE_INTERVAL_UPDATES=0   >0: also save checkpoint_E_U.pt every so many updates; these
#                         are then the ones averaged
#   KEEP_LAST=$AVG        epoch (and update) checkpoints kept on disk (fairseq deletes older)
#   THREADS=$(nproc)      torch CPU threads (OMP_NUM_THREADS) unless already set
# e.g. a tiny teacher for the quick start:
#   MAX_UPDATE=300 LAYERS=2 DIM=128 HEADS=2 WARMUP=100 examples/train_teacher.sh data-bin ckpt
#
# Extra arguments are appended to fairseq-train's command line (later ones win).
# The plugin is loaded with --user-dir <repo>/fairseq_nat_ext; data loading uses --num-workers 0.
# A rerun resumes from the newest intact checkpoint (fairseq_nat_ext/checkpoint_resume.py: checkpoint_last.pt,
# or --restore-file of a newer one when a kill left checkpoint_last.pt truncated; the choice is logged).
# Output: SAVE_DIR/checkpoint{E,_best,_last}.pt and SAVE_DIR/checkpoint_avg.pt (averaged; the
# path is printed on the last line of stdout), training log in SAVE_DIR/train.log.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
USER_DIR="$(cd "$SCRIPT_DIR/.." && pwd)/fairseq_nat_ext"

if [[ $# -lt 2 || "$1" == -h || "$1" == --help ]]; then
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
[[ -d "$DATA_BIN" ]] || { echo "error: DATA_BIN $DATA_BIN is not a directory" >&2; exit 1; }
command -v fairseq-train >/dev/null 2>&1 || { echo "error: fairseq-train not found on PATH (activate .venv)" >&2; exit 1; }

LAYERS="${LAYERS:-3}"
ENC_LAYERS="${ENC_LAYERS:-$LAYERS}"; DEC_LAYERS="${DEC_LAYERS:-$LAYERS}"
DIM="${DIM:-256}"; FFN="${FFN:-$((4 * DIM))}"; HEADS="${HEADS:-4}"
DROPOUT="${DROPOUT:-0.3}"; LABEL_SMOOTHING="${LABEL_SMOOTHING:-0.1}"
LR="${LR:-1e-3}"; WARMUP="${WARMUP:-400}"; MAX_TOKENS="${MAX_TOKENS:-4096}"
MAX_UPDATE="${MAX_UPDATE:-1300}"; MAX_EPOCH="${MAX_EPOCH:-0}"; SEED="${SEED:-1}"
LOG_INTERVAL="${LOG_INTERVAL:-50}"; VALIDATE_INTERVAL="${VALIDATE_INTERVAL:-1}"
AVG="${AVG:-5}"; SAVE_INTERVAL_UPDATES="${SAVE_INTERVAL_UPDATES:-0}"
KEEP_LAST="${KEEP_LAST:-$(( AVG > 1 ? AVG : 1 ))}"
# shellcheck source=lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${THREADS:-$(default_cores)}}"

mkdir -p "$SAVE_DIR"
EXTRA_SAVE=()
if [[ "$SAVE_INTERVAL_UPDATES" -gt 0 ]]; then
    EXTRA_SAVE=(--save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates "$KEEP_LAST")
fi

RESUME_OUT="$("${PYTHON:-python}" "$USER_DIR/checkpoint_resume.py" "$SAVE_DIR" --log "$SAVE_DIR/train.log")" || exit 1
RESUME=()
[[ -n "$RESUME_OUT" ]] && mapfile -t RESUME <<<"$RESUME_OUT"

echo "[train_teacher] transformer ${ENC_LAYERS}+${DEC_LAYERS} layers, dim $DIM, ffn $FFN, heads $HEADS;" \
     "max_update $MAX_UPDATE, max_tokens $MAX_TOKENS -> $SAVE_DIR" >&2
fairseq-train "$DATA_BIN" \
    --user-dir "$USER_DIR" \
    --arch transformer --share-all-embeddings \
    --encoder-layers "$ENC_LAYERS" --decoder-layers "$DEC_LAYERS" \
    --encoder-embed-dim "$DIM" --decoder-embed-dim "$DIM" \
    --encoder-ffn-embed-dim "$FFN" --decoder-ffn-embed-dim "$FFN" \
    --encoder-attention-heads "$HEADS" --decoder-attention-heads "$HEADS" \
    --dropout "$DROPOUT" \
    --criterion label_smoothed_cross_entropy --label-smoothing "$LABEL_SMOOTHING" \
    --optimizer adam --adam-betas '(0.9,0.98)' --lr "$LR" --lr-scheduler inverse_sqrt \
    --warmup-updates "$WARMUP" --max-tokens "$MAX_TOKENS" \
    --max-update "$MAX_UPDATE" --max-epoch "$MAX_EPOCH" --seed "$SEED" \
    --validate-interval "$VALIDATE_INTERVAL" \
    --keep-last-epochs "$KEEP_LAST" "${EXTRA_SAVE[@]}" \
    --num-workers 0 --log-format simple --log-interval "$LOG_INTERVAL" \
    --save-dir "$SAVE_DIR" ${RESUME[@]+"${RESUME[@]}"} \
    "$@" 2>&1 | tee -a "$SAVE_DIR/train.log" >&2

if [[ "$AVG" -le 0 ]]; then
    echo "[train_teacher] AVG=0: no averaging; best checkpoint: $SAVE_DIR/checkpoint_best.pt" >&2
    echo "$SAVE_DIR/checkpoint_best.pt"
    exit 0
fi
n_update=$(ls "$SAVE_DIR" | grep -cE '^checkpoint_[0-9]+_[0-9]+\.pt$' || true)
n_epoch=$(ls "$SAVE_DIR" | grep -cE '^checkpoint[0-9]+\.pt$' || true)
available=$(( n_update > 0 ? n_update : n_epoch ))
if [[ "$available" -eq 0 ]]; then
    echo "error: no epoch or update checkpoint in $SAVE_DIR to average" >&2
    exit 1
fi
n=$(( available < AVG ? available : AVG ))
[[ "$n" -lt "$AVG" ]] && echo "[train_teacher] only $available checkpoints: averaging $n instead of $AVG" >&2
bash "$SCRIPT_DIR/average_checkpoints.sh" "$SAVE_DIR" "$n" "$SAVE_DIR/checkpoint_avg.pt"
echo "$SAVE_DIR/checkpoint_avg.pt"
