#!/usr/bin/env bash
# Mask-Predict benchmark (Multi30K En->De, test_2016_flickr): teacher vs. our mask_predict vs.
# fairseq's cmlm_transformer, measured by fairseq_nat_ext.benchmark.run with one protocol.
#
# Usage (from anywhere; every setting has a default, override by environment variable):
#   DATA_BIN=$REPO/runs/m30k_distill/data-bin \
#   MP_CKPT=$REPO/runs/mp_ours/checkpoint_avg.pt \
#   CMLM_CKPT=$REPO/runs/cmlm/checkpoint_avg.pt \
#   bash examples/benchmark/mask_predict.sh
#
# Rows written to $OUT (upserted: other rows are kept):
#   fairseq:transformer       beam=1, beam=5            the AR teacher (not distilled)
#   mask_predict              iter=4,len_beam=3         our model, trained on distilled data
#   mask_predict              iter=10,len_beam=3
#   fairseq:cmlm_transformer  iter=10,len_beam=3        fairseq's CMLM, distilled data, adaptive
#                                                       stopping (no --iter-decode-force-max-iter)
#   reference                 none                      the reference's own repeat rate
# then the README's results section (between <!-- results:begin --> and <!-- results:end -->)
# is regenerated from benchmarks/results/*.json and benchmarks/results/mask_predict.png redrawn.
#
# Settings:
#   DATA_BIN          data-bin with the test split (a distilled data-bin is fine: distillation only
#                     changes train targets); its dictionary must be the teacher's dict.txt
#                     (examples/prepare_data.sh --codes bpe.codes --srcdict dict.txt)
#                     default $REPO/runs/m30k_distill/data-bin
#   RAW_REF           raw reference of the test split (default the shared test_2016_flickr.de.gz)
#   SRC, TGT          languages (default en, de)
#   TEACHER_CKPT      default /work/shared/data/multi30k-teacher/teacher.pt
#   TEACHER_UPDATES   default: read from the checkpoint (1300)
#   TEACHER_WALL_S    default 5700 (its README: about 95 minutes; the checkpoint does not store it)
#   MP_CKPT           default $REPO/runs/mp_ours/checkpoint_avg.pt
#   MP_TRAIN_LOG      default $REPO/runs/mp_ours/train.log (used when it exists)
#   MP_UPDATES, MP_WALL_S      explicit values (else the log, else the checkpoint)
#   CMLM_CKPT         default $REPO/runs/cmlm/checkpoint_avg.pt
#   CMLM_TRAIN_LOG    default $REPO/runs/cmlm/train.log (used when it exists)
#   CMLM_UPDATES, CMLM_WALL_S  explicit values (else the log, else the checkpoint)
#   THREADS           torch threads, the same for every system (default 2)
#   LATENCY_SENTENCES batch-1 latency on the first N test sentences (default 200; 0 = all)
#   OUT               default benchmarks/results/mask_predict.json (relative to the repo root)
#   README            default README.md (relative to the repo root)
#   CUDA=1            decode on CUDA when available (default: CPU)
#   TRAIN_COMMAND     how the NAT systems were trained (same budget for both), recorded in the
#                     results' "command" before the benchmark command
#   SYSTEMS           which rows to (re)measure, default "teacher mp cmlm reference"; other rows of
#                     $OUT are kept (e.g. measure the teacher and ours while the CMLM still trains)
#   PYTHON            default: the repo's .venv/bin/python when present, else python
# The run takes a while on CPU (the teacher's beam search dominates); latencies are only meaningful
# on an otherwise idle machine (the harness warns when the load average says it is not).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python; fi
fi

DATA_BIN="${DATA_BIN:-$REPO/runs/m30k_distill/data-bin}"
RAW_REF="${RAW_REF:-/work/shared/data/multi30k/test_2016_flickr.de.gz}"
SRC="${SRC:-en}"
TGT="${TGT:-de}"
TEACHER_CKPT="${TEACHER_CKPT:-/work/shared/data/multi30k-teacher/teacher.pt}"
TEACHER_UPDATES="${TEACHER_UPDATES:-}"
TEACHER_WALL_S="${TEACHER_WALL_S:-5700}"
MP_CKPT="${MP_CKPT:-$REPO/runs/mp_ours/checkpoint_avg.pt}"
MP_TRAIN_LOG="${MP_TRAIN_LOG:-$REPO/runs/mp_ours/train.log}"
MP_UPDATES="${MP_UPDATES:-}"
MP_WALL_S="${MP_WALL_S:-}"
CMLM_CKPT="${CMLM_CKPT:-$REPO/runs/cmlm/checkpoint_avg.pt}"
CMLM_TRAIN_LOG="${CMLM_TRAIN_LOG:-$REPO/runs/cmlm/train.log}"
CMLM_UPDATES="${CMLM_UPDATES:-}"
CMLM_WALL_S="${CMLM_WALL_S:-}"
THREADS="${THREADS:-2}"
LATENCY_SENTENCES="${LATENCY_SENTENCES:-200}"
OUT="${OUT:-benchmarks/results/mask_predict.json}"
README="${README:-README.md}"
CUDA="${CUDA:-0}"
SYSTEMS="${SYSTEMS:-teacher mp cmlm reference}"
want() { [[ " $SYSTEMS " == *" $1 "* ]]; }

die() { echo "error: $*" >&2; exit 1; }
[[ -d "$DATA_BIN" ]] || die "DATA_BIN $DATA_BIN: no such directory"
[[ -f "$RAW_REF" ]] || die "RAW_REF $RAW_REF: no such file"
want teacher && { [[ -f "$TEACHER_CKPT" ]] || die "checkpoint $TEACHER_CKPT not found (set TEACHER_CKPT)"; }
want mp && { [[ -f "$MP_CKPT" ]] || die "checkpoint $MP_CKPT not found (set MP_CKPT)"; }
want cmlm && { [[ -f "$CMLM_CKPT" ]] || die "checkpoint $CMLM_CKPT not found (set CMLM_CKPT)"; }

# The command recorded in the results: this script with every setting spelled out.
COMMAND="DATA_BIN=$DATA_BIN RAW_REF=$RAW_REF TEACHER_CKPT=$TEACHER_CKPT TEACHER_WALL_S=$TEACHER_WALL_S"
COMMAND+="${TEACHER_UPDATES:+ TEACHER_UPDATES=$TEACHER_UPDATES}"
COMMAND+=" MP_CKPT=$MP_CKPT${MP_UPDATES:+ MP_UPDATES=$MP_UPDATES}${MP_WALL_S:+ MP_WALL_S=$MP_WALL_S}"
COMMAND+=" CMLM_CKPT=$CMLM_CKPT${CMLM_UPDATES:+ CMLM_UPDATES=$CMLM_UPDATES}${CMLM_WALL_S:+ CMLM_WALL_S=$CMLM_WALL_S}"
COMMAND+=" THREADS=$THREADS LATENCY_SENTENCES=$LATENCY_SENTENCES"
[[ "$CUDA" == 1 ]] && COMMAND+=" CUDA=1"
COMMAND+=" bash examples/benchmark/mask_predict.sh"
[[ -n "${TRAIN_COMMAND:-}" ]] && COMMAND="training: $TRAIN_COMMAND; benchmark: $COMMAND"

COMMON=(--benchmark mask_predict --data-bin "$DATA_BIN" --raw-ref "$RAW_REF"
        --src-lang "$SRC" --tgt-lang "$TGT" --threads "$THREADS"
        --latency-sentences "$LATENCY_SENTENCES" --out "$OUT" --command "$COMMAND")
[[ "$CUDA" == 1 ]] && COMMON+=(--cuda)

# train_stats PREFIX_UPDATES PREFIX_WALL LOG -> the --train-* options for one system
train_stats() {
    local updates="$1" wall="$2" log="$3"
    local out=()
    [[ -n "$updates" ]] && out+=(--train-updates "$updates")
    [[ -n "$wall" ]] && out+=(--train-wall-s "$wall")
    [[ -n "$log" && -f "$log" ]] && out+=(--train-log "$log")
    echo "${out[@]}"
}

bench() { echo "[mask_predict.sh] $*" >&2; "$PYTHON" -m fairseq_nat_ext.benchmark.run "$@"; }

# shellcheck disable=SC2046  # word splitting of train_stats is intended (no spaces in paths)
want teacher && bench "${COMMON[@]}" --system-ckpt "$TEACHER_CKPT" --no-distilled \
    --decoding beam=1 --decoding beam=5 $(train_stats "$TEACHER_UPDATES" "$TEACHER_WALL_S" "")
# shellcheck disable=SC2046
want mp && bench "${COMMON[@]}" --system-ckpt "$MP_CKPT" --distilled \
    --decoding iter=4,len_beam=3 --decoding iter=10,len_beam=3 \
    $(train_stats "$MP_UPDATES" "$MP_WALL_S" "$MP_TRAIN_LOG")
# shellcheck disable=SC2046
want cmlm && bench "${COMMON[@]}" --system-ckpt "$CMLM_CKPT" --distilled \
    --decoding iter=10,len_beam=3 $(train_stats "$CMLM_UPDATES" "$CMLM_WALL_S" "$CMLM_TRAIN_LOG")
want reference && bench "${COMMON[@]}" --reference-row

"$PYTHON" -m fairseq_nat_ext.benchmark.tables "$(dirname "$OUT")"/*.json
if [[ -f "$README" ]]; then
    "$PYTHON" -m fairseq_nat_ext.benchmark.tables "$(dirname "$OUT")"/*.json --update-readme "$README" \
        || echo "[mask_predict.sh] README not updated (see the error above)" >&2
else
    echo "[mask_predict.sh] $README not found: README not updated" >&2
fi
echo "[mask_predict.sh] done: $OUT" >&2
