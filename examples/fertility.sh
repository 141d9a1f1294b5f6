#!/usr/bin/env bash
# Write fertility files (OUT_DIR/{train,valid}.fert + OUT_DIR/method) for a data-bin: the
# fertility NAT's supervision (task option --fertility-path OUT_DIR).  Decoding needs no fertility
# file: no test split is aligned (a test split in SPLITS is refused).
#
#   examples/fertility.sh DATA_BIN OUT_DIR aligner              # eflomal word alignments -> BPE pieces
#   examples/fertility.sh DATA_BIN OUT_DIR attention TEACHER.pt # the AT teacher's cross-attention
#
# aligner: eflomal (pip install eflomal==2.0.0; `make venv` installs it) aligns the BPE-removed
# lines of the train and valid splits together (never the test references); every target word's
# pieces go to its aligned source word, spread over that word's pieces (rule:
# fairseq_nat_ext/oracles/fertility.py).  attention: one teacher-forced pass of TEACHER.pt (same
# dictionary); each target token counts for the source token it attends to most.  The data-bin's
# own targets are used (distilled ones for a distilled data-bin).
# Environment: SRC/TGT (default: the data-bin's only language pair), SPLITS=train,valid (missing
# ones are skipped; test* splits are refused), CPU=1 (attention without CUDA), ALIGNMENT_LAYER
# (attention; default the last), PYTHON (default python).  Skips the work when OUT_DIR already
# holds train.fert (delete it to redo; a kept aligner directory with test fertilities, made before
# test splits were refused, is reported as leaking).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/.." && pwd)"
if [[ $# -lt 3 ]]; then sed -n '2,${/^#/!q;p;}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
DATA_BIN="$1"; OUT_DIR="$2"; METHOD="$3"; TEACHER="${4:-}"
[[ -d "$DATA_BIN" ]] || { echo "error: DATA_BIN $DATA_BIN is not a directory" >&2; exit 1; }
case "$METHOD" in
  aligner) ARGS=() ;;
  attention)
    [[ -f "$TEACHER" ]] || { echo "error: attention needs the teacher checkpoint as 4th argument (got '$TEACHER')" >&2; exit 1; }
    ARGS=(--teacher "$TEACHER")
    [[ "${CPU:-0}" == 1 ]] && ARGS+=(--cpu)
    [[ -n "${ALIGNMENT_LAYER:-}" ]] && ARGS+=(--alignment-layer "$ALIGNMENT_LAYER") ;;
  *) echo "error: METHOD must be aligner or attention, got '$METHOD'" >&2; exit 1 ;;
esac
if [[ -f "$OUT_DIR/train.fert" ]]; then
  echo "[fertility.sh] $OUT_DIR/train.fert exists: kept ($(head -n 1 "$OUT_DIR/method" 2>/dev/null || echo '?'))" >&2
  if compgen -G "$OUT_DIR/test*.fert" >/dev/null && [[ "$(head -c 7 "$OUT_DIR/method" 2>/dev/null)" == aligner ]]; then
    echo "[fertility.sh] WARNING: $OUT_DIR holds test fertilities: it was made by a version that aligned the test" \
         "references together with train (a test-set leak in the training fertilities); delete $OUT_DIR to redo it" >&2
  fi
  exit 0
fi
mkdir -p "$OUT_DIR"
[[ -n "${SRC:-}" ]] && ARGS+=(-s "$SRC")
[[ -n "${TGT:-}" ]] && ARGS+=(-t "$TGT")
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python}" -m fairseq_nat_ext.data.make_fertility \
  --data-bin "$DATA_BIN" --out "$OUT_DIR" --method "$METHOD" --splits "${SPLITS:-train,valid}" ${ARGS[@]+"${ARGS[@]}"}
