#!/usr/bin/env bash
# Fertility NAT / noisy parallel decoding / iterative refinement benchmark (Multi30K En->De,
# test_2016_flickr), measured by fairseq_nat_ext.benchmark.run with one protocol.
#
# Usage (from anywhere; every setting has a default, override by environment variable):
#   DATA_BIN=$REPO/runs/m30k_distill/data-bin \
#   FERT_ALIGNER_CKPT=... FERT_ATTENTION_CKPT=... FERT_ALIGNER_RAW_CKPT=... FERT_ATTENTION_RAW_CKPT=... \
#   REFINE_CKPT=... FAIRSEQ_NAT_CKPT=... FAIRSEQ_ITER_CKPT=... \
#   bash examples/benchmark/fertility_refinement.sh
#
# Rows written to $OUT (upserted: other rows are kept):
#   fairseq:transformer   beam=1, beam=5                        the AR teacher (not distilled); it also
#                                                               scores the NPD candidates
#   nat_fertility         fertility=aligner,npd=1|10|100        distilled (FERT_ALIGNER_CKPT) and raw
#                         fertility=attention,npd=1|10|100      (FERT_*_RAW_CKPT, distilled=false)
#   iterative_refinement  iter=1, iter=2, iter=5, iter=10       distilled
#   fairseq:nonautoregressive_transformer            iter=0     distilled, one pass
#   fairseq:nonautoregressive_transformer   iter=0,len_beam=10,reranker=1   the same model with fairseq's
#                         own reranking path (--iter-decode-with-external-reranker: 10 length candidates
#                         rescored by TEACHER_CKPT, the last model of --path), the NPD speed baseline
#   fairseq:iterative_nonautoregressive_transformer  iter=10    distilled
#   reference             none
# Every row has its repeated-token rate (with/without distillation, with NPD).  npd=s decodes the
# argmax fertilities plus s-1 sampled ones in one batched pass and scores all candidates with
# TEACHER_CKPT in one teacher-forced pass (generation option npd_teacher).  Then the README's results
# section is regenerated from benchmarks/results/*.json and benchmarks/results/fertility_refinement.png
# redrawn.
#
# Settings:
#   DATA_BIN          data-bin with the test split (the distilled data-bin is fine: its test split is
#                     the original one); its dictionary must be the teacher's dict.txt.
#                     Default $REPO/runs/m30k_distill/data-bin
#   RAW_REF           raw reference of the test split (default the shared test_2016_flickr.de.gz)
#   SRC, TGT          languages (default en, de)
#   TEACHER_CKPT      default /work/shared/data/multi30k-teacher/teacher.pt
#   TEACHER_UPDATES   default: read from the checkpoint
#   TEACHER_WALL_S    default 5700 (the shared teacher's README; the checkpoint does not store it)
#   FERT_ALIGNER_CKPT, FERT_ATTENTION_CKPT          default $REPO/runs/fert_{aligner,attention}/checkpoint_avg.pt
#   FERT_ALIGNER_RAW_CKPT, FERT_ATTENTION_RAW_CKPT  default $REPO/runs/fert_{aligner,attention}_raw/checkpoint_avg.pt
#   REFINE_CKPT       default $REPO/runs/refine/checkpoint_avg.pt
#   FAIRSEQ_NAT_CKPT  default $REPO/runs/fairseq_nat/checkpoint_avg.pt
#   FAIRSEQ_ITER_CKPT default $REPO/runs/fairseq_iter/checkpoint_avg.pt
#   <SYS>_TRAIN_LOG, <SYS>_UPDATES, <SYS>_WALL_S  for SYS in FERT_ALIGNER FERT_ATTENTION
#                     FERT_ALIGNER_RAW FERT_ATTENTION_RAW REFINE FAIRSEQ_NAT FAIRSEQ_ITER (default log:
#                     the train.log next to the checkpoint when it exists, else the checkpoint).  A
#                     checkpoint fine-tuned with --fertility-reinforce (train_fertility.sh
#                     REINFORCE_UPDATES=N) counts only its fine-tuning updates: give <SYS>_UPDATES and
#                     <SYS>_WALL_S for both stages together, and REINFORCE_NOTE.
#   REINFORCE_NOTE    free text stating the REINFORCE fine-tuning budget of the fertility systems
#                     (e.g. "fert_aligner: 3000 + 500 REINFORCE updates"); written into the results'
#                     "data" field
#   NPD_SAMPLES       default "1 10 100"
#   RERANK_BEAM       length candidates of the fairseq_rerank row (default 10)
#   THREADS           torch threads, the same for every system (default 2)
#   LATENCY_SENTENCES batch-1 latency on the first N test sentences (default 200; 0 = all)
#   LIMIT             benchmark only the first N test sentences (smoke tests only; needs a RAW_REF
#                     of N lines or more -- the reference is cut to N lines as well)
#   OUT               default benchmarks/results/fertility_refinement.json (relative to the repo root)
#   README            default README.md (relative to the repo root)
#   CUDA=1            decode on CUDA when available (default: CPU)
#   TRAIN_COMMAND     how the systems were trained (same data and budget for ours and fairseq's),
#                     recorded in the results' "command"
#   SYSTEMS           which rows to (re)measure, default "teacher fert_aligner fert_attention
#                     fert_aligner_raw fert_attention_raw refine fairseq_nat fairseq_rerank fairseq_iter
#                     reference"
#   PYTHON            default: the repo's .venv/bin/python when present, else python
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
FERT_ALIGNER_CKPT="${FERT_ALIGNER_CKPT:-$REPO/runs/fert_aligner/checkpoint_avg.pt}"
FERT_ATTENTION_CKPT="${FERT_ATTENTION_CKPT:-$REPO/runs/fert_attention/checkpoint_avg.pt}"
FERT_ALIGNER_RAW_CKPT="${FERT_ALIGNER_RAW_CKPT:-$REPO/runs/fert_aligner_raw/checkpoint_avg.pt}"
FERT_ATTENTION_RAW_CKPT="${FERT_ATTENTION_RAW_CKPT:-$REPO/runs/fert_attention_raw/checkpoint_avg.pt}"
REFINE_CKPT="${REFINE_CKPT:-$REPO/runs/refine/checkpoint_avg.pt}"
FAIRSEQ_NAT_CKPT="${FAIRSEQ_NAT_CKPT:-$REPO/runs/fairseq_nat/checkpoint_avg.pt}"
FAIRSEQ_ITER_CKPT="${FAIRSEQ_ITER_CKPT:-$REPO/runs/fairseq_iter/checkpoint_avg.pt}"
REINFORCE_NOTE="${REINFORCE_NOTE:-}"
NPD_SAMPLES="${NPD_SAMPLES:-1 10 100}"
RERANK_BEAM="${RERANK_BEAM:-10}"
THREADS="${THREADS:-2}"
LATENCY_SENTENCES="${LATENCY_SENTENCES:-200}"
LIMIT="${LIMIT:-}"
OUT="${OUT:-benchmarks/results/fertility_refinement.json}"
README="${README:-README.md}"
CUDA="${CUDA:-0}"
ALL_SYSTEMS="teacher fert_aligner fert_attention fert_aligner_raw fert_attention_raw refine fairseq_nat fairseq_rerank fairseq_iter reference"
SYSTEMS="${SYSTEMS:-$ALL_SYSTEMS}"
want() { [[ " $SYSTEMS " == *" $1 "* ]]; }
die() { echo "error: $*" >&2; exit 1; }

# system -> variable prefix (fairseq_rerank is fairseq_nat's model with the teacher as reranker)
prefix() { if [[ "$1" == fairseq_rerank ]]; then echo FAIRSEQ_NAT; else echo "$1" | tr '[:lower:]' '[:upper:]'; fi; }
ckpt_of() { local v; v="$(prefix "$1")_CKPT"; echo "${!v}"; }

for s in $SYSTEMS; do
    [[ " $ALL_SYSTEMS " == *" $s "* ]] || die "SYSTEMS: unknown system '$s' ($ALL_SYSTEMS)"
done
for n in $NPD_SAMPLES; do [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "NPD_SAMPLES: '$n' is not a positive integer"; done
[[ "$RERANK_BEAM" =~ ^[1-9][0-9]*$ && "$RERANK_BEAM" -gt 1 ]] || die "RERANK_BEAM must be an integer >= 2, got '$RERANK_BEAM'"
[[ -d "$DATA_BIN" ]] || die "DATA_BIN $DATA_BIN: no such directory"
[[ -f "$RAW_REF" ]] || die "RAW_REF $RAW_REF: no such file"
[[ -z "$LIMIT" || "$LIMIT" =~ ^[1-9][0-9]*$ ]] || die "LIMIT must be a positive integer, got '$LIMIT'"
[[ -f "$TEACHER_CKPT" ]] || die "checkpoint $TEACHER_CKPT not found (set TEACHER_CKPT; the NPD rows need it too)"
for s in $SYSTEMS; do
    case "$s" in teacher|reference) continue ;; esac
    c="$(ckpt_of "$s")"
    [[ -f "$c" ]] || die "checkpoint $c not found (set $(prefix "$s")_CKPT, or leave $s out of SYSTEMS)"
done

# The command recorded in the results: this script with every setting spelled out.
COMMAND="DATA_BIN=$DATA_BIN RAW_REF=$RAW_REF TEACHER_CKPT=$TEACHER_CKPT TEACHER_WALL_S=$TEACHER_WALL_S"
[[ -n "$TEACHER_UPDATES" ]] && COMMAND+=" TEACHER_UPDATES=$TEACHER_UPDATES"
for s in $SYSTEMS; do
    case "$s" in teacher|reference|fairseq_rerank) continue ;; esac
    p="$(prefix "$s")"
    COMMAND+=" ${p}_CKPT=$(ckpt_of "$s")"
    for v in "${p}_UPDATES" "${p}_WALL_S"; do [[ -n "${!v:-}" ]] && COMMAND+=" $v=${!v}"; done
done
[[ " $SYSTEMS " == *" fairseq_rerank "* && " $SYSTEMS " != *" fairseq_nat "* ]] && COMMAND+=" FAIRSEQ_NAT_CKPT=$FAIRSEQ_NAT_CKPT"
COMMAND+=" NPD_SAMPLES='$NPD_SAMPLES' RERANK_BEAM=$RERANK_BEAM THREADS=$THREADS LATENCY_SENTENCES=$LATENCY_SENTENCES${LIMIT:+ LIMIT=$LIMIT}"
[[ "$CUDA" == 1 ]] && COMMAND+=" CUDA=1"
[[ "$SYSTEMS" != "$ALL_SYSTEMS" ]] && COMMAND+=" SYSTEMS='$SYSTEMS'"
COMMAND+=" bash examples/benchmark/fertility_refinement.sh"
[[ -n "${TRAIN_COMMAND:-}" ]] && COMMAND="training: $TRAIN_COMMAND; benchmark: $COMMAND"

DATA_NAME="$DATA_BIN [test, $SRC->$TGT], reference $RAW_REF${LIMIT:+ (first $LIMIT sentences)}"
DATA_NAME+="; NPD candidates scored by $TEACHER_CKPT"
[[ -n "$REINFORCE_NOTE" ]] && DATA_NAME+="; REINFORCE fine-tuning: $REINFORCE_NOTE"

bench() { echo "[fertility_refinement.sh] $*" >&2; "$PYTHON" -m fairseq_nat_ext.benchmark.run "$@"; }

COMMON=(--benchmark fertility_refinement --data-bin "$DATA_BIN" --raw-ref "$RAW_REF" --data-name "$DATA_NAME"
        --src-lang "$SRC" --tgt-lang "$TGT" --threads "$THREADS"
        --latency-sentences "$LATENCY_SENTENCES" --out "$OUT" --command "$COMMAND")
[[ -n "$LIMIT" ]] && COMMON+=(--limit "$LIMIT")
[[ "$CUDA" == 1 ]] && COMMON+=(--cuda)

# train_stats SYS -> the --train-* options of one system (explicit values, else its train.log)
train_stats() {
    local p updates wall log out=()
    p="$(prefix "$1")"
    updates="$(eval echo "\${${p}_UPDATES:-}")"; wall="$(eval echo "\${${p}_WALL_S:-}")"
    log="$(eval echo "\${${p}_TRAIN_LOG:-}")"
    [[ -z "$log" ]] && log="$(dirname "$(ckpt_of "$1")")/train.log"
    [[ -n "$updates" ]] && out+=(--train-updates "$updates")
    [[ -n "$wall" ]] && out+=(--train-wall-s "$wall")
    [[ -f "$log" ]] && out+=(--train-log "$log")
    echo "${out[@]}"
}

fertility_rows() {  # SYS LABEL DISTILLED(--distilled|--no-distilled)
    local decs=()
    for n in $NPD_SAMPLES; do decs+=(--decoding "fertility=$2,npd=$n"); done
    # shellcheck disable=SC2046  # word splitting of train_stats is intended (no spaces in paths)
    bench "${COMMON[@]}" --system-ckpt "$(ckpt_of "$1")" "$3" "${decs[@]}" \
        --generation-option "npd_teacher=$TEACHER_CKPT" $(train_stats "$1")
}

# shellcheck disable=SC2046
want teacher && bench "${COMMON[@]}" --system-ckpt "$TEACHER_CKPT" --no-distilled \
    --decoding beam=1 --decoding beam=5 \
    $( [[ -n "$TEACHER_UPDATES" ]] && echo --train-updates "$TEACHER_UPDATES" ) --train-wall-s "$TEACHER_WALL_S"
want fert_aligner && fertility_rows fert_aligner aligner --distilled
want fert_attention && fertility_rows fert_attention attention --distilled
want fert_aligner_raw && fertility_rows fert_aligner_raw aligner --no-distilled
want fert_attention_raw && fertility_rows fert_attention_raw attention --no-distilled
# shellcheck disable=SC2046
want refine && bench "${COMMON[@]}" --system-ckpt "$REFINE_CKPT" --distilled \
    --decoding iter=1 --decoding iter=2 --decoding iter=5 --decoding iter=10 $(train_stats refine)
# shellcheck disable=SC2046
want fairseq_nat && bench "${COMMON[@]}" --system-ckpt "$FAIRSEQ_NAT_CKPT" --distilled \
    --decoding iter=0 $(train_stats fairseq_nat)
# shellcheck disable=SC2046
want fairseq_rerank && bench "${COMMON[@]}" --system-ckpt "$FAIRSEQ_NAT_CKPT:$TEACHER_CKPT" --distilled \
    --decoding "iter=0,len_beam=$RERANK_BEAM,reranker=1" $(train_stats fairseq_rerank)
# shellcheck disable=SC2046
want fairseq_iter && bench "${COMMON[@]}" --system-ckpt "$FAIRSEQ_ITER_CKPT" --distilled \
    --decoding iter=10 $(train_stats fairseq_iter)
want reference && bench "${COMMON[@]}" --reference-row

"$PYTHON" -m fairseq_nat_ext.benchmark.tables "$(dirname "$OUT")"/*.json
if [[ -f "$README" ]]; then
    "$PYTHON" -m fairseq_nat_ext.benchmark.tables "$(dirname "$OUT")"/*.json --update-readme "$README" \
        || echo "[fertility_refinement.sh] README not updated (see the error above)" >&2
else
    echo "[fertility_refinement.sh] $README not found: README not updated" >&2
fi
echo "[fertility_refinement.sh] done: $OUT" >&2
