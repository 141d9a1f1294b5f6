#!/usr/bin/env bash
# Edit-based benchmark (Multi30K, test_2016_flickr): Levenshtein Transformer (ours vs fairseq's),
# Insertion Transformer (ours with binary-tree and uniform loss, fairseq's) and KERMIT in both
# directions from one checkpoint, measured by fairseq_nat_ext.benchmark.run with one protocol.
#
#   LEVT_CKPT=... FS_LEVT_CKPT=... INS_BT_CKPT=... INS_UNI_CKPT=... FS_INS_CKPT=... KERMIT_CKPT=... \
#   TRAIN_COMMAND="how they were trained (same data, size and updates)" \
#   bash examples/benchmark/edit_based.sh
#
# Rows written to $OUT (upserted; other rows are kept):
#   levenshtein                       iter=10                          distilled En->De
#   fairseq:levenshtein_transformer   iter=10                          distilled En->De
#   insertion                         iter=10,loss=binary_tree / loss=uniform, parallel decoding
#   fairseq:insertion_transformer     iter=10
#   kermit                            iter=10,dir=en-de and iter=10,dir=de-en (raw data; De->En is
#                                     scored against the raw English reference)
# then the README's results section is regenerated.
#
# Settings (environment):
#   DATA_BIN      distilled data-bin (default $REPO/runs/m30k_distill/data-bin)
#   RAW_DATA_BIN  raw data-bin for KERMIT (default $REPO/runs/m30k_prep/data-bin)
#   REF_DE, REF_EN raw references (default the shared test_2016_flickr.{de,en}.gz)
#   *_CKPT, *_TRAIN_LOG   checkpoints and their training logs (default $REPO/runs/<name>/...)
#   ITER          --iter-decode-max-iter for every system (default 10)
#   THREADS (2), LATENCY_SENTENCES (200), OUT (benchmarks/results/edit_based.json), README, CUDA=1
#   SYSTEMS       subset of "levt fs_levt ins_bt ins_uni fs_ins kermit" (default: all)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python; fi
fi
DATA_BIN="${DATA_BIN:-$REPO/runs/m30k_distill/data-bin}"
RAW_DATA_BIN="${RAW_DATA_BIN:-$REPO/runs/m30k_prep/data-bin}"
REF_DE="${REF_DE:-/work/shared/data/multi30k/test_2016_flickr.de.gz}"
REF_EN="${REF_EN:-/work/shared/data/multi30k/test_2016_flickr.en.gz}"
ITER="${ITER:-10}"
THREADS="${THREADS:-2}"
LATENCY_SENTENCES="${LATENCY_SENTENCES:-200}"
OUT="${OUT:-benchmarks/results/edit_based.json}"
README="${README:-README.md}"
CUDA="${CUDA:-0}"
SYSTEMS="${SYSTEMS:-levt fs_levt ins_bt ins_uni fs_ins kermit}"
want() { [[ " $SYSTEMS " == *" $1 "* ]]; }
die() { echo "error: $*" >&2; exit 1; }

declare -A CKPT LOG
for s in levt fs_levt ins_bt ins_uni fs_ins kermit; do
    up="$(echo "$s" | tr a-z A-Z)"
    var="${up}_CKPT"; CKPT[$s]="${!var:-$REPO/runs/$s/checkpoint_avg.pt}"
    var="${up}_TRAIN_LOG"; LOG[$s]="${!var:-$(dirname "${CKPT[$s]}")/train.log}"
    if want "$s"; then [[ -f "${CKPT[$s]}" ]] || die "checkpoint ${CKPT[$s]} not found (set ${up}_CKPT)"; fi
done
[[ -f "$REF_DE" ]] || die "REF_DE $REF_DE: no such file"

COMMAND="DATA_BIN=$DATA_BIN RAW_DATA_BIN=$RAW_DATA_BIN ITER=$ITER THREADS=$THREADS LATENCY_SENTENCES=$LATENCY_SENTENCES"
for s in $SYSTEMS; do COMMAND+=" $(echo "$s" | tr a-z A-Z)_CKPT=${CKPT[$s]}"; done
[[ "$CUDA" == 1 ]] && COMMAND+=" CUDA=1"
COMMAND+=" SYSTEMS='$SYSTEMS' bash examples/benchmark/edit_based.sh"
[[ -n "${TRAIN_COMMAND:-}" ]] && COMMAND="training: $TRAIN_COMMAND; benchmark: $COMMAND"

common() {  # common SRC TGT REF DATA
    local out=(--benchmark edit_based --data-bin "$4" --raw-ref "$3" --src-lang "$1" --tgt-lang "$2"
               --threads "$THREADS" --latency-sentences "$LATENCY_SENTENCES" --out "$OUT" --command "$COMMAND")
    [[ "$CUDA" == 1 ]] && out+=(--cuda)
    echo "${out[@]}"
}
log_opt() { [[ -f "$1" ]] && echo "--train-log $1" || true; }
bench() { echo "[edit_based.sh] $*" >&2; "$PYTHON" -m fairseq_nat_ext.benchmark.run "$@"; }

# shellcheck disable=SC2046  # word splitting intended (paths without spaces)
want levt && bench $(common en de "$REF_DE" "$DATA_BIN") --system-ckpt "${CKPT[levt]}" --distilled \
    --decoding "iter=$ITER" $(log_opt "${LOG[levt]}")
# shellcheck disable=SC2046
want fs_levt && bench $(common en de "$REF_DE" "$DATA_BIN") --system-ckpt "${CKPT[fs_levt]}" --distilled \
    --decoding "iter=$ITER" $(log_opt "${LOG[fs_levt]}")
# shellcheck disable=SC2046
want ins_bt && bench $(common en de "$REF_DE" "$DATA_BIN") --system-ckpt "${CKPT[ins_bt]}" --distilled \
    --decoding "iter=$ITER,loss=binary_tree" $(log_opt "${LOG[ins_bt]}")
# shellcheck disable=SC2046
want ins_uni && bench $(common en de "$REF_DE" "$DATA_BIN") --system-ckpt "${CKPT[ins_uni]}" --distilled \
    --decoding "iter=$ITER,loss=uniform" $(log_opt "${LOG[ins_uni]}")
# shellcheck disable=SC2046
want fs_ins && bench $(common en de "$REF_DE" "$DATA_BIN") --system-ckpt "${CKPT[fs_ins]}" --distilled \
    --decoding "iter=$ITER" $(log_opt "${LOG[fs_ins]}")
if want kermit; then
    [[ -f "$REF_EN" ]] || die "REF_EN $REF_EN: no such file"
    # shellcheck disable=SC2046
    bench $(common en de "$REF_DE" "$RAW_DATA_BIN") --system-ckpt "${CKPT[kermit]}" --no-distilled \
        --decoding "iter=$ITER,dir=en-de" $(log_opt "${LOG[kermit]}")
    # shellcheck disable=SC2046
    bench $(common de en "$REF_EN" "$RAW_DATA_BIN") --system-ckpt "${CKPT[kermit]}" --no-distilled \
        --decoding "iter=$ITER,dir=de-en" $(log_opt "${LOG[kermit]}")
fi

"$PYTHON" -m fairseq_nat_ext.benchmark.tables "$(dirname "$OUT")"/*.json
if [[ -f "$README" ]]; then
    "$PYTHON" -m fairseq_nat_ext.benchmark.tables "$(dirname "$OUT")"/*.json --update-readme "$README" \
        || echo "[edit_based.sh] README not updated (see the error above)" >&2
fi
echo "[edit_based.sh] done: $OUT" >&2
