#!/usr/bin/env bash
# Sequence-level knowledge distillation: replace the training targets by a teacher's outputs.
#
#   examples/distill.sh DATA_BIN TEACHER_CKPT OUT_DIR [options] [-- extra fairseq-generate args]
#
# Options:
#   --beam N            beam size (default 5)
#   --max-tokens N      fairseq-generate batch size in tokens (default 8000)
#   --distilled FILE    use this already-distilled train target (BPE form, line-aligned with
#                       DATA_BIN's train source; plain or .gz, e.g.
#                       multi30k-teacher/train.distill.de.bpe.gz) instead of generating;
#                       TEACHER_CKPT is then only recorded (may be "-")
#   --src L --tgt L     language pair; default: the only pair of DATA_BIN/train.L1-L2.*.idx
#   --workers N         fairseq-preprocess workers (default $WORKERS or the core count)
#   --force             regenerate even when OUT_DIR/train.distill.TGT is up to date
#   --max-repeat N      drop a pair whose distilled target repeats one token more than N times
#                       in a row (a looping teacher; default 2, 0 keeps them)
#   --max-len A,B       drop a pair whose distilled target is longer than A * source + B tokens
#                       (default 2,10; off keeps them)
#
# Steps: fairseq-generate DATA_BIN --path TEACHER --gen-subset train --beam 5 --max-tokens 8000
# (--user-dir <repo>/fairseq_nat_ext, --num-workers 0, --required-batch-size-multiple 1: with
# fairseq's default of 8, batch_by_size silently drops the last batch when its size is not a
# multiple of 8, fairseq issue #5036) -> OUT_DIR/generate-train.txt; the H-
# lines are put back in the original order by sentence id -> OUT_DIR/train.distill.TGT (BPE
# form), which must have exactly as many lines as DATA_BIN's train source.  It is binarised
# with DATA_BIN's target dictionary (fairseq-preprocess --only-source --srcdict), so token ids
# are compatible with the teacher's joined dictionary.
#
# Output OUT_DIR/data-bin: a fairseq data directory whose train target is the distilled text;
# the train source, valid, test and the dictionaries are copies of DATA_BIN's files.
# The binarised pairs then go through fairseq_nat_ext/data/distill_filter.py (--max-repeat,
# --max-len): OUT_DIR/train.distill.TGT keeps every line, the training split drops the teacher's
# degenerate outputs (both sides, order kept).
# OUT_DIR/data-bin/DISTILL_INFO.txt records the teacher, beam, source of the targets and the filter.
# OUT_DIR/raw/{valid,test}.{SRC,TGT}: copies of DATA_BIN/../raw's untokenised valid and test files (written
# by prepare_data.sh), the references of examples/translate.sh.
# Progress (sentences translated of the total, rate) goes to stderr every PROGRESS_INTERVAL seconds
# (default 30), counted from the H- lines of OUT_DIR/generate-train.txt.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/.." && pwd)"
USER_DIR="$REPO/fairseq_nat_ext"
UTILS="$REPO/fairseq_nat_ext/data/distill_utils.py"
PYTHON="${PYTHON:-python}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

log() { echo "[distill] $*" >&2; }
die() { echo "error: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }

POSITIONAL=()
BEAM=5
MAX_TOKENS=8000
DISTILLED=""
SRC=""
TGT=""
# shellcheck source=lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"
WORKERS="${WORKERS:-$(default_cores)}"
FORCE=0
MAX_REPEAT=2
MAX_LEN="2,10"
GEN_EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --beam) BEAM="${2:?--beam needs a value}"; shift 2 ;;
        --max-tokens) MAX_TOKENS="${2:?--max-tokens needs a value}"; shift 2 ;;
        --distilled) DISTILLED="${2:?--distilled needs a file}"; shift 2 ;;
        --src) SRC="${2:?--src needs a language}"; shift 2 ;;
        --tgt) TGT="${2:?--tgt needs a language}"; shift 2 ;;
        --workers) WORKERS="${2:?--workers needs a value}"; shift 2 ;;
        --force) FORCE=1; shift ;;
        --max-repeat) MAX_REPEAT="${2:?--max-repeat needs a value}"; shift 2 ;;
        --max-len) MAX_LEN="${2:?--max-len needs A,B or off}"; shift 2 ;;
        -h|--help) usage 0 ;;
        --) shift; GEN_EXTRA=("$@"); break ;;
        --*) die "unknown option $1 (see --help)" ;;
        *) POSITIONAL+=("$1"); shift ;;
    esac
done
[[ ${#POSITIONAL[@]} -eq 3 ]] || usage 2
DATA_BIN="${POSITIONAL[0]}"; TEACHER="${POSITIONAL[1]}"; OUT_DIR="${POSITIONAL[2]}"
[[ "$BEAM" =~ ^[1-9][0-9]*$ ]] || die "--beam must be a positive integer"
[[ "$MAX_TOKENS" =~ ^[1-9][0-9]*$ ]] || die "--max-tokens must be a positive integer"
[[ "$MAX_REPEAT" =~ ^[0-9]+$ ]] || die "--max-repeat must be a non-negative integer, got '$MAX_REPEAT'"
[[ "$MAX_LEN" == off || "$MAX_LEN" =~ ^[0-9.]+,[0-9.]+$ ]] || die "--max-len must be A,B or off, got '$MAX_LEN'"
[[ -d "$DATA_BIN" ]] || die "DATA_BIN $DATA_BIN is not a directory"
DATA_BIN="$(cd "$DATA_BIN" && pwd)"

# ---- language pair ------------------------------------------------------------------
if [[ -z "$SRC" || -z "$TGT" ]]; then
    mapfile -t PAIRS < <(cd "$DATA_BIN" && ls train.*-*.*.idx 2>/dev/null \
        | sed -E 's/^train\.([^.]+)-([^.]+)\..*$/\1 \2/' | sort -u)
    [[ ${#PAIRS[@]} -eq 1 ]] || die "cannot tell the language pair from $DATA_BIN/train.*.idx (${#PAIRS[@]} found): pass --src and --tgt"
    read -r SRC TGT <<<"${PAIRS[0]}"
fi
for f in "dict.$SRC.txt" "dict.$TGT.txt" "train.$SRC-$TGT.$SRC.idx" "train.$SRC-$TGT.$SRC.bin"; do
    [[ -f "$DATA_BIN/$f" ]] || die "$DATA_BIN/$f: no such file"
done
N_SRC="$("$PYTHON" "$UTILS" count "$DATA_BIN" train "$SRC" "$TGT" "$SRC")"
log "$DATA_BIN: $SRC -> $TGT, $N_SRC training sentences"

mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
DISTILL_TXT="$OUT_DIR/train.distill.$TGT"

# ---- distilled targets --------------------------------------------------------------
if [[ -n "$DISTILLED" ]]; then
    [[ -f "$DISTILLED" ]] || die "--distilled $DISTILLED: no such file"
    log "using already-distilled targets $DISTILLED"
    "$PYTHON" "$UTILS" import "$DISTILLED" "$N_SRC" "$DISTILL_TXT"
    ORIGIN="file $(cd "$(dirname "$DISTILLED")" && pwd)/$(basename "$DISTILLED")"
else
    [[ -f "$TEACHER" ]] || die "teacher checkpoint $TEACHER: no such file"
    command -v fairseq-generate >/dev/null 2>&1 || die "fairseq-generate not found on PATH (activate .venv)"
    STAMP="$OUT_DIR/.generate.params"
    PARAMS="teacher=$(cd "$(dirname "$TEACHER")" && pwd)/$(basename "$TEACHER") beam=$BEAM data=$DATA_BIN extra=${GEN_EXTRA[*]:-}"
    if [[ $FORCE -eq 0 && -f "$DISTILL_TXT" && -f "$STAMP" && "$(cat "$STAMP")" == "$PARAMS" \
          && "$DISTILL_TXT" -nt "$TEACHER" && "$DISTILL_TXT" -nt "$DATA_BIN/train.$SRC-$TGT.$SRC.bin" ]]; then
        log "$DISTILL_TXT is up to date (use --force to regenerate)"
    else
        rm -f "$STAMP"
        log "translating the train split with $TEACHER (beam $BEAM); output in $OUT_DIR/generate-train.txt," \
            "log $OUT_DIR/generate-train.log"
        # unbuffered: the H- lines reach the file as sentences finish, so they can be counted for progress
        PYTHONUNBUFFERED=1 fairseq-generate "$DATA_BIN" --user-dir "$USER_DIR" --path "$TEACHER" \
            --source-lang "$SRC" --target-lang "$TGT" \
            --gen-subset train --beam "$BEAM" --nbest 1 --max-tokens "$MAX_TOKENS" \
            --required-batch-size-multiple 1 \
            --num-workers 0 ${GEN_EXTRA[@]+"${GEN_EXTRA[@]}"} >"$OUT_DIR/generate-train.txt" 2>"$OUT_DIR/generate-train.log" &
        GEN_PID=$!
        trap 'kill "$GEN_PID" 2>/dev/null || true' EXIT
        GEN_START=$SECONDS
        watch_count distill "$N_SRC" "$GEN_PID" grep -c '^H-' "$OUT_DIR/generate-train.txt"
        wait "$GEN_PID" \
            || { tail -n 20 "$OUT_DIR/generate-train.log" >&2; die "fairseq-generate failed (log: $OUT_DIR/generate-train.log)"; }
        trap - EXIT
        progress_line distill "$N_SRC" "$N_SRC" $(( SECONDS - GEN_START )) final
        "$PYTHON" "$UTILS" collect "$OUT_DIR/generate-train.txt" "$N_SRC" "$DISTILL_TXT"
        printf '%s\n' "$PARAMS" >"$STAMP"
    fi
    ORIGIN="fairseq-generate --beam $BEAM with $TEACHER"
fi
N_TGT="$(wc -l <"$DISTILL_TXT" | tr -d ' ')"
[[ "$N_TGT" == "$N_SRC" ]] || die "$DISTILL_TXT has $N_TGT lines but the train source has $N_SRC"
log "$DISTILL_TXT: $N_TGT lines"

# ---- binarise -----------------------------------------------------------------------
command -v fairseq-preprocess >/dev/null 2>&1 || die "fairseq-preprocess not found on PATH (activate .venv)"
BIN="$OUT_DIR/data-bin"
TMP="$OUT_DIR/data-bin.tmp"
rm -rf "$TMP" "$OUT_DIR/.bin-distill"
mkdir -p "$TMP"
fairseq-preprocess --only-source --source-lang "$TGT" --srcdict "$DATA_BIN/dict.$TGT.txt" \
    --trainpref "$OUT_DIR/train.distill" --destdir "$OUT_DIR/.bin-distill" --workers "$WORKERS" \
    >"$OUT_DIR/preprocess.log" 2>&1 \
    || { tail -n 20 "$OUT_DIR/preprocess.log" >&2; die "fairseq-preprocess failed (log: $OUT_DIR/preprocess.log)"; }
for ext in bin idx; do
    mv "$OUT_DIR/.bin-distill/train.$TGT-None.$TGT.$ext" "$TMP/train.$SRC-$TGT.$TGT.$ext"
done
rm -rf "$OUT_DIR/.bin-distill"
cp "$DATA_BIN/dict.$SRC.txt" "$DATA_BIN/dict.$TGT.txt" "$DATA_BIN/train.$SRC-$TGT.$SRC.bin" \
    "$DATA_BIN/train.$SRC-$TGT.$SRC.idx" "$TMP/"
shopt -s nullglob
for f in "$DATA_BIN"/valid*.{bin,idx} "$DATA_BIN"/test*.{bin,idx}; do cp "$f" "$TMP/"; done
shopt -u nullglob
N_BIN="$("$PYTHON" "$UTILS" count "$TMP" train "$SRC" "$TGT" "$TGT")"
[[ "$N_BIN" == "$N_SRC" ]] || die "binarised distilled target has $N_BIN sentences, source $N_SRC"
(cd "$REPO" && exec "$PYTHON" -m fairseq_nat_ext.data.distill_filter "$TMP" --src "$SRC" --tgt "$TGT" \
    --max-repeat "$MAX_REPEAT" --max-len "$MAX_LEN" >"$OUT_DIR/filter.out" 2>"$OUT_DIR/filter.log") &
FILTER_PID=$!
follow_lines "$FILTER_PID" "$OUT_DIR/filter.log" '^\[distill_filter\]'
wait "$FILTER_PID" \
    || { grep -m1 "^error:" "$OUT_DIR/filter.log" >&2 || die "filtering the distilled pairs failed (log: $OUT_DIR/filter.log)"; exit 1; }
FILTERED="$(cat "$OUT_DIR/filter.out")"
rm -f "$OUT_DIR/filter.out"
log "train split: $FILTERED"
grep -h "replaced" "$OUT_DIR/preprocess.log" | sed 's/^.*fairseq_cli.preprocess[^[]*/  /' >&2 || true
{
    echo "distilled train targets: $ORIGIN"
    echo "teacher: $TEACHER"
    echo "original data: $DATA_BIN ($SRC -> $TGT, $N_SRC training sentences)"
    echo "train source, valid, test and dictionaries copied from the original data"
    echo "filter (--max-repeat $MAX_REPEAT --max-len $MAX_LEN): $FILTERED"
} >"$TMP/DISTILL_INFO.txt"
rm -rf "$BIN"
mv "$TMP" "$BIN"
# the untokenised valid / test references beside the new data-bin too (translate.sh finds them there)
if [[ -d "$DATA_BIN/../raw" ]]; then
    mkdir -p "$OUT_DIR/raw"
    for f in "$DATA_BIN"/../raw/{valid,test}.{"$SRC","$TGT"}; do
        [[ -f "$f" ]] && cp -p "$f" "$OUT_DIR/raw/"
    done
fi
log "done: $BIN"
