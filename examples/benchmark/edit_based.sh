#!/usr/bin/env bash
# Edit-based benchmark (Multi30K, test_2016_flickr): Levenshtein Transformer (ours vs fairseq's),
# Insertion Transformer (ours with binary-tree and uniform loss, fairseq's) and KERMIT in both
# directions from one checkpoint, measured by fairseq_nat_ext.evaluation.run with one protocol.
#
#   LEVT_CKPT=... FS_LEVT_CKPT=... INS_BT_CKPT=... INS_UNI_CKPT=... FS_INS_CKPT=... KERMIT_CKPT=... \
#   TRAIN_COMMAND="how they were trained (same data, size and updates)" \
#   bash examples/benchmark/edit_based.sh
#
# Rows written to $OUT (upserted; other rows are kept):
#   levenshtein                       iter=10,rollin=paper (LEVT_ROLLIN)  distilled En->De
#   fairseq:levenshtein_transformer   iter=10,rollin=fairseq              distilled En->De
#   insertion                         iter=10,loss=binary_tree / loss=uniform, parallel decoding;
#                                     iter=10,loss=binary_tree,softmax=joint (ins_joint: trained with
#                                     --insertion-softmax joint, Stern et al.'s p(content, slot))
#   fairseq:insertion_transformer     iter=10,loss=uniform (fs_ins: --label-tau unset, uniform weights);
#                                     iter=10,loss=binary_tree (fs_ins_bt: trained with --label-tau)
#   kermit                            iter=10,dir=en-de and iter=10,dir=de-en (raw data; De->En is
#                                     scored against the raw English reference)
# then the results section of docs/benchmarks.md is regenerated (and edit_based.png redrawn).
#
# Settings (environment; the shared ones -- DATA_BIN (distilled), RAW_REF (German reference), THREADS,
# LATENCY_SENTENCES, LIMIT, OUT, DOCS, CUDA, TRAIN_COMMAND -- are listed in examples/benchmark/lib.sh):
#   RAW_DATA_BIN  raw data-bin for KERMIT (default $REPO/runs/m30k/data-bin)
#   REF_EN        raw English reference for De->En (default the shared test_2016_flickr.en.gz)
#   <SYS>_CKPT, <SYS>_TRAIN_LOG, <SYS>_UPDATES, <SYS>_WALL_S  (default $REPO/runs/<sys>/checkpoint_avg.pt
#                 and the train.log beside it) for SYS in LEVT FS_LEVT INS_BT INS_UNI FS_INS FS_INS_BT INS_JOINT
#                 KERMIT
#   ITER          --iter-decode-max-iter for every system (default 10)
#   LEVT_ROLLIN   the roll-in our LevT checkpoint was trained with (--levt-rollin; default paper; checked)
#   KERMIT_EOS_PENALTY_EN_DE, KERMIT_EOS_PENALTY_DE_EN  --iter-decode-eos-penalty of KERMIT's rows (default:
#                 none; choose them on the validation split with fairseq_nat_ext.evaluation.tune_eos_penalty)
#   SYSTEMS       subset of "levt fs_levt ins_bt ins_uni fs_ins fs_ins_bt ins_joint kermit" (default: levt
#                 fs_levt ins_bt ins_uni fs_ins); kermit (raw data) only alone, into its own table
#                 (BENCHMARK_NAME=edit_based_kermit SYSTEMS=kermit)
set -euo pipefail
NAME=edit_based
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
RAW_DATA_BIN="${RAW_DATA_BIN:-$REPO/runs/m30k/data-bin}"
REF_EN="${REF_EN:-$SHARED/data/multi30k/test_2016_flickr.en.gz}"
ITER="${ITER:-10}"
LEVT_ROLLIN="${LEVT_ROLLIN:-paper}"
ALL_SYSTEMS="levt fs_levt ins_bt ins_uni fs_ins fs_ins_bt ins_joint kermit"
SYSTEMS="${SYSTEMS:-levt fs_levt ins_bt ins_uni fs_ins}"
# shellcheck disable=SC2086  # a list
check_systems $ALL_SYSTEMS
separate_table kermit "measure KERMIT (raw data) alone, e.g. BENCHMARK_NAME=edit_based_kermit SYSTEMS=kermit"
for s in $ALL_SYSTEMS; do  # default checkpoints: runs/<system>/checkpoint_avg.pt
    v="$(ckpt_var "$s")"; printf -v "$v" '%s' "${!v:-$REPO/runs/$s/checkpoint_avg.pt}"
done
# shellcheck disable=SC2086
need_ckpts $ALL_SYSTEMS
[[ -f "$RAW_REF" ]] || die "RAW_REF $RAW_REF: no such file"
want kermit && { [[ -f "$REF_EN" ]] || die "REF_EN $REF_EN: no such file"; }

COMMAND="DATA_BIN=$DATA_BIN RAW_DATA_BIN=$RAW_DATA_BIN ITER=$ITER"
for s in $SYSTEMS; do COMMAND+="$(command_settings "$(echo "$s" | tr '[:lower:]' '[:upper:]')")"; done
for v in KERMIT_EOS_PENALTY_EN_DE KERMIT_EOS_PENALTY_DE_EN; do
    if want kermit && [[ -n "${!v:-}" ]]; then COMMAND+=" $v=${!v}"; fi
done
if want levt; then COMMAND+=" LEVT_ROLLIN=$LEVT_ROLLIN"; fi
COMMAND+=" SYSTEMS='$SYSTEMS'"
finish_command
harness_options

# one 'data' line for the whole file (each call would otherwise describe only its own data-bin)
DATA_NAME="$DATA_BIN [test, en->de], reference $RAW_REF${LIMIT:+ (first $LIMIT sentences)}"
want kermit && DATA_NAME+="; kermit: $RAW_DATA_BIN (raw) [test, en->de and de->en], references $RAW_REF and $REF_EN"

row() {  # row SYSTEM SRC TGT REF DATA_BIN DISTILLED DECODING
    local p
    p="$(echo "$1" | tr '[:lower:]' '[:upper:]')"
    local ckpt="${p}_CKPT"
    # shellcheck disable=SC2046  # word splitting of train_stats is intended (no spaces in paths)
    bench "${HARNESS[@]}" --data-bin "$5" --raw-ref "$4" --src-lang "$2" --tgt-lang "$3" --data-name "$DATA_NAME" \
        --system-ckpt "${!ckpt}" "$6" --decoding "$7" $(train_stats "$p")
}

want levt && row levt en de "$RAW_REF" "$DATA_BIN" --distilled "iter=$ITER,rollin=$LEVT_ROLLIN"
want fs_levt && row fs_levt en de "$RAW_REF" "$DATA_BIN" --distilled "iter=$ITER,rollin=fairseq"
want ins_bt && row ins_bt en de "$RAW_REF" "$DATA_BIN" --distilled "iter=$ITER,loss=binary_tree"
want ins_uni && row ins_uni en de "$RAW_REF" "$DATA_BIN" --distilled "iter=$ITER,loss=uniform"
want fs_ins && row fs_ins en de "$RAW_REF" "$DATA_BIN" --distilled "iter=$ITER,loss=uniform"
want fs_ins_bt && row fs_ins_bt en de "$RAW_REF" "$DATA_BIN" --distilled "iter=$ITER,loss=binary_tree"
want ins_joint && row ins_joint en de "$RAW_REF" "$DATA_BIN" --distilled "iter=$ITER,loss=binary_tree,softmax=joint"
if want kermit; then  # one checkpoint, both directions, raw data
    pen_en_de="${KERMIT_EOS_PENALTY_EN_DE:+,eos_penalty=$KERMIT_EOS_PENALTY_EN_DE}"
    pen_de_en="${KERMIT_EOS_PENALTY_DE_EN:+,eos_penalty=$KERMIT_EOS_PENALTY_DE_EN}"
    row kermit en de "$RAW_REF" "$RAW_DATA_BIN" --no-distilled "iter=$ITER${pen_en_de},dir=en-de"
    row kermit de en "$REF_EN" "$RAW_DATA_BIN" --no-distilled "iter=$ITER${pen_de_en},dir=de-en"
fi
update_tables
