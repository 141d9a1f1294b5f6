#!/usr/bin/env bash
# Multilingual benchmark (Multi30K English-German-French, test_2016_flickr): ONE multilingual KERMIT
# checkpoint against ONE multilingual autoregressive Transformer (fairseq's translation_multi_simple_epoch,
# target-language tag), every one of the six directions, measured by fairseq_nat_ext.evaluation.run with
# one protocol plus a language check of every output (py3langid among en/de/fr).
#
#   KERMIT_CKPT=... TRANSFORMER_CKPT=... TRAIN_COMMAND="how both were trained (same data and budget)" \
#   bash examples/benchmark/multilingual.sh
#
# Rows written to $OUT (benchmarks/results/multilingual.json; upserted, other rows kept):
#   kermit               iter=$ITER,dir=SRC-TGT          (parallel insertion decoding)
#   fairseq:transformer  beam=1,dir=SRC-TGT and beam=5,dir=SRC-TGT
# each with wrong_language_rate and mixed_language_rate (fairseq_nat_ext/evaluation/language_id.py);
# then the results section of docs/benchmarks.md is regenerated (and multilingual.png redrawn).
#
# Settings (environment; the shared ones -- THREADS, LATENCY_SENTENCES, LIMIT, OUT, DOCS, CUDA,
# TRAIN_COMMAND -- are listed in examples/benchmark/lib.sh):
#   ML_DATA_BIN   examples/prepare_multilingual.sh's data-bin (default $REPO/runs/m30k_multi/data-bin)
#   LANG_PAIRS    the pairs both models were trained on (default en-de,en-fr,de-fr; all their directions)
#   REF_DIR       raw references test_2016_flickr.L.gz (default the shared Multi30K folder)
#   <SYS>_CKPT, <SYS>_TRAIN_LOG, <SYS>_UPDATES, <SYS>_WALL_S   for SYS in KERMIT TRANSFORMER (default
#                 $REPO/runs/kermit_multi/checkpoint_avg.pt, $REPO/runs/transformer_multi/checkpoint_avg.pt)
#   ITER          KERMIT's --iter-decode-max-iter (default 10);  BEAMS  the Transformer's beams (default "1 5")
#   KERMIT_EOS_PENALTY  KERMIT's --iter-decode-eos-penalty, one for every direction (default: none; choose
#                 it on the validation split with fairseq_nat_ext.evaluation.tune_eos_penalty)
#   DIRECTIONS    a subset of the directions, e.g. "fr-de de-fr" (default: all of LANG_PAIRS, both ways)
#   SYSTEMS       subset of "kermit transformer" (default: both)
set -euo pipefail
NAME=multilingual
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ML_DATA_BIN="${ML_DATA_BIN:-$REPO/runs/m30k_multi/data-bin}"
LANG_PAIRS="${LANG_PAIRS:-en-de,en-fr,de-fr}"
REF_DIR="${REF_DIR:-$SHARED/data/multi30k}"
ITER="${ITER:-10}"
BEAMS="${BEAMS:-1 5}"
ALL_SYSTEMS="kermit transformer"
SYSTEMS="${SYSTEMS:-$ALL_SYSTEMS}"
# shellcheck disable=SC2086  # a list
check_systems $ALL_SYSTEMS
KERMIT_CKPT="${KERMIT_CKPT:-$REPO/runs/kermit_multi/checkpoint_avg.pt}"
TRANSFORMER_CKPT="${TRANSFORMER_CKPT:-$REPO/runs/transformer_multi/checkpoint_avg.pt}"
# shellcheck disable=SC2086
need_ckpts $ALL_SYSTEMS
[[ -d "$ML_DATA_BIN" ]] || die "ML_DATA_BIN $ML_DATA_BIN: no such folder (make it with examples/prepare_multilingual.sh)"
ALL_DIRS="$(LANG_PAIRS="$LANG_PAIRS" bash "$REPO/examples/train_multilingual_transformer.sh" --directions | tr , ' ')"
DIRECTIONS="${DIRECTIONS:-$ALL_DIRS}"
LANGS="$(echo "$ALL_DIRS" | tr ' -' '\n\n' | awk '!seen[$0]++' | paste -sd,)"
for d in $DIRECTIONS; do
    [[ " $ALL_DIRS " == *" $d "* ]] || die "DIRECTIONS: '$d' is not a direction of LANG_PAIRS $LANG_PAIRS ($ALL_DIRS)"
    ref="$REF_DIR/test_2016_flickr.${d#*-}.gz"; [[ -f "$ref" ]] || die "reference $ref: no such file (set REF_DIR)"
done

KERMIT_EOS_PENALTY="${KERMIT_EOS_PENALTY:-}"
COMMAND="ML_DATA_BIN=$ML_DATA_BIN LANG_PAIRS=$LANG_PAIRS REF_DIR=$REF_DIR ITER=$ITER BEAMS='$BEAMS'"
[[ -n "$KERMIT_EOS_PENALTY" ]] && COMMAND+=" KERMIT_EOS_PENALTY=$KERMIT_EOS_PENALTY"
for s in $SYSTEMS; do COMMAND+="$(command_settings "$(echo "$s" | tr '[:lower:]' '[:upper:]')")"; done
[[ "$DIRECTIONS" != "$ALL_DIRS" ]] && COMMAND+=" DIRECTIONS='$DIRECTIONS'"
COMMAND+=" SYSTEMS='$SYSTEMS'"
finish_command
harness_options
DATA_NAME="$ML_DATA_BIN [test, $(echo $DIRECTIONS | tr ' ' ,)], references $REF_DIR/test_2016_flickr.L.gz${LIMIT:+ (first $LIMIT sentences)}"

row() {  # row SYSTEM DIRECTION DECODING [extra harness options...]
    local p s="$1" d="$2" dec="$3"; shift 3
    p="$(echo "$s" | tr '[:lower:]' '[:upper:]')"
    local ckpt="${p}_CKPT"
    # shellcheck disable=SC2046  # word splitting of train_stats is intended (no spaces in paths)
    bench "${HARNESS[@]}" --data-bin "$ML_DATA_BIN" --raw-ref "$REF_DIR/test_2016_flickr.${d#*-}.gz" \
        --src-lang "${d%-*}" --tgt-lang "${d#*-}" --data-name "$DATA_NAME" --language-check "$LANGS" \
        --system-ckpt "${!ckpt}" --no-distilled --decoding "$dec,dir=$d" $(train_stats "$p") "$@"
}

for d in $DIRECTIONS; do
    want kermit && row kermit "$d" "iter=$ITER${KERMIT_EOS_PENALTY:+,eos_penalty=$KERMIT_EOS_PENALTY}"
    if want transformer; then
        for b in $BEAMS; do row transformer "$d" "beam=$b"; done
    fi
done
update_tables
