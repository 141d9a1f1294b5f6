#!/usr/bin/env bash
# The NAT leaderboard (Multi30K En->De, test_2016_flickr, valid and three unseen test sets): every
# non-autoregressive method of the plugin and fairseq's built-ins trained by its own recipe at ONE budget
# (the recipes' defaults: MAX_UPDATE=1000 updates at MAX_TOKENS=4096, LR=1e-3, WARMUP=400, the last 5
# checkpoints averaged), initialised from the shared teacher where the arch allows it, measured with one
# protocol against the teacher measured in the same run.
#
#   bash examples/benchmark/nat_leaderboard.sh train ROW            # train (resumes when rerun)
#   bash examples/benchmark/nat_leaderboard.sh measure ROW...       # decode + time (teacher rows first)
#   bash examples/benchmark/nat_leaderboard.sh ROW...               # both, row by row
#   bash examples/benchmark/nat_leaderboard.sh list                 # the rows and their recipes
#
# Rows (ROW: recipe, decodings):
#   teacher        the shared AT teacher (no training here)         beam=1, beam=5
#   ctc            train_ctc.sh                                     beam=1 (greedy), beam=5 (prefix beam)
#   imputer        train_imputer.sh CTC_CKPT=<this table's ctc>     block=2, block=4
#   mask_predict   train_mask_predict.sh                            iter=4,len_beam=3  iter=10,len_beam=3
#   cmlm           IMPL=fairseq train_mask_predict.sh               iter=3,...,force=1  iter=9,...,force=1 (4, 10 passes)
#   levenshtein    train_levenshtein.sh                             iter=10,rollin=paper
#   fs_levenshtein IMPL=fairseq train_levenshtein.sh                iter=9,rollin=fairseq (10 rounds)
#   insertion      train_insertion.sh                               iter=10,loss=binary_tree
#   fs_insertion   IMPL=fairseq LOSS=binary_tree train_insertion.sh iter=9,loss=binary_tree (same tau, 10 rounds)
#   kermit         train_kermit.sh (raw data, as its recipe says)   iter=10,dir=en-de
#   refinement     train_refinement.sh                              iter=10
#   fs_refinement  IMPL=fairseq train_refinement.sh                 iter=9 (10 passes)
#   fertility      train_fertility.sh                               NPD 1, NPD 10 (teacher-ranked)
#   fs_nat         IMPL=fairseq train_fertility.sh                  iter=0; iter=0,len_beam=5,reranker=1
#   da_transformer train_da_transformer.sh (GLAT 0.5-0.1)           decoder=lookahead, decoder=viterbi
#   dat_raw        the same on the raw (not distilled) data          the same
#   ctc_raw        train_ctc.sh on the raw data (dat_raw's baseline) beam=1, beam=5
#   glat           train_glat.sh (GLAT 0.5-0.3)                     len_beam=3 (one pass)
#   glat_ctc       GLAT=0.5-0.3 train_ctc.sh (GLAT+CTC)             beam=1, beam=5
# fairseq's IterativeRefinementGenerator runs --iter-decode-max-iter T as T + 1 decoder passes (rounds,
# for the edit-based models: its steps count from 0); the plugin's generators run T. So fairseq's rows
# decode with T - 1 against ours with T: the same number of passes (the decoder passes column shows it).
# A row's seed is SEED (default 1): its checkpoint lives in $RUNS/leaderboard/<ROW>_s<SEED>/ and a
# seed other than 1 is a row of its own (the spread of the table).
#
# Settings (environment):
#   RUNS          where data, checkpoints and logs live, outside the repository if you like (default
#                 $REPO/runs): $RUNS/m30k (raw data-bin), $RUNS/m30k_distill (distilled), made by
#                 examples/prepare_data.sh and examples/distill.sh when missing
#   SEED          training seed (default 1)
#   TRAINED_ON    the machine the row's training ran on (default: this one; say so when it was a GPU)
#   RUN_ID        id of this measuring run (default: the UTC time)
#   the shared ones of examples/benchmark/lib.sh (TEACHER_CKPT, THREADS, LATENCY_SENTENCES, LIMIT (smoke
#   tests: the valid and unseen sets are cut too), CUDA, OUT (default benchmarks/results/nat_leaderboard.json;
#   the chart is drawn beside it), DOCS (all: regenerate the docs and the README's table; none: not))
# Hypotheses: benchmarks/results/nat_leaderboard/<row file>.txt, and for the unseen test sets
# benchmarks/results/nat_leaderboard/blind/<row file>.<set>.txt (one line per source line).
set -euo pipefail
NAME=nat_leaderboard
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
RUNS="${RUNS:-$REPO/runs}"
SEED="${SEED:-1}"
[[ "$SEED" =~ ^[0-9]+$ ]] || die "SEED must be a non-negative integer, got '$SEED'"
RUN_ID="${RUN_ID:-$(date -u +%Y%m%dT%H%M%SZ)}"
TEACHER_DIR="$(dirname "$TEACHER_CKPT")"
RAW_BIN="$RUNS/m30k/data-bin"
DISTILL_BIN="$RUNS/m30k_distill/data-bin"
LB="$RUNS/leaderboard"
VALID_REF="$SHARED/data/multi30k/val.de.gz"
BLIND_DIR="$SHARED/data/blind"
BLIND_SETS=(test_2017_flickr test_2017_mscoco test_2018_flickr)
PY_BIN="$(dirname "$PYTHON")"
[[ "$PY_BIN" == . ]] || export PATH="$PY_BIN:$PATH"

ROWS=(teacher ctc imputer mask_predict cmlm levenshtein fs_levenshtein insertion fs_insertion kermit
      refinement fs_refinement fertility fs_nat da_transformer dat_raw ctc_raw glat glat_ctc)

spec() {  # spec ROW -> RECIPE, ENVS (array), DECODINGS (array), INIT, DATA (distill|raw), CKPT, GENOPTS, PATHS
    RECIPE=""; ENVS=(); DECODINGS=(); INIT="teacher"; DATA=distill; GENOPTS=(); SUFFIX=""
    case "$1" in
        teacher) DECODINGS=(beam=1 beam=5); INIT=scratch; DATA=raw ;;
        ctc) RECIPE=train_ctc.sh; DECODINGS=(beam=1 beam=5) ;;
        imputer) RECIPE=train_imputer.sh; ENVS=("CTC_CKPT=$LB/ctc_s$SEED/checkpoint_avg.pt")
                 DECODINGS=(block=2 block=4); INIT="this table's ctc_nat (seed $SEED)" ;;
        mask_predict) RECIPE=train_mask_predict.sh; DECODINGS=(iter=4,len_beam=3 iter=10,len_beam=3) ;;
        cmlm) RECIPE=train_mask_predict.sh; ENVS=(IMPL=fairseq)  # fairseq's iter=T: T + 1 passes (see above)
              DECODINGS=(iter=3,len_beam=3,force=1 iter=9,len_beam=3,force=1) ;;
        levenshtein) RECIPE=train_levenshtein.sh; DECODINGS=(iter=10,rollin=paper) ;;
        fs_levenshtein) RECIPE=train_levenshtein.sh; ENVS=(IMPL=fairseq); DECODINGS=(iter=9,rollin=fairseq) ;;
        insertion) RECIPE=train_insertion.sh; DECODINGS=(iter=10,loss=binary_tree) ;;
        fs_insertion) RECIPE=train_insertion.sh; ENVS=(IMPL=fairseq LOSS=binary_tree)
                      DECODINGS=(iter=9,loss=binary_tree) ;;
        kermit) RECIPE=train_kermit.sh; DATA=raw; DECODINGS=(iter=10,dir=en-de) ;;
        refinement) RECIPE=train_refinement.sh; DECODINGS=(iter=10) ;;
        fs_refinement) RECIPE=train_refinement.sh; ENVS=(IMPL=fairseq); DECODINGS=(iter=9) ;;
        fertility) RECIPE=train_fertility.sh; GENOPTS=(--generation-option "npd_teacher=$TEACHER_CKPT")
                   DECODINGS=(fertility=aligner,npd=1,rank=total fertility=aligner,npd=10,rank=total) ;;
        fs_nat) RECIPE=train_fertility.sh; ENVS=(IMPL=fairseq); DECODINGS=(iter=0 iter=0,len_beam=5,reranker=1) ;;
        da_transformer) RECIPE=train_da_transformer.sh; DECODINGS=(glat=0.5-0.1,decoder=lookahead glat=0.5-0.1,decoder=viterbi) ;;
        dat_raw) RECIPE=train_da_transformer.sh; DATA=raw; DECODINGS=(glat=0.5-0.1,decoder=lookahead glat=0.5-0.1,decoder=viterbi) ;;
        ctc_raw) RECIPE=train_ctc.sh; DATA=raw; DECODINGS=(beam=1 beam=5) ;;
        glat) RECIPE=train_glat.sh; DECODINGS=(glat=0.5-0.3,len_beam=3) ;;
        glat_ctc) RECIPE=train_ctc.sh; ENVS=(GLAT=0.5-0.3); DECODINGS=(glat=0.5-0.3,beam=1 glat=0.5-0.3,beam=5) ;;
        *) die "unknown row '$1' (rows: ${ROWS[*]})" ;;
    esac
    SAVE="$LB/${1}_s$SEED"
    if [[ "$1" == teacher ]]; then CKPT="$TEACHER_CKPT"; else CKPT="$SAVE/checkpoint_avg.pt"; fi
    if [[ "$DATA" == raw ]]; then TRAIN_BIN="$RAW_BIN"; else TRAIN_BIN="$DISTILL_BIN"; fi
    [[ "$INIT" == teacher ]] && ENVS+=("INIT_FROM=$TEACHER_CKPT")
    ENVS+=("SEED=$SEED")
    return 0
}

prepare_data() {  # the raw and distilled data-bins (skipped when present), the unseen test sets
    if [[ ! -f "$RAW_BIN/dict.en.txt" ]]; then
        bash "$REPO/examples/prepare_data.sh" "$SHARED/data/multi30k" en de "$RUNS/m30k" \
            --codes "$TEACHER_DIR/bpe.codes" --srcdict "$TEACHER_DIR/dict.txt" >&2
    fi
    if [[ ! -f "$DISTILL_BIN/dict.en.txt" ]]; then
        bash "$REPO/examples/distill.sh" "$RAW_BIN" - "$RUNS/m30k_distill" \
            --distilled "$TEACHER_DIR/train.distill.de.bpe.gz" >&2
    fi
}

prepare_blind() {  # $LB/data-bin: DATA's files linked, plus the unseen test sets as source-only subsets
    local bin="$1" out="$2" b="$LB/blind" s n i=0 args=()
    mkdir -p "$b/raw" "$b/tok" "$b/bpe" "$out"
    for s in "${BLIND_SETS[@]}"; do
        [[ -f "$BLIND_DIR/$s.en.gz" ]] || die "$BLIND_DIR/$s.en.gz: no such file (the unseen test sets)"
        if [[ ! -s "$b/bpe/$s.en" ]]; then
            gzip -dc "$BLIND_DIR/$s.en.gz" > "$b/raw/$s.en"
            "$PYTHON" "$REPO/fairseq_nat_ext/data/moses_tokenize.py" -j 1 en "$b/raw/$s.en" "$b/tok/$s.en" >&2
            fast applybpe "$b/bpe/$s.en.tmp" "$b/tok/$s.en" "$TEACHER_DIR/bpe.codes" >/dev/null 2>&1 \
                || die "fast applybpe failed on $b/tok/$s.en"
            mv "$b/bpe/$s.en.tmp" "$b/bpe/$s.en"
        fi
        args+=("$b/bpe/$s")
    done
    if [[ ! -f "$b/bin/test.en-de.en.idx" ]]; then
        fairseq-preprocess --only-source --source-lang en --target-lang de --srcdict "$bin/dict.en.txt" \
            --testpref "$(IFS=,; echo "${args[*]}")" --destdir "$b/bin" --workers 1 > "$b/preprocess.log" 2>&1 \
            || die "fairseq-preprocess of the unseen test sets failed (log: $b/preprocess.log)"
    fi
    for f in "$bin"/*; do ln -sfn "$f" "$out/"; done
    for s in "${BLIND_SETS[@]}"; do
        n=test; if ((i > 0)); then n+="$i"; fi
        for e in bin idx; do ln -sfn "$b/bin/$n.en-de.en.$e" "$out/$s.en-de.en.$e"; done
        i=$((i + 1))
    done
}

train_row() {
    spec "$1"
    [[ -n "$RECIPE" ]] || { echo "[nat_leaderboard] $1: nothing to train" >&2; return 0; }
    if [[ "$1" == imputer && ! -f "$LB/ctc_s$SEED/checkpoint_avg.pt" ]]; then
        die "imputer learns the alignments of this table's CTC model: train ctc (SEED=$SEED) first"
    fi
    mkdir -p "$SAVE"
    echo "[nat_leaderboard] training $1: ${ENVS[*]} examples/$RECIPE $TRAIN_BIN $SAVE" >&2
    env "${ENVS[@]}" bash "$REPO/examples/$RECIPE" "$TRAIN_BIN" "$SAVE" > "$SAVE.out" 2>&1 \
        || { tail -n 20 "$SAVE.out" >&2; die "training $1 failed (log: $SAVE.out, $SAVE/train.log)"; }
    [[ -f "$CKPT" ]] || die "training $1 left no $CKPT"
}

row_command() {  # the commands that reproduce one row (training, then this script's measuring)
    local t="" seed=""  # the teacher is not trained here: no seed of this script's applies to it
    [[ -n "$RECIPE" ]] && t="${ENVS[*]} examples/$RECIPE $TRAIN_BIN $SAVE; " && seed="SEED=$SEED "
    echo "${t}${seed}RUNS=$RUNS bash examples/benchmark/$NAME.sh measure $1"
}

measure_row() {
    local row="$1" bin stats=() distilled=--distilled tag=""
    spec "$row"
    [[ -f "$CKPT" ]] || die "$row: checkpoint $CKPT not found (bash examples/benchmark/$NAME.sh train $row)"
    [[ "$DATA" == raw ]] && distilled=--no-distilled
    bin="$LB/data-bin-$DATA"
    if [[ "$DATA" == raw ]]; then prepare_blind "$RAW_BIN" "$bin"; else prepare_blind "$DISTILL_BIN" "$bin"; fi
    if [[ "$row" == teacher ]]; then
        stats=(--train-updates "${TEACHER_UPDATES:-1300}" --train-wall-s "$TEACHER_WALL_S" --train-seed 1
               --train-max-tokens 4096)
    else
        stats=(--train-log "$SAVE/train.log")
    fi
    local decs=() d
    for d in "${DECODINGS[@]}"; do
        if [[ "$row" == fs_nat && "$d" == *reranker=1* ]]; then continue; fi
        decs+=(--decoding "$d")
    done
    bench "${HARNESS[@]}" --data-bin "$bin" --raw-ref "$RAW_REF" --src-lang "$SRC" --tgt-lang "$TGT" \
        --data-name "$DATA_NAME" --system-ckpt "$CKPT" "$distilled" "${decs[@]}" ${GENOPTS[@]+"${GENOPTS[@]}"} \
        "${stats[@]}" --leaderboard --valid-raw-ref "$VALID_REF" "${BLIND_ARGS[@]}" --run-id "$RUN_ID" \
        --init "$INIT" --trained-on "$TRAINED_ON" --row-command "$(row_command "$row")"
    if [[ "$row" == fs_nat ]]; then  # the length beam rescored by the teacher: the teacher is the last model
        bench "${HARNESS[@]}" --data-bin "$bin" --raw-ref "$RAW_REF" --src-lang "$SRC" --tgt-lang "$TGT" \
            --data-name "$DATA_NAME" --system-ckpt "$CKPT:$TEACHER_CKPT" --system fairseq:nonautoregressive_transformer \
            "$distilled" --decoding "iter=0,len_beam=5,reranker=1" "${stats[@]}" --leaderboard \
            --valid-raw-ref "$VALID_REF" "${BLIND_ARGS[@]}" --run-id "$RUN_ID" --init "$INIT" \
            --trained-on "$TRAINED_ON" --row-command "$(row_command "$row")"
    fi
}

MODE=both
case "${1:-}" in
    train|measure) MODE="$1"; shift ;;
    list) for r in "${ROWS[@]}"; do spec "$r"; printf '%-15s %-24s %s\n' "$r" "${RECIPE:--}" "${DECODINGS[*]}"; done; exit 0 ;;
    ""|-h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2 ;;
esac
[[ $# -ge 1 ]] || die "name the rows (${ROWS[*]})"
for r in "$@"; do spec "$r"; done  # unknown rows fail before anything runs
[[ "$MODE" == train && $# -ne 1 ]] && die "train one row at a time (one training at a time on a small machine)"

prepare_data
COMMAND="RUNS=$RUNS SEED=$SEED RUN_ID=$RUN_ID"
finish_command
COMMAND="$COMMAND measure ROW... (each row names its own training and measuring commands)"
harness_options
DATA_NAME="Multi30K En->De test_2016_flickr (reference $RAW_REF${LIMIT:+, first $LIMIT sentences}); valid: val (reference $VALID_REF); unseen test sets without references: ${BLIND_SETS[*]}; distilled rows trained on $DISTILL_BIN (filtered), raw rows on $RAW_BIN"
TRAINED_ON="${TRAINED_ON:-$("$PYTHON" -c 'from fairseq_nat_ext.evaluation.provenance import hardware_description as h; print(h())')}"
BLIND_ARGS=()
for s in "${BLIND_SETS[@]}"; do BLIND_ARGS+=(--blind "$s"); done

if [[ "$MODE" != measure ]]; then
    for r in "$@"; do train_row "$r"; done
fi
if [[ "$MODE" != train ]]; then
    measure_row teacher  # the speed baseline of this run, measured first
    for r in "$@"; do [[ "$r" == teacher ]] || measure_row "$r"; done
    "$PYTHON" -m benchmarks.leaderboard "$OUT" --chart "${OUT%.json}.png" >&2 \
        || echo "[$NAME] chart not drawn (see above)" >&2
    if [[ "$DOCS" == all ]]; then "$PYTHON" -m benchmarks.tables --update-all >&2; fi
fi
