#!/usr/bin/env bash
# Train ONE autoregressive fairseq `transformer` on every direction of a multilingual data-bin, the
# standard multilingual recipe (Johnson et al. 2017): fairseq's `translation_multi_simple_epoch` task,
# a target-language tag __TGT__ prepended to every source (--encoder-langtok tgt), all directions
# sampled in proportion to their size, one shared dictionary and embeddings.
#
#   examples/train_multilingual_transformer.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#
# DATA_BIN: examples/prepare_multilingual.sh's data-bin.  LANG_PAIRS (default en-de,en-fr,de-fr) are
# trained in both directions.  Every other setting is examples/train_teacher.sh's (LAYERS, DIM, MAX_UPDATE,
# MAX_TOKENS, LR, WARMUP, SAVE_INTERVAL_UPDATES, AVG, THREADS, ...; resumes likewise).
# Decoding one direction (here fr->de):
#   fairseq-generate DATA_BIN --user-dir fairseq_nat_ext --task translation_multi_simple_epoch \
#       --lang-pairs $(examples/train_multilingual_transformer.sh --directions) --encoder-langtok tgt \
#       -s fr -t de --path CKPT --beam 5 --remove-bpe
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LANG_PAIRS="${LANG_PAIRS:-en-de,en-fr,de-fr}"
directions() {  # en-de,en-fr -> en-de,de-en,en-fr,fr-en
    local p out=() a b
    IFS=, read -r -a P <<<"$LANG_PAIRS"
    for p in "${P[@]}"; do
        [[ "$p" =~ ^[a-z_]+-[a-z_]+$ ]] || { echo "error: LANG_PAIRS: '$p' is not a pair like en-de" >&2; exit 1; }
        a="${p%-*}"; b="${p#*-}"; out+=("$a-$b" "$b-$a")
    done
    (IFS=,; echo "${out[*]}")
}
if [[ "${1:-}" == --directions ]]; then directions; exit 0; fi
if [[ $# -lt 2 || "$1" == -h || "$1" == --help ]]; then
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
DIRS="$(directions)"
exec bash "$SCRIPT_DIR/train_teacher.sh" "$DATA_BIN" "$SAVE_DIR" \
    --task translation_multi_simple_epoch --lang-pairs "$DIRS" --encoder-langtok tgt \
    --sampling-method temperature --sampling-temperature 1 "$@"
