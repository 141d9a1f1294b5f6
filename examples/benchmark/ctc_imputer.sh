#!/usr/bin/env bash
# CTC / Imputer benchmark (Multi30K En->De distilled, test_2016_flickr): the teacher, ctc_nat (greedy
# and prefix beam 5), imputer (block 1, 2, 4, 8) and our mask_predict, measured by
# fairseq_nat_ext.benchmark.run with one protocol.
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
# allows, python -m fairseq_nat_ext.benchmark.ctc_filtered on TRAIN_DATA_BIN) is written into the
# results' "data" field.  Then the README's results section is regenerated from
# benchmarks/results/*.json and benchmarks/results/ctc_imputer.png redrawn.
#
# Settings:
#   DATA_BIN          data-bin with the test split (a distilled data-bin is fine); its dictionary must
#                     be the teacher's dict.txt.  Default $REPO/runs/m30k_distill/data-bin
#   TRAIN_DATA_BIN    data-bin whose train split the CTC systems were trained on (default DATA_BIN)
#   RAW_REF           raw reference of the test split (default the shared test_2016_flickr.de.gz)
#   SRC, TGT          languages (default en, de)
#   TEACHER_CKPT      default /work/shared/data/multi30k-teacher/teacher.pt
#   TEACHER_UPDATES   default: read from the checkpoint
#   TEACHER_WALL_S    default 5700 (the shared teacher's README; the checkpoint does not store it)
#   CTC_CKPT          default $REPO/runs/ctc/checkpoint_avg.pt
#   IMPUTER_CKPT      default $REPO/runs/imputer/checkpoint_avg.pt
#   MP_CKPT           default $REPO/runs/mp_ours/checkpoint_avg.pt
#   <SYS>_TRAIN_LOG, <SYS>_UPDATES, <SYS>_WALL_S  for SYS in CTC IMPUTER MP (default log
#                     $REPO/runs/{ctc,imputer,mp_ours}/train.log when it exists, else the checkpoint)
#   THREADS           torch threads, the same for every system (default 2)
#   LATENCY_SENTENCES batch-1 latency on the first N test sentences (default 200; 0 = all)
#   LIMIT             benchmark only the first N test sentences (smoke tests only; needs a RAW_REF
#                     of N lines or more -- the reference is cut to N lines as well)
#   OUT               default benchmarks/results/ctc_imputer.json (relative to the repo root)
#   README            default README.md (relative to the repo root)
#   CUDA=1            decode on CUDA when available (default: CPU)
#   TRAIN_COMMAND     how the systems were trained -- state the CTC model's budget that the Imputer's
#                     alignments (and initialisation) came from -- recorded in the results' "command"
#   SYSTEMS           which rows to (re)measure, default "teacher ctc imputer mp reference"
#   PYTHON            default: the repo's .venv/bin/python when present, else python
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python; fi
fi

DATA_BIN="${DATA_BIN:-$REPO/runs/m30k_distill/data-bin}"
TRAIN_DATA_BIN="${TRAIN_DATA_BIN:-$DATA_BIN}"
RAW_REF="${RAW_REF:-/work/shared/data/multi30k/test_2016_flickr.de.gz}"
SRC="${SRC:-en}"
TGT="${TGT:-de}"
TEACHER_CKPT="${TEACHER_CKPT:-/work/shared/data/multi30k-teacher/teacher.pt}"
TEACHER_UPDATES="${TEACHER_UPDATES:-}"
TEACHER_WALL_S="${TEACHER_WALL_S:-5700}"
CTC_CKPT="${CTC_CKPT:-$REPO/runs/ctc/checkpoint_avg.pt}"
CTC_TRAIN_LOG="${CTC_TRAIN_LOG:-$REPO/runs/ctc/train.log}"
IMPUTER_CKPT="${IMPUTER_CKPT:-$REPO/runs/imputer/checkpoint_avg.pt}"
IMPUTER_TRAIN_LOG="${IMPUTER_TRAIN_LOG:-$REPO/runs/imputer/train.log}"
MP_CKPT="${MP_CKPT:-$REPO/runs/mp_ours/checkpoint_avg.pt}"
MP_TRAIN_LOG="${MP_TRAIN_LOG:-$REPO/runs/mp_ours/train.log}"
THREADS="${THREADS:-2}"
LATENCY_SENTENCES="${LATENCY_SENTENCES:-200}"
LIMIT="${LIMIT:-}"
OUT="${OUT:-benchmarks/results/ctc_imputer.json}"
README="${README:-README.md}"
CUDA="${CUDA:-0}"
SYSTEMS="${SYSTEMS:-teacher ctc imputer mp reference}"
want() { [[ " $SYSTEMS " == *" $1 "* ]]; }

die() { echo "error: $*" >&2; exit 1; }
for s in $SYSTEMS; do
    case "$s" in teacher|ctc|imputer|mp|reference) ;; *) die "SYSTEMS: unknown system '$s' (teacher ctc imputer mp reference)" ;; esac
done
[[ -d "$DATA_BIN" ]] || die "DATA_BIN $DATA_BIN: no such directory"
[[ -d "$TRAIN_DATA_BIN" ]] || die "TRAIN_DATA_BIN $TRAIN_DATA_BIN: no such directory"
[[ -f "$RAW_REF" ]] || die "RAW_REF $RAW_REF: no such file"
[[ -z "$LIMIT" || "$LIMIT" =~ ^[1-9][0-9]*$ ]] || die "LIMIT must be a positive integer, got '$LIMIT'"
want teacher && { [[ -f "$TEACHER_CKPT" ]] || die "checkpoint $TEACHER_CKPT not found (set TEACHER_CKPT)"; }
want ctc && { [[ -f "$CTC_CKPT" ]] || die "checkpoint $CTC_CKPT not found (set CTC_CKPT)"; }
want imputer && { [[ -f "$IMPUTER_CKPT" ]] || die "checkpoint $IMPUTER_CKPT not found (set IMPUTER_CKPT)"; }
want mp && { [[ -f "$MP_CKPT" ]] || die "checkpoint $MP_CKPT not found (set MP_CKPT)"; }

# The command recorded in the results: this script with every setting spelled out.
COMMAND="DATA_BIN=$DATA_BIN TRAIN_DATA_BIN=$TRAIN_DATA_BIN RAW_REF=$RAW_REF TEACHER_CKPT=$TEACHER_CKPT"
COMMAND+=" TEACHER_WALL_S=$TEACHER_WALL_S${TEACHER_UPDATES:+ TEACHER_UPDATES=$TEACHER_UPDATES}"
COMMAND+=" CTC_CKPT=$CTC_CKPT IMPUTER_CKPT=$IMPUTER_CKPT MP_CKPT=$MP_CKPT"
for v in CTC_UPDATES CTC_WALL_S IMPUTER_UPDATES IMPUTER_WALL_S MP_UPDATES MP_WALL_S; do
    [[ -n "${!v:-}" ]] && COMMAND+=" $v=${!v}"
done
COMMAND+=" THREADS=$THREADS LATENCY_SENTENCES=$LATENCY_SENTENCES${LIMIT:+ LIMIT=$LIMIT}"
[[ "$CUDA" == 1 ]] && COMMAND+=" CUDA=1"
COMMAND+=" bash examples/benchmark/ctc_imputer.sh"
[[ -n "${TRAIN_COMMAND:-}" ]] && COMMAND="training: $TRAIN_COMMAND; benchmark: $COMMAND"

bench() { echo "[ctc_imputer.sh] $*" >&2; "$PYTHON" -m fairseq_nat_ext.benchmark.run "$@"; }

# Filtered training pairs of the CTC systems -> the results' "data" field (the same for every call:
# run.py rewrites "data" each time).
filtered() {  # CKPT -> "k of n (upsample ratio r)"
    "$PYTHON" -m fairseq_nat_ext.benchmark.ctc_filtered --ckpt "$1" --data-bin "$TRAIN_DATA_BIN" \
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

COMMON=(--benchmark ctc_imputer --data-bin "$DATA_BIN" --raw-ref "$RAW_REF" --data-name "$DATA_NAME"
        --src-lang "$SRC" --tgt-lang "$TGT" --threads "$THREADS"
        --latency-sentences "$LATENCY_SENTENCES" --out "$OUT" --command "$COMMAND")
[[ -n "$LIMIT" ]] && COMMON+=(--limit "$LIMIT")
[[ "$CUDA" == 1 ]] && COMMON+=(--cuda)

# train_stats UPDATES WALL LOG -> the --train-* options for one system
train_stats() {
    local updates="$1" wall="$2" log="$3"
    local out=()
    [[ -n "$updates" ]] && out+=(--train-updates "$updates")
    [[ -n "$wall" ]] && out+=(--train-wall-s "$wall")
    [[ -n "$log" && -f "$log" ]] && out+=(--train-log "$log")
    echo "${out[@]}"
}

# shellcheck disable=SC2046  # word splitting of train_stats is intended (no spaces in paths)
want teacher && bench "${COMMON[@]}" --system-ckpt "$TEACHER_CKPT" --no-distilled \
    --decoding beam=1 --decoding beam=5 $(train_stats "$TEACHER_UPDATES" "$TEACHER_WALL_S" "")
# shellcheck disable=SC2046
want ctc && bench "${COMMON[@]}" --system-ckpt "$CTC_CKPT" --distilled \
    --decoding beam=1 --decoding beam=5 \
    $(train_stats "${CTC_UPDATES:-}" "${CTC_WALL_S:-}" "$CTC_TRAIN_LOG")
# shellcheck disable=SC2046
want imputer && bench "${COMMON[@]}" --system-ckpt "$IMPUTER_CKPT" --distilled \
    --decoding block=1 --decoding block=2 --decoding block=4 --decoding block=8 \
    $(train_stats "${IMPUTER_UPDATES:-}" "${IMPUTER_WALL_S:-}" "$IMPUTER_TRAIN_LOG")
# shellcheck disable=SC2046
want mp && bench "${COMMON[@]}" --system-ckpt "$MP_CKPT" --distilled \
    --decoding iter=4,len_beam=3 --decoding iter=10,len_beam=3 \
    $(train_stats "${MP_UPDATES:-}" "${MP_WALL_S:-}" "$MP_TRAIN_LOG")
want reference && bench "${COMMON[@]}" --reference-row

"$PYTHON" -m fairseq_nat_ext.benchmark.tables "$(dirname "$OUT")"/*.json
if [[ -f "$README" ]]; then
    "$PYTHON" -m fairseq_nat_ext.benchmark.tables "$(dirname "$OUT")"/*.json --update-readme "$README" \
        || echo "[ctc_imputer.sh] README not updated (see the error above)" >&2
else
    echo "[ctc_imputer.sh] $README not found: README not updated" >&2
fi
echo "[ctc_imputer.sh] done: $OUT" >&2
