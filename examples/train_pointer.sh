#!/usr/bin/env bash
# Train one pointer network on a pointer_geometry data directory ({train,valid}.txt, published text
# format, written by `python -m fairseq_nat_ext.data.pointer_geometry`; no fairseq-preprocess step).
#
#   PROBLEM=convex_hull ARCH=pointer_lstm examples/train_pointer.sh DATA_DIR SAVE_DIR [extra fairseq-train args]
#
# Environment (defaults in brackets):
#   PROBLEM           convex_hull | delaunay | tsp (required)
#   ARCH              pointer_lstm | pointer_transformer [pointer_lstm]
#   MAX_UPDATE        training budget in updates [20000]
#   STOP_TIME_HOURS   wall-time budget in hours, 0 = none [0]; whichever budget ends first stops training
#   BATCH_SIZE        examples per update [128, as in Vinyals et al.]
#   LR, WARMUP        Adam learning rate and inverse-sqrt warm-up updates [1e-3, 200]
#   CLIP_NORM         gradient clipping [2.0, as in Vinyals et al.]
#   AUGMENT           training-split augmentation: none | dihedral | permute | dihedral,permute [none]
#                     (the unit square's 8 symmetries / a random point order, labels kept exact; drawn
#                     afresh every epoch: fairseq_nat_ext/data/pointer_augment.py)
#   INDEX_RANGE       pointer_transformer only: L > 0 trains with randomised index positions (a sorted
#                     random subset of 1..L per example; evenly spaced at inference) so that a model
#                     can be tested on more points than it saw, up to L; 0 = indices 1..n [0]
#   SEED [1]  THREADS (torch/OMP threads) [$(nproc)]
# Checkpoints: SAVE_DIR/checkpoint_best.pt (lowest valid loss, validated every epoch) and
# checkpoint_last.pt; training resumes from checkpoint_last.pt (on a finished run fairseq-train
# makes one more update: benchmark/pointer.py does not start it again);
# log: SAVE_DIR/train.log.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ -x "$REPO/.venv/bin/fairseq-train" ]] && export PATH="$REPO/.venv/bin:$PATH"
DATA_DIR="${1:?usage: train_pointer.sh DATA_DIR SAVE_DIR [fairseq-train args]}"
SAVE_DIR="${2:?usage: train_pointer.sh DATA_DIR SAVE_DIR [fairseq-train args]}"
shift 2
[[ -f "$DATA_DIR/train.txt" && -f "$DATA_DIR/valid.txt" ]] || { echo "error: $DATA_DIR needs train.txt and valid.txt" >&2; exit 1; }
PROBLEM="${PROBLEM:?error: set PROBLEM=convex_hull|delaunay|tsp}"
ARCH="${ARCH:-pointer_lstm}"
MAX_UPDATE="${MAX_UPDATE:-20000}"; STOP_TIME_HOURS="${STOP_TIME_HOURS:-0}"
BATCH_SIZE="${BATCH_SIZE:-128}"; LR="${LR:-1e-3}"; WARMUP="${WARMUP:-200}"; CLIP_NORM="${CLIP_NORM:-2.0}"
# shellcheck source=lib/common.sh
source "$REPO/examples/lib/common.sh"
SEED="${SEED:-1}"; THREADS="${THREADS:-$(default_cores)}"; AUGMENT="${AUGMENT:-none}"; INDEX_RANGE="${INDEX_RANGE:-0}"
ARCH_ARGS=()
if [[ "$INDEX_RANGE" != 0 ]]; then
  [[ "$ARCH" == pointer_transformer ]] || { echo "error: INDEX_RANGE=$INDEX_RANGE needs ARCH=pointer_transformer (got $ARCH)" >&2; exit 1; }
  ARCH_ARGS=(--pointer-index-range "$INDEX_RANGE")
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$THREADS}"
mkdir -p "$SAVE_DIR"
echo "# train_pointer.sh PROBLEM=$PROBLEM ARCH=$ARCH MAX_UPDATE=$MAX_UPDATE STOP_TIME_HOURS=$STOP_TIME_HOURS BATCH_SIZE=$BATCH_SIZE LR=$LR WARMUP=$WARMUP CLIP_NORM=$CLIP_NORM AUGMENT=$AUGMENT INDEX_RANGE=$INDEX_RANGE SEED=$SEED THREADS=$THREADS $*" >> "$SAVE_DIR/train.log"
fairseq-train "$DATA_DIR" --user-dir "$REPO/fairseq_nat_ext" --task pointer_geometry --problem "$PROBLEM" \
  --arch "$ARCH" ${ARCH_ARGS[@]+"${ARCH_ARGS[@]}"} --criterion pointer_cross_entropy --augment "$AUGMENT" \
  --optimizer adam --adam-betas '(0.9,0.999)' --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" \
  --warmup-init-lr 1e-7 --clip-norm "$CLIP_NORM" --batch-size "$BATCH_SIZE" --max-update "$MAX_UPDATE" \
  --stop-time-hours "$STOP_TIME_HOURS" --seed "$SEED" --num-workers 0 --save-dir "$SAVE_DIR" \
  --no-epoch-checkpoints --best-checkpoint-metric loss --log-format simple --log-interval 100 \
  "$@" 2>&1 | tee -a "$SAVE_DIR/train.log"
