#!/usr/bin/env bash
# Mask-Predict benchmark (Multi30K En->De, test_2016_flickr): teacher vs. our mask_predict vs.
# fairseq's cmlm_transformer, measured by fairseq_nat_ext.evaluation.run with one protocol.
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
#   mask_predict              iter=10,len_beam=3        (adaptive stopping = loop detection)
#   fairseq:cmlm_transformer  iter=10,len_beam=3        fairseq's CMLM, distilled data, adaptive
#                                                       stopping (no --iter-decode-force-max-iter)
#   reference                 none                      the reference's own repeat rate
# then the results section of docs/benchmarks.md (between <!-- results:begin --> and <!-- results:end -->)
# is regenerated from benchmarks/results/*.json and benchmarks/results/mask_predict.png redrawn.
#
# Every decoding of our model is first scored on the valid split (--valid-tune ->
# benchmarks/results/mask_predict/valid_tune.json); MP_DECODINGS (space-separated) overrides the
# list, e.g. "iter=10,len_beam=3 iter=10,len_beam=5 iter=10,len_beam=3,force=1".  MP_VALID_TUNE=0
# skips that step when valid_tune.json already holds these decodings of this checkpoint (e.g. scored
# earlier with `python -m fairseq_nat_ext.evaluation.run --valid-only ...` while another job ran).
# TEACHER_DECODINGS (default "beam=1 beam=5") and CMLM_DECODINGS (default "iter=10,len_beam=3") do the
# same for the other two systems, e.g. "... iter=10,len_beam=3,dedup=1" (dedup=1: consecutive repeated
# tokens collapsed, the same function for every system).
# Settings (environment; the shared ones -- DATA_BIN, RAW_REF, SRC/TGT, TEACHER_*, THREADS,
# LATENCY_SENTENCES, LIMIT, OUT, DOCS, CUDA, TRAIN_COMMAND -- are listed in examples/benchmark/lib.sh):
#   MP_CKPT           default $REPO/runs/mp_ours/checkpoint_avg.pt
#   CMLM_CKPT         default $REPO/runs/cmlm/checkpoint_avg.pt
#   <SYS>_TRAIN_LOG   default train.log beside the checkpoint (used when it exists)
#   <SYS>_UPDATES, <SYS>_WALL_S   explicit values (else the log, else the checkpoint); SYS = MP, CMLM
#   SYSTEMS           which rows to (re)measure, default "teacher mp cmlm reference"; other rows of
#                     $OUT are kept (e.g. measure the teacher and ours while the CMLM still trains)
# The run takes a while on CPU (the teacher's beam search dominates); latencies are only meaningful
# on an otherwise idle machine (the harness warns when the load average says it is not).
set -euo pipefail
NAME=mask_predict
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
MP_CKPT="${MP_CKPT:-$REPO/runs/mp_ours/checkpoint_avg.pt}"
CMLM_CKPT="${CMLM_CKPT:-$REPO/runs/cmlm/checkpoint_avg.pt}"
SYSTEMS="${SYSTEMS:-teacher mp cmlm reference}"
check_systems teacher mp cmlm reference
[[ -d "$DATA_BIN" ]] || die "DATA_BIN $DATA_BIN: no such directory"
[[ -f "$RAW_REF" ]] || die "RAW_REF $RAW_REF: no such file"
need_ckpts teacher mp cmlm

# The command recorded in the results: this script with every setting spelled out.
COMMAND="DATA_BIN=$DATA_BIN RAW_REF=$RAW_REF$(wanted_settings teacher mp cmlm)"
for v in MP_DECODINGS TEACHER_DECODINGS CMLM_DECODINGS MP_VALID_TUNE; do
  [[ -n "${!v:-}" ]] && COMMAND+=" $v='${!v}'"
done
MP_DECODINGS="${MP_DECODINGS:-iter=4,len_beam=3 iter=10,len_beam=3}"
TEACHER_DECODINGS="${TEACHER_DECODINGS:-beam=1 beam=5}"
CMLM_DECODINGS="${CMLM_DECODINGS:-iter=10,len_beam=3}"
MP_TUNE=(--valid-tune); [[ "${MP_VALID_TUNE:-1}" == 0 ]] && MP_TUNE=()
decoding_flags() { local d; for d in $1; do printf -- '--decoding %s ' "$d"; done; }
[[ "$SYSTEMS" != "teacher mp cmlm reference" ]] && COMMAND+=" SYSTEMS='$SYSTEMS'"
finish_command
harness_options
COMMON=("${HARNESS[@]}" --data-bin "$DATA_BIN" --raw-ref "$RAW_REF" --src-lang "$SRC" --tgt-lang "$TGT")

# shellcheck disable=SC2046  # word splitting of train_stats is intended (no spaces in paths)
want teacher && bench "${COMMON[@]}" --system-ckpt "$TEACHER_CKPT" --no-distilled \
    $(decoding_flags "$TEACHER_DECODINGS") $(train_stats TEACHER)
# shellcheck disable=SC2046
want mp && bench "${COMMON[@]}" --system-ckpt "$MP_CKPT" --distilled ${MP_TUNE[@]+"${MP_TUNE[@]}"} \
    $(decoding_flags "$MP_DECODINGS") $(train_stats MP)
# shellcheck disable=SC2046
want cmlm && bench "${COMMON[@]}" --system-ckpt "$CMLM_CKPT" --distilled \
    $(decoding_flags "$CMLM_DECODINGS") $(train_stats CMLM)
want reference && bench "${COMMON[@]}" --reference-row
update_tables
