#!/usr/bin/env bash
# Fertility NAT / noisy parallel decoding / iterative refinement benchmark (Multi30K En->De,
# test_2016_flickr), measured by fairseq_nat_ext.evaluation.run with one protocol.
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
#   nat_fertility         fertility=aligner,npd=1|10|100,rank=R distilled (FERT_ALIGNER_CKPT) and raw
#                         fertility=attention,npd=1|10|100,rank=R  (FERT_*_RAW_CKPT, distilled=false)
#   iterative_refinement  iter=1, iter=2, iter=5, iter=10       distilled
#   fairseq:nonautoregressive_transformer            iter=0     distilled, one pass
#   fairseq:nonautoregressive_transformer   iter=0,len_beam=10,reranker=1   the same model with fairseq's
#                         own reranking path (--iter-decode-with-external-reranker: 10 length candidates
#                         rescored by TEACHER_CKPT, the last model of --path), the NPD speed baseline
#   fairseq:iterative_nonautoregressive_transformer  iter=10    distilled
#   reference             none
# Every row has its repeated-token rate (with/without distillation, with NPD).  npd=s decodes the
# argmax fertilities plus s-1 sampled ones in one batched pass and scores all candidates with
# TEACHER_CKPT in one teacher-forced pass (generation option npd_teacher).  Then docs/benchmarks.md's results
# section is regenerated from benchmarks/results/*.json and benchmarks/results/fertility_refinement.png
# redrawn.
#
# Settings (environment; the shared ones -- DATA_BIN, RAW_REF, SRC/TGT, TEACHER_* (it also scores the
# NPD candidates), THREADS, LATENCY_SENTENCES, LIMIT, OUT, DOCS, CUDA, TRAIN_COMMAND -- are listed in
# examples/benchmark/lib.sh):
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
#   NPD_RANKS         NPD rankings, default "total" (the paper's; "total mean" measures both)
#   RERANK_BEAM       length candidates of the fairseq_rerank row (default 10)
#   SYSTEMS           which rows to (re)measure, default "teacher fert_aligner fert_attention refine
#                     fairseq_nat fairseq_rerank fairseq_iter reference"; fert_aligner_raw and
#                     fert_attention_raw (raw data) only without the distilled systems, into their own
#                     table (BENCHMARK_NAME=fertility_refinement_raw)
set -euo pipefail
NAME=fertility_refinement
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
FERT_ALIGNER_CKPT="${FERT_ALIGNER_CKPT:-$REPO/runs/fert_aligner/checkpoint_avg.pt}"
FERT_ATTENTION_CKPT="${FERT_ATTENTION_CKPT:-$REPO/runs/fert_attention/checkpoint_avg.pt}"
FERT_ALIGNER_RAW_CKPT="${FERT_ALIGNER_RAW_CKPT:-$REPO/runs/fert_aligner_raw/checkpoint_avg.pt}"
FERT_ATTENTION_RAW_CKPT="${FERT_ATTENTION_RAW_CKPT:-$REPO/runs/fert_attention_raw/checkpoint_avg.pt}"
REFINE_CKPT="${REFINE_CKPT:-$REPO/runs/refine/checkpoint_avg.pt}"
FAIRSEQ_NAT_CKPT="${FAIRSEQ_NAT_CKPT:-$REPO/runs/fairseq_nat/checkpoint_avg.pt}"
FAIRSEQ_ITER_CKPT="${FAIRSEQ_ITER_CKPT:-$REPO/runs/fairseq_iter/checkpoint_avg.pt}"
REINFORCE_NOTE="${REINFORCE_NOTE:-}"
NPD_SAMPLES="${NPD_SAMPLES:-1 10 100}"
NPD_RANKS="${NPD_RANKS:-total}"
RERANK_BEAM="${RERANK_BEAM:-10}"
ALL_SYSTEMS="teacher fert_aligner fert_attention fert_aligner_raw fert_attention_raw refine fairseq_nat fairseq_rerank fairseq_iter reference"
DEFAULT_SYSTEMS="teacher fert_aligner fert_attention refine fairseq_nat fairseq_rerank fairseq_iter reference"
SYSTEMS="${SYSTEMS:-$DEFAULT_SYSTEMS}"
# shellcheck disable=SC2086  # a list
check_systems $ALL_SYSTEMS
separate_table "fert_aligner_raw fert_attention_raw" "measure the raw-data models in their own table, e.g. BENCHMARK_NAME=fertility_refinement_raw SYSTEMS='teacher fert_aligner_raw fert_attention_raw reference'"

# system -> variable prefix (fairseq_rerank is fairseq_nat's model with the teacher as reranker)
prefix() { if [[ "$1" == fairseq_rerank ]]; then echo FAIRSEQ_NAT; else echo "$1" | tr '[:lower:]' '[:upper:]'; fi; }
ckpt_of() { local v; v="$(prefix "$1")_CKPT"; echo "${!v}"; }

for n in $NPD_SAMPLES; do [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "NPD_SAMPLES: '$n' is not a positive integer"; done
for r in $NPD_RANKS; do [[ "$r" == total || "$r" == mean ]] || die "NPD_RANKS: '$r' is not total or mean"; done
[[ "$RERANK_BEAM" =~ ^[1-9][0-9]*$ && "$RERANK_BEAM" -gt 1 ]] || die "RERANK_BEAM must be an integer >= 2, got '$RERANK_BEAM'"
[[ -d "$DATA_BIN" ]] || die "DATA_BIN $DATA_BIN: no such directory"
[[ -f "$RAW_REF" ]] || die "RAW_REF $RAW_REF: no such file"
[[ -f "$TEACHER_CKPT" ]] || die "checkpoint $TEACHER_CKPT not found (set TEACHER_CKPT; the NPD rows need it too)"
for s in $SYSTEMS; do
    case "$s" in teacher|reference) continue ;; esac
    c="$(ckpt_of "$s")"
    [[ -f "$c" ]] || die "checkpoint $c not found (set $(prefix "$s")_CKPT, or leave $s out of SYSTEMS)"
done

# The command recorded in the results: this script with every setting spelled out.
COMMAND="DATA_BIN=$DATA_BIN RAW_REF=$RAW_REF$(command_settings TEACHER)"
for s in $SYSTEMS; do
    case "$s" in teacher|reference|fairseq_rerank) continue ;; esac
    COMMAND+="$(command_settings "$(prefix "$s")")"
done
[[ " $SYSTEMS " == *" fairseq_rerank "* && " $SYSTEMS " != *" fairseq_nat "* ]] && COMMAND+=" FAIRSEQ_NAT_CKPT=$FAIRSEQ_NAT_CKPT"
COMMAND+=" NPD_SAMPLES='$NPD_SAMPLES' NPD_RANKS='$NPD_RANKS' RERANK_BEAM=$RERANK_BEAM"
[[ "$SYSTEMS" != "$DEFAULT_SYSTEMS" ]] && COMMAND+=" SYSTEMS='$SYSTEMS'"
finish_command

DATA_NAME="$DATA_BIN [test, $SRC->$TGT], reference $RAW_REF${LIMIT:+ (first $LIMIT sentences)}"
DATA_NAME+="; NPD candidates scored by $TEACHER_CKPT"
[[ -n "$REINFORCE_NOTE" ]] && DATA_NAME+="; REINFORCE fine-tuning: $REINFORCE_NOTE"

harness_options
COMMON=("${HARNESS[@]}" --data-bin "$DATA_BIN" --raw-ref "$RAW_REF" --data-name "$DATA_NAME"
        --src-lang "$SRC" --tgt-lang "$TGT")

fertility_rows() {  # SYS LABEL DISTILLED(--distilled|--no-distilled)
    local decs=()
    for n in $NPD_SAMPLES; do
        for r in $NPD_RANKS; do decs+=(--decoding "fertility=$2,npd=$n,rank=$r"); done
    done
    # shellcheck disable=SC2046  # word splitting of train_stats is intended (no spaces in paths)
    bench "${COMMON[@]}" --system-ckpt "$(ckpt_of "$1")" "$3" "${decs[@]}" \
        --generation-option "npd_teacher=$TEACHER_CKPT" $(train_stats "$(prefix "$1")")
}

# shellcheck disable=SC2046
want teacher && bench "${COMMON[@]}" --system-ckpt "$TEACHER_CKPT" --no-distilled \
    --decoding beam=1 --decoding beam=5 $(train_stats TEACHER)
want fert_aligner && fertility_rows fert_aligner aligner --distilled
want fert_attention && fertility_rows fert_attention attention --distilled
want fert_aligner_raw && fertility_rows fert_aligner_raw aligner --no-distilled
want fert_attention_raw && fertility_rows fert_attention_raw attention --no-distilled
# shellcheck disable=SC2046
want refine && bench "${COMMON[@]}" --system-ckpt "$REFINE_CKPT" --distilled \
    --decoding iter=1 --decoding iter=2 --decoding iter=5 --decoding iter=10 $(train_stats REFINE)
# shellcheck disable=SC2046
want fairseq_nat && bench "${COMMON[@]}" --system-ckpt "$FAIRSEQ_NAT_CKPT" --distilled \
    --decoding iter=0 $(train_stats FAIRSEQ_NAT)
# shellcheck disable=SC2046
want fairseq_rerank && bench "${COMMON[@]}" --system-ckpt "$FAIRSEQ_NAT_CKPT:$TEACHER_CKPT" --distilled \
    --decoding "iter=0,len_beam=$RERANK_BEAM,reranker=1" $(train_stats FAIRSEQ_NAT)
# shellcheck disable=SC2046
want fairseq_iter && bench "${COMMON[@]}" --system-ckpt "$FAIRSEQ_ITER_CKPT" --distilled \
    --decoding iter=10 $(train_stats FAIRSEQ_ITER)
want reference && bench "${COMMON[@]}" --reference-row
update_tables
