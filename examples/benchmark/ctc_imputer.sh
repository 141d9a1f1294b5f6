#!/usr/bin/env bash
# CTC / Imputer benchmark (Multi30K En->De distilled, test_2016_flickr): the teacher, ctc_nat (greedy
# and prefix beam 5), imputer (block 1, 2, 4, 8) and our mask_predict, measured by
# fairseq_nat_ext.evaluation.run with one protocol.
#
# Usage (from anywhere; every setting has a default, override by environment variable):
#   DATA_BIN=$REPO/runs/m30k_distill/data-bin \
#   CTC_CKPT=$REPO/runs/ctc/checkpoint_avg.pt IMPUTER_CKPT=$REPO/runs/imputer/checkpoint_avg.pt \
#   bash examples/benchmark/ctc_imputer.sh
#
# Rows written to $OUT (upserted: other rows are kept):
#   fairseq:transformer  beam=1, beam=5                 the AR teacher (not distilled)
#   ctc_nat              beam=1 (greedy), beam=5 (CTC prefix beam search)
#   imputer              block=1, block=2, block=4, block=8   (exactly B decoder passes)
#   mask_predict         iter=4,len_beam=3  iter=10,len_beam=3
#   reference            none
# The number of training pairs each CTC system had to filter (target longer than the upsampled source
# allows, python -m fairseq_nat_ext.evaluation.ctc_filtered on TRAIN_DATA_BIN) is written into the
# results' "data" field.  Then the results section of docs/benchmarks.md is regenerated from
# benchmarks/results/*.json and benchmarks/results/ctc_imputer.png redrawn.
#
# Settings (environment; the shared ones -- DATA_BIN, RAW_REF, SRC/TGT, TEACHER_*, THREADS,
# LATENCY_SENTENCES, LIMIT (smoke tests: the reference is cut to N lines too), OUT, DOCS, CUDA,
# TRAIN_COMMAND (state the CTC model's budget that the Imputer's alignments came from) -- are listed in
# examples/benchmark/lib.sh):
#   TRAIN_DATA_BIN    data-bin whose train split the CTC systems were trained on (default DATA_BIN)
#   CTC_CKPT          default $REPO/runs/ctc/checkpoint_avg.pt
#   IMPUTER_CKPT      default $REPO/runs/imputer/checkpoint_avg.pt
#   MP_CKPT           default $REPO/runs/mp_ours/checkpoint_avg.pt
#   <SYS>_TRAIN_LOG, <SYS>_UPDATES, <SYS>_WALL_S  for SYS in CTC IMPUTER MP (default: train.log beside
#                     the checkpoint when it exists, else the checkpoint)
#   SYSTEMS           which rows to (re)measure, default "teacher ctc imputer reference"; mp (Mask-Predict,
#                     another budget) only without ctc and imputer, into its own table
#                     (BENCHMARK_NAME=ctc_imputer_mask_predict SYSTEMS='teacher mp reference')
set -euo pipefail
NAME=ctc_imputer
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
TRAIN_DATA_BIN="${TRAIN_DATA_BIN:-$DATA_BIN}"
CTC_CKPT="${CTC_CKPT:-$REPO/runs/ctc/checkpoint_avg.pt}"
IMPUTER_CKPT="${IMPUTER_CKPT:-$REPO/runs/imputer/checkpoint_avg.pt}"
MP_CKPT="${MP_CKPT:-$REPO/runs/mp_ours/checkpoint_avg.pt}"
SYSTEMS="${SYSTEMS:-teacher ctc imputer reference}"
check_systems teacher ctc imputer mp reference
separate_table mp "measure Mask-Predict (its own budget) in its own table, e.g. BENCHMARK_NAME=ctc_imputer_mask_predict SYSTEMS='teacher mp reference'"
[[ -d "$DATA_BIN" ]] || die "DATA_BIN $DATA_BIN: no such directory"
[[ -d "$TRAIN_DATA_BIN" ]] || die "TRAIN_DATA_BIN $TRAIN_DATA_BIN: no such directory"
[[ -f "$RAW_REF" ]] || die "RAW_REF $RAW_REF: no such file"
need_ckpts teacher ctc imputer mp

# The command recorded in the results: this script with every setting spelled out.
COMMAND="DATA_BIN=$DATA_BIN TRAIN_DATA_BIN=$TRAIN_DATA_BIN RAW_REF=$RAW_REF$(wanted_settings teacher ctc imputer mp)"
[[ "$SYSTEMS" != "teacher ctc imputer reference" ]] && COMMAND+=" SYSTEMS='$SYSTEMS'"
finish_command

# Filtered training pairs of the CTC systems -> the results' "data" field (the same for every call:
# run.py rewrites "data" each time).
filtered() {  # CKPT -> "k of n (upsample ratio r)"
    "$PYTHON" -m fairseq_nat_ext.evaluation.ctc_filtered --ckpt "$1" --data-bin "$TRAIN_DATA_BIN" \
        --src-lang "$SRC" --tgt-lang "$TGT" --text | tail -n 1
}
DATA_NAME="$DATA_BIN [test, $SRC->$TGT], reference $RAW_REF${LIMIT:+ (first $LIMIT sentences)}"
NOTES=()
[[ -f "$CTC_CKPT" ]] && NOTES+=("ctc_nat $(filtered "$CTC_CKPT")")
[[ -f "$IMPUTER_CKPT" ]] && NOTES+=("imputer $(filtered "$IMPUTER_CKPT")")
if [[ ${#NOTES[@]} -gt 0 ]]; then
    joined="$(printf '%s, ' "${NOTES[@]}")"
    DATA_NAME+="; training pairs filtered as infeasible for CTC ($TRAIN_DATA_BIN train): ${joined%, }"
fi
echo "[ctc_imputer.sh] data: $DATA_NAME" >&2

harness_options
COMMON=("${HARNESS[@]}" --data-bin "$DATA_BIN" --raw-ref "$RAW_REF" --data-name "$DATA_NAME"
        --src-lang "$SRC" --tgt-lang "$TGT")

# shellcheck disable=SC2046  # word splitting of train_stats is intended (no spaces in paths)
want teacher && bench "${COMMON[@]}" --system-ckpt "$TEACHER_CKPT" --no-distilled \
    --decoding beam=1 --decoding beam=5 $(train_stats TEACHER)
# shellcheck disable=SC2046
want ctc && bench "${COMMON[@]}" --system-ckpt "$CTC_CKPT" --distilled \
    --decoding beam=1 --decoding beam=5 $(train_stats CTC)
# shellcheck disable=SC2046
want imputer && bench "${COMMON[@]}" --system-ckpt "$IMPUTER_CKPT" --distilled \
    --decoding block=1 --decoding block=2 --decoding block=4 --decoding block=8 $(train_stats IMPUTER)
# shellcheck disable=SC2046
want mp && bench "${COMMON[@]}" --system-ckpt "$MP_CKPT" --distilled \
    --decoding iter=4,len_beam=3 --decoding iter=10,len_beam=3 $(train_stats MP)
want reference && bench "${COMMON[@]}" --reference-row
update_tables
