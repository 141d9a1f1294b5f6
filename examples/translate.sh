#!/usr/bin/env bash
# Translate a split of a data-bin with any checkpoint (ours or fairseq's) and print sacreBLEU.
#
#   examples/translate.sh DATA_BIN CKPT [SPLIT] [options of fairseq-nat-translate]
#
# SPLIT defaults to test.  The generation options follow the checkpoint's arch (e.g. mask_predict:
# --iter-decode-max-iter 10 --iter-decode-with-beam 3; transformer: --beam 5; printed on stderr);
# override them with --beam N, --iter N, --len-beam N, --block N, --npd N ... or --decoding STRING.
# BPE is removed and the output Moses-detokenised; hypotheses go to --out (default
# <CKPT without .pt>.<SPLIT>.<TGT> beside the checkpoint); sacreBLEU (with its signature) is printed on
# stdout, scored against the untokenised reference --ref FILE, else DATA_BIN/../raw/<SPLIT>.<TGT>
# (written by prepare_data.sh, copied by distill.sh).  All options: fairseq-nat-translate --help
# (python -m fairseq_nat_ext.evaluation.translate).  THREADS=N sets torch's threads (default: all cores).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/.." && pwd)"
if [[ $# -lt 2 || "$1" == -h || "$1" == --help ]]; then
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
DATA_BIN="$1"; CKPT="$2"; shift 2
SPLIT=test
if [[ $# -gt 0 && "$1" != -* ]]; then SPLIT="$1"; shift; fi
# shellcheck source=lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${THREADS:-$(default_cores)}}"
PYTHON="${PYTHON:-python}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
# the repository's package first (works without `pip install`, and with it)
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m fairseq_nat_ext.evaluation.translate \
    "$DATA_BIN" "$CKPT" --split "$SPLIT" "$@"
