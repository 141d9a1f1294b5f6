#!/usr/bin/env bash
# Train KERMIT (arch kermit, task kermit): one stack over <s> x </s> y </s>, five training modes.
#
#   examples/train_kermit.sh DATA_BIN SAVE_DIR [extra fairseq-train args...]
#
# DATA_BIN: a RAW (not distilled) parallel corpus with a joined dictionary, e.g. runs/m30k/data-bin;
# SRC/TGT (default en/de) name its languages: SRC becomes segment x.  MODES (default
# joint:1,x2y:1,y2x:1,x:1,y:1) weights p(x,y), p(y|x), p(x|y), p(x), p(y); TAU (default 1.0, 0 = uniform)
# is the balanced-binary-tree temperature.  LAYERS defaults to 6 (one stack = the 3+3 models' depth);
# INIT_FROM=AT.pt starts the stack from a 3+3 AT Transformer (encoder layers, then decoder layers).
# Other overrides: those of examples/lib/train_nat.sh.  Resumes from SAVE_DIR/checkpoint_last.pt.
# Multilingual: LANG_PAIRS=en-de,en-fr,de-fr (a data-bin of examples/prepare_multilingual.sh) trains one
# model over every pair (no SRC/TGT); decode any direction with --lang-pairs and -s/-t, e.g.
#   fairseq-generate DATA_BIN --user-dir fairseq_nat_ext --task kermit --lang-pairs en-de,en-fr,de-fr \
#       -s fr -t de --path CKPT
# Decoding both directions from the checkpoint:
#   fairseq-generate DATA_BIN --user-dir fairseq_nat_ext --task kermit -s en -t de --path CKPT
#   fairseq-generate DATA_BIN --user-dir fairseq_nat_ext --task kermit -s de -t en --path CKPT
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 2 ]]; then sed -n '2,${/^#/!q;p;}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
DATA_BIN="$1"; SAVE_DIR="$2"; shift 2
EXTRA=("$@")
LAYERS="${LAYERS:-6}"
ENCODER_ONLY=1
if [[ -n "${LANG_PAIRS:-}" ]]; then DIRS=(--lang-pairs "$LANG_PAIRS"); else DIRS=(-s "${SRC:-en}" -t "${TGT:-de}"); fi
SYS=(--task kermit "${DIRS[@]}" --arch kermit --criterion kermit_loss
     --kermit-modes "${MODES:-joint:1,x2y:1,y2x:1,x:1,y:1}" --insertion-tau "${TAU:-1.0}")
NAT_EXTRA=()
# shellcheck source=lib/train_nat.sh
source "$SCRIPT_DIR/lib/train_nat.sh"
