#!/usr/bin/env bash
# Prepare a parallel corpus for fairseq: validate -> Moses tokenise -> joint BPE -> binarise.
#
# Usage:
#   examples/prepare_data.sh RAW_DIR SRC TGT OUT_DIR [options]
#
# Options:
#   --bpe-merges N        merges for `fast learnbpe` (default 10000); ignored with --codes
#   --codes FILE          apply these existing fastBPE codes instead of learning new ones
#                         (e.g. multi30k-teacher/bpe.codes, together with --srcdict)
#   --srcdict FILE        reuse this fairseq dictionary (joined: used for both sides)
#                         instead of building one from the training data
#   --splits TR,VA,TE     file prefixes of the train, valid and test splits in RAW_DIR
#                         (default: auto-detected, see below)
#   --moses-lang SL,TL    language codes given to sacremoses (default: SRC,TGT; codes
#                         sacremoses does not know fall back to English rules)
#   --workers N           processes for sacremoses and fairseq-preprocess (default $WORKERS or the core count)
#   --force               redo every step even when its outputs are up to date
#
# Input convention: RAW_DIR holds, for each split prefix P, the files P.SRC and P.TGT,
# plain text or gzip (P.SRC.gz).  Without --splits the prefixes are found in this order:
#   train: train            valid: valid, val, dev            test: test, test_2016_flickr
# so both a plain `{train,valid,test}.{src,tgt}` corpus (fairseq_nat_ext.data.synthetic_corpus)
# and the Multi30K files (`train`, `val`, `test_2016_flickr`, `.gz`) work as they are.
# Whatever the input names, outputs use the roles train / valid / test.
#
# Output layout (OUT_DIR):
#   raw/{train,valid,test}.{SRC,TGT}   uncompressed copies of the input; raw/test.TGT is the
#                                      untokenised reference for sacreBLEU
#   tok/...                            Moses-tokenised, as `sacremoses -l L -j N tokenize -x`
#                                      (run through sacremoses' Python API in one process)
#   bpe/...                            BPE applied (`fast applybpe`)
#   bpe.codes                          the BPE codes used (a copy of --codes when given)
#   data-bin/                          fairseq-preprocess output, joined dictionary
#                                      (dict.SRC.txt == dict.TGT.txt)
#
# Every split pair is checked first with fairseq_nat_ext.data.validate_parallel; the first
# problem stops the script with that one-line error, before OUT_DIR is created.  Steps whose outputs are newer than
# their inputs (and whose options did not change) are skipped, so a rerun is cheap.
#
# Progress: tokenisation reports the sentences done of all its files and the rate every tenth or
# PROGRESS_INTERVAL seconds (default 30); BPE reports after each file, binarisation when done.
#
# Tools: the sacremoses package (for $PYTHON, default `python` from PATH), fairseq-preprocess
# from PATH (the venv's bin), `fast` from PATH or
# $FAST; when missing it is built by examples/tools/build_fastbpe.sh.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/.." && pwd)"
PYTHON="${PYTHON:-python}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

log() { echo "[prepare_data] $*" >&2; }
die() { echo "error: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }

POSITIONAL=()
BPE_MERGES=10000
CODES=""
SRCDICT=""
SPLITS=""
MOSES_LANG=""
# shellcheck source=lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"
WORKERS="${WORKERS:-$(default_cores)}"
FORCE=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --bpe-merges) BPE_MERGES="${2:?--bpe-merges needs a value}"; shift 2 ;;
        --codes) CODES="${2:?--codes needs a file}"; shift 2 ;;
        --srcdict) SRCDICT="${2:?--srcdict needs a file}"; shift 2 ;;
        --splits) SPLITS="${2:?--splits needs TRAIN,VALID,TEST}"; shift 2 ;;
        --moses-lang) MOSES_LANG="${2:?--moses-lang needs SL,TL}"; shift 2 ;;
        --workers) WORKERS="${2:?--workers needs a value}"; shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) usage 0 ;;
        --*) die "unknown option $1 (see --help)" ;;
        *) POSITIONAL+=("$1"); shift ;;
    esac
done
[[ ${#POSITIONAL[@]} -eq 4 ]] || usage 2
RAW_DIR="${POSITIONAL[0]}"; SRC="${POSITIONAL[1]}"; TGT="${POSITIONAL[2]}"; OUT_DIR="${POSITIONAL[3]}"

[[ -d "$RAW_DIR" ]] || die "RAW_DIR $RAW_DIR is not a directory"
[[ "$SRC" != "$TGT" ]] || die "SRC and TGT must differ"
[[ "$BPE_MERGES" =~ ^[1-9][0-9]*$ ]] || die "--bpe-merges must be a positive integer"
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || die "--workers must be a positive integer"
if [[ -n "$CODES" ]]; then [[ -s "$CODES" ]] || die "--codes $CODES: no such (or empty) file"; CODES="$(cd "$(dirname "$CODES")" && pwd)/$(basename "$CODES")"; fi
if [[ -n "$SRCDICT" ]]; then [[ -s "$SRCDICT" ]] || die "--srcdict $SRCDICT: no such (or empty) file"; SRCDICT="$(cd "$(dirname "$SRCDICT")" && pwd)/$(basename "$SRCDICT")"; fi
if [[ -n "$MOSES_LANG" ]]; then
    [[ "$MOSES_LANG" =~ ^[^,]+,[^,]+$ ]] || die "--moses-lang must be SL,TL"
    MOSES_SRC="${MOSES_LANG%,*}"; MOSES_TGT="${MOSES_LANG#*,}"
else
    MOSES_SRC="$SRC"; MOSES_TGT="$TGT"
fi

# ---- locate the input files ---------------------------------------------------------
# input_file PREFIX LANG -> path of RAW_DIR/PREFIX.LANG or RAW_DIR/PREFIX.LANG.gz
input_file() {
    if [[ -f "$RAW_DIR/$1.$2" ]]; then echo "$RAW_DIR/$1.$2"
    elif [[ -f "$RAW_DIR/$1.$2.gz" ]]; then echo "$RAW_DIR/$1.$2.gz"
    else return 1; fi
}
find_prefix() {  # find_prefix ROLE CANDIDATE...
    local role="$1"; shift
    local p
    for p in "$@"; do
        if input_file "$p" "$SRC" >/dev/null; then echo "$p"; return 0; fi
    done
    die "no $role split in $RAW_DIR (looked for the prefixes: $*; files PREFIX.$SRC or PREFIX.$SRC.gz)"
}
if [[ -n "$SPLITS" ]]; then
    IFS=, read -r P_TRAIN P_VALID P_TEST EXTRA <<<"$SPLITS"
    [[ -n "$P_TRAIN" && -n "$P_VALID" && -n "$P_TEST" && -z "${EXTRA:-}" ]] \
        || die "--splits must be TRAIN,VALID,TEST (three prefixes)"
else
    P_TRAIN="$(find_prefix train train)"
    P_VALID="$(find_prefix valid valid val dev)"
    P_TEST="$(find_prefix test test test_2016_flickr)"
fi
ROLES=(train valid test)
PREFIXES=("$P_TRAIN" "$P_VALID" "$P_TEST")
declare -A INPUT
for i in 0 1 2; do
    for lang in "$SRC" "$TGT"; do
        INPUT[${ROLES[$i]}.$lang]="$(input_file "${PREFIXES[$i]}" "$lang")" \
            || die "$RAW_DIR/${PREFIXES[$i]}.$lang: no such file (nor .gz)"
    done
done
log "splits: train=$P_TRAIN valid=$P_VALID test=$P_TEST ($SRC -> $TGT)"

# ---- 1. validate (before anything is written or built) --------------------------------
for role in "${ROLES[@]}"; do
    "$PYTHON" "$REPO/fairseq_nat_ext/data/validate_parallel.py" \
        "${INPUT[$role.$SRC]}" "${INPUT[$role.$TGT]}" || exit 1
done
log "validated the three split pairs"

command -v fairseq-preprocess >/dev/null 2>&1 || die "fairseq-preprocess not found on PATH (activate .venv or run through make)"
"$PYTHON" -c "import sacremoses" 2>/dev/null || die "$PYTHON cannot import sacremoses (activate .venv or run through make)"
FAST="${FAST:-$(command -v fast 2>/dev/null || true)}"
if [[ -z "$FAST" || ! -x "$FAST" ]]; then
    log "fastBPE's 'fast' not found: building it"
    FAST="$(bash "$SCRIPT_DIR/tools/build_fastbpe.sh")"
fi

# ---- helpers ------------------------------------------------------------------------
# up_to_date OUT IN... : true when OUT exists and is newer than every IN (and no --force)
up_to_date() {
    local out="$1"; shift
    [[ $FORCE -eq 0 && -e "$out" ]] || return 1
    local f
    for f in "$@"; do [[ "$out" -nt "$f" ]] || return 1; done
}
# param_stamp FILE VALUE : rewrite FILE only when VALUE changed, so it can serve as an input
param_stamp() {
    if [[ ! -f "$1" ]] || [[ "$(cat "$1")" != "$2" ]]; then printf '%s\n' "$2" >"$1"; fi
}
n_lines() { wc -l <"$1" | tr -d ' '; }

mkdir -p "$OUT_DIR"/{raw,tok,bpe}
OUT_DIR="$(cd "$OUT_DIR" && pwd)"

# ---- 2. raw copies -------------------------------------------------------------------
for role in "${ROLES[@]}"; do
    for lang in "$SRC" "$TGT"; do
        in="${INPUT[$role.$lang]}"; out="$OUT_DIR/raw/$role.$lang"
        up_to_date "$out" "$in" && continue
        if [[ "$in" == *.gz ]]; then gzip -dc "$in" >"$out.tmp"; else cat "$in" >"$out.tmp"; fi
        mv -f "$out.tmp" "$out"
    done
done

# ---- 3. Moses tokenisation ----------------------------------------------------------
# fairseq_nat_ext/data/moses_tokenize.py: sacremoses' Python API in one process, output
# identical to `sacremoses -l L -j N tokenize -x < in > out` (one start-up instead of six)
PENDING=()
for role in "${ROLES[@]}"; do
    for lang in "$SRC" "$TGT"; do
        if [[ "$lang" == "$SRC" ]]; then mlang="$MOSES_SRC"; else mlang="$MOSES_TGT"; fi
        in="$OUT_DIR/raw/$role.$lang"; out="$OUT_DIR/tok/$role.$lang"
        param_stamp "$OUT_DIR/tok/.lang.$lang" "$mlang"
        up_to_date "$out" "$in" "$OUT_DIR/tok/.lang.$lang" && continue
        PENDING+=("$mlang" "$in" "$out")
    done
done
if [[ ${#PENDING[@]} -gt 0 ]]; then
    log "Moses-tokenising $(( ${#PENDING[@]} / 3 )) files (sacremoses, -j $WORKERS)"
    "$PYTHON" "$REPO/fairseq_nat_ext/data/moses_tokenize.py" -j "$WORKERS" "${PENDING[@]}" || exit 1
    for ((i = 1; i < ${#PENDING[@]}; i += 3)); do
        [[ "$(n_lines "${PENDING[$((i + 1))]}")" == "$(n_lines "${PENDING[$i]}")" ]] \
            || die "tokenisation changed the line count of ${PENDING[$i]}"
    done
fi

# ---- 4. BPE codes -------------------------------------------------------------------
CODES_OUT="$OUT_DIR/bpe.codes"
if [[ -n "$CODES" ]]; then
    if [[ $FORCE -eq 1 || ! -f "$CODES_OUT" ]] || ! cmp -s "$CODES" "$CODES_OUT"; then
        log "using existing BPE codes $CODES"
        cp -f "$CODES" "$CODES_OUT.tmp" && mv -f "$CODES_OUT.tmp" "$CODES_OUT"
    fi
    param_stamp "$OUT_DIR/.bpe.params" "codes=$CODES"
else
    param_stamp "$OUT_DIR/.bpe.params" "merges=$BPE_MERGES"
    if ! up_to_date "$CODES_OUT" "$OUT_DIR/tok/train.$SRC" "$OUT_DIR/tok/train.$TGT" "$OUT_DIR/.bpe.params"; then
        log "learning $BPE_MERGES BPE merges jointly on tok/train.$SRC + tok/train.$TGT"
        "$FAST" learnbpe "$BPE_MERGES" "$OUT_DIR/tok/train.$SRC" "$OUT_DIR/tok/train.$TGT" \
            >"$CODES_OUT.tmp" 2>"$OUT_DIR/bpe.log" || { cat "$OUT_DIR/bpe.log" >&2; die "fast learnbpe failed"; }
        [[ -s "$CODES_OUT.tmp" ]] || die "fast learnbpe produced no codes"
        # asked for more merges than the corpus has pairs, fastBPE pads the codes with repeated
        # zero-count merges ("m m 0") that its own applybpe then rejects: keep the real ones only
        awk '$3 > 0' "$CODES_OUT.tmp" >"$CODES_OUT.real" && mv -f "$CODES_OUT.real" "$CODES_OUT.tmp"
        n_codes=$(wc -l <"$CODES_OUT.tmp")
        [[ "$n_codes" -lt "$BPE_MERGES" ]] && log "the corpus allows only $n_codes merges (asked for $BPE_MERGES)"
        mv -f "$CODES_OUT.tmp" "$CODES_OUT"
    fi
fi

# ---- 5. apply BPE -------------------------------------------------------------------
BPE_PENDING=(); BPE_TOTAL=0
for role in "${ROLES[@]}"; do
    for lang in "$SRC" "$TGT"; do
        in="$OUT_DIR/tok/$role.$lang"; out="$OUT_DIR/bpe/$role.$lang"
        up_to_date "$out" "$in" "$CODES_OUT" && continue
        BPE_PENDING+=("$role.$lang"); BPE_TOTAL=$(( BPE_TOTAL + $(n_lines "$in") ))
    done
done
BPE_DONE=0; BPE_START=$SECONDS
for name in ${BPE_PENDING[@]+"${BPE_PENDING[@]}"}; do
    in="$OUT_DIR/tok/$name"; out="$OUT_DIR/bpe/$name"
    "$FAST" applybpe "$out.tmp" "$in" "$CODES_OUT" >>"$OUT_DIR/bpe.log" 2>&1 \
        || { tail -n 5 "$OUT_DIR/bpe.log" >&2; die "fast applybpe failed on $in"; }
    n="$(n_lines "$in")"
    [[ "$(n_lines "$out.tmp")" == "$n" ]] || die "fast applybpe changed the line count of $in"
    mv -f "$out.tmp" "$out"
    BPE_DONE=$(( BPE_DONE + n ))
    progress_line "prepare_data BPE $name" "$BPE_DONE" "$BPE_TOTAL" $(( SECONDS - BPE_START ))
done
log "BPE applied ($CODES_OUT)"

# ---- 6. binarise ---------------------------------------------------------------------
BIN="$OUT_DIR/data-bin"
param_stamp "$OUT_DIR/.dict.params" "srcdict=$SRCDICT"
BPE_FILES=()
for role in "${ROLES[@]}"; do BPE_FILES+=("$OUT_DIR/bpe/$role.$SRC" "$OUT_DIR/bpe/$role.$TGT"); done
DICT_INPUTS=("$OUT_DIR/.dict.params")
[[ -n "$SRCDICT" ]] && DICT_INPUTS+=("$SRCDICT")
if up_to_date "$BIN/.done" "${BPE_FILES[@]}" "${DICT_INPUTS[@]}"; then
    log "data-bin up to date: $BIN"
else
    BIN_TOTAL=0
    for f in "${BPE_FILES[@]}"; do BIN_TOTAL=$(( BIN_TOTAL + $(n_lines "$f") )); done
    log "binarising $BIN_TOTAL sentences (both sides of the three splits) into $BIN (log: $OUT_DIR/preprocess.log)"
    BIN_START=$SECONDS
    rm -rf "$BIN.tmp"
    DICT_ARGS=(--joined-dictionary)
    [[ -n "$SRCDICT" ]] && DICT_ARGS+=(--srcdict "$SRCDICT")
    fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" \
        --trainpref "$OUT_DIR/bpe/train" --validpref "$OUT_DIR/bpe/valid" --testpref "$OUT_DIR/bpe/test" \
        --destdir "$BIN.tmp" "${DICT_ARGS[@]}" --workers "$WORKERS" >"$OUT_DIR/preprocess.log" 2>&1 \
        || { tail -n 20 "$OUT_DIR/preprocess.log" >&2; die "fairseq-preprocess failed (log: $OUT_DIR/preprocess.log)"; }
    rm -rf "$BIN"
    mv "$BIN.tmp" "$BIN"
    touch "$BIN/.done"
    progress_line "prepare_data binarise" "$BIN_TOTAL" "$BIN_TOTAL" $(( SECONDS - BIN_START )) final
fi
grep -h "replaced" "$OUT_DIR/preprocess.log" 2>/dev/null | sed 's/^.*fairseq_cli.preprocess[^[]*/  /' >&2 || true
log "done: $BIN (dict $(wc -l <"$BIN/dict.$SRC.txt" | tr -d ' ') types); raw reference: $OUT_DIR/raw/test.$TGT"
