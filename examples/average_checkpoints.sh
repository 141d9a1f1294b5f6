#!/usr/bin/env bash
# Average the model parameters of the last N checkpoints of a fairseq run.
#
#   examples/average_checkpoints.sh SAVE_DIR N OUT.pt [--kind auto|epoch|update] [--keep-optimizer-state]
#
# --kind auto (default): checkpoint_E_U.pt (update) and checkpointE.pt (epoch) files together, ordered by
# their number of updates (fairseq writes an epoch checkpoint instead of the update one when an interval
# ends at an epoch end); the last N are averaged (python -m fairseq_nat_ext.checkpoint_average, which
# loads through fairseq's load_checkpoint_to_cpu with this package's compat active).
# Fewer than N checkpoints: one-line error, exit 1.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -lt 3 ]]; then
    sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
PYTHON="${PYTHON:-python}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
mkdir -p "$(dirname "$3")"
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m fairseq_nat_ext.checkpoint_average "$@"
