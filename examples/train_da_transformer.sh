#!/usr/bin/env bash
# Train the Directed Acyclic Transformer (arch da_transformer, criterion dag_loss; Huang et al. 2022).
#
#   examples/train_da_transformer.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#
# Environment overrides: those of examples/lib/train_nat.sh (LAYERS DIM FFN HEADS DROPOUT LR WARMUP
# MAX_TOKENS MAX_UPDATE SEED THREADS SAVE_INTERVAL_UPDATES AVG INIT_FROM) plus RATIO=8
# (--dag-upsample-ratio: graph vertices per source token) and GLAT=START-END (glancing over the DAG's
# best path, the share of its wrong vertices revealed going linearly from START to END over MAX_UPDATE,
# default 0.5-0.1 as the paper; GLAT=0-0: off).  LABEL_SMOOTHING defaults to 0 here (the loss takes
# none).  Training pairs whose target (with <s> and </s>) has more tokens than the graph has vertices are
# filtered and counted: dag_filtered in the train.log lines.  Resumes from SAVE_DIR/checkpoint_last.pt;
# log SAVE_DIR/train.log; the averaged checkpoint is printed on the last line.  Decode with
# fairseq-generate ... --dag-decoder greedy|lookahead|viterbi|beam|sample.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 2 ]]; then sed -n '2,${/^#/!q;p;}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
EXTRA=("$@")
RATIO="${RATIO:-8}"
[[ "$RATIO" =~ ^[1-9][0-9]*$ ]] || { echo "error: RATIO must be an integer >= 1, got '$RATIO'" >&2; exit 1; }
# shellcheck source=lib/glancing.sh
source "$SCRIPT_DIR/lib/glancing.sh" 0.5-0.1
LABEL_SMOOTHING="${LABEL_SMOOTHING:-0}"
SYS=(--task nat_translation --arch da_transformer --criterion dag_loss)
NAT_EXTRA=(--dag-upsample-ratio "$RATIO" "${GLAT_ARGS[@]}")
# shellcheck source=lib/train_nat.sh
source "$SCRIPT_DIR/lib/train_nat.sh"
