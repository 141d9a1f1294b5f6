#!/usr/bin/env bash
# Prepare a multi-way parallel corpus (e.g. Multi30K English, German, French) for one multilingual
# model: Moses tokenisation, ONE joint BPE and ONE dictionary over all the languages, every pair
# binarised into one data-bin.
#
# Usage:
#   examples/prepare_multilingual.sh RAW_DIR OUT_DIR [options]
#
# Options:
#   --langs L1,L2,L3      languages (default en,de,fr); each pair L_i-L_j (i < j) is binarised once,
#                         fairseq reads it in both directions
#   --bpe-merges N        merges learned jointly on the training side of every language (default 10000)
#   --workers N           processes (default $WORKERS or the core count)
#   --force               redo every step
#
# RAW_DIR holds train / val (or valid, dev) / test (or test_2016_flickr) files PREFIX.L[.gz] for every
# language L, line-aligned across languages (Multi30K: ../shared/data/multi30k).
#
# Output (OUT_DIR):
#   tok/train.L, bpe.codes       tokenised training text of every language, the joint codes
#   dict.txt                     the joint dictionary (all languages' BPE training text)
#   pairs/L1-L2/                 examples/prepare_data.sh's output for each pair (codes and dict above)
#   raw/test.L                   untokenised test references of every language (for sacreBLEU)
#   data-bin/                    {train,valid,test}.L1-L2.{L1,L2} of every pair and dict.L.txt (the same
#                                dictionary) for every language: the layout of fairseq's `translation`,
#                                `translation_multi_simple_epoch` (--lang-pairs) and this plugin's
#                                `kermit` task (--lang-pairs)
#
# Adding a language (e.g. Czech, --langs en,de,fr,cs) adds one BPE/dictionary input and N-1 pairs
# (each ~1 minute here); the models then train on N(N-1) directions.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/.." && pwd)"
PYTHON="${PYTHON:-python}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
log() { echo "[prepare_multilingual] $*" >&2; }
die() { echo "error: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
# shellcheck source=lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"

LANGS=en,de,fr
BPE_MERGES=10000
WORKERS="${WORKERS:-$(default_cores)}"
FORCE=0
POSITIONAL=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --langs) LANGS="${2:?--langs needs L1,L2,...}"; shift 2 ;;
        --bpe-merges) BPE_MERGES="${2:?--bpe-merges needs a value}"; shift 2 ;;
        --workers) WORKERS="${2:?--workers needs a value}"; shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) usage 0 ;;
        --*) die "unknown option $1 (see --help)" ;;
        *) POSITIONAL+=("$1"); shift ;;
    esac
done
[[ ${#POSITIONAL[@]} -eq 2 ]] || usage 2
RAW_DIR="${POSITIONAL[0]}"; OUT_DIR="${POSITIONAL[1]}"
[[ -d "$RAW_DIR" ]] || die "RAW_DIR $RAW_DIR is not a directory"
[[ "$BPE_MERGES" =~ ^[1-9][0-9]*$ ]] || die "--bpe-merges must be a positive integer"
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || die "--workers must be a positive integer"
IFS=, read -r -a L <<<"$LANGS"
[[ ${#L[@]} -ge 2 ]] || die "--langs needs at least two languages, got '$LANGS'"
[[ "$(printf '%s\n' "${L[@]}" | sort -u | wc -l)" -eq ${#L[@]} ]] || die "--langs: a language is repeated in '$LANGS'"
for l in "${L[@]}"; do [[ "$l" =~ ^[a-z][a-z_]*$ ]] || die "--langs: '$l' is not a language code"; done

input_file() {  # input_file PREFIX LANG -> RAW_DIR/PREFIX.LANG[.gz]
    if [[ -f "$RAW_DIR/$1.$2" ]]; then echo "$RAW_DIR/$1.$2"
    elif [[ -f "$RAW_DIR/$1.$2.gz" ]]; then echo "$RAW_DIR/$1.$2.gz"
    else return 1; fi
}
for l in "${L[@]}"; do input_file train "$l" >/dev/null || die "$RAW_DIR/train.$l: no such file (nor .gz)"; done
FORCE_ARG=(); [[ $FORCE -eq 1 ]] && FORCE_ARG=(--force)
FAST="${FAST:-$(command -v fast 2>/dev/null || true)}"
if [[ -z "$FAST" || ! -x "$FAST" ]]; then log "fastBPE's 'fast' not found: building it"; FAST="$(bash "$SCRIPT_DIR/tools/build_fastbpe.sh")"; fi
command -v fairseq-preprocess >/dev/null 2>&1 || die "fairseq-preprocess not found on PATH (activate .venv or run through make)"
mkdir -p "$OUT_DIR"/{tok,bpe,raw}
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
PARAMS="langs=$LANGS merges=$BPE_MERGES"
[[ $FORCE -eq 0 && -f "$OUT_DIR/.params" && "$(cat "$OUT_DIR/.params")" == "$PARAMS" && -s "$OUT_DIR/dict.txt" ]] && SAME=1 || SAME=0

# ---- 1. joint BPE codes and dictionary over every language's training text ---------------
if [[ $SAME -eq 0 ]]; then
    ARGS=()
    for l in "${L[@]}"; do
        in="$(input_file train "$l")"
        if [[ "$in" == *.gz ]]; then gzip -dc "$in" >"$OUT_DIR/raw/train.$l"; else cp -f "$in" "$OUT_DIR/raw/train.$l"; fi
        ARGS+=("$l" "$OUT_DIR/raw/train.$l" "$OUT_DIR/tok/train.$l")
    done
    log "Moses-tokenising the training text of ${L[*]}"
    "$PYTHON" "$REPO/fairseq_nat_ext/data/moses_tokenize.py" -j "$WORKERS" "${ARGS[@]}"
    TOKS=(); for l in "${L[@]}"; do TOKS+=("$OUT_DIR/tok/train.$l"); done
    log "learning $BPE_MERGES BPE merges jointly on ${L[*]}"
    cat "${TOKS[@]}" >"$OUT_DIR/tok/train.all"  # fast learnbpe reads at most two files
    "$FAST" learnbpe "$BPE_MERGES" "$OUT_DIR/tok/train.all" 2>"$OUT_DIR/bpe.log" | awk '$3 > 0' >"$OUT_DIR/bpe.codes.tmp"
    rm -f "$OUT_DIR/tok/train.all"
    [[ -s "$OUT_DIR/bpe.codes.tmp" ]] || die "fast learnbpe produced no codes (log: $OUT_DIR/bpe.log)"
    mv -f "$OUT_DIR/bpe.codes.tmp" "$OUT_DIR/bpe.codes"
    for l in "${L[@]}"; do
        "$FAST" applybpe "$OUT_DIR/bpe/train.$l" "$OUT_DIR/tok/train.$l" "$OUT_DIR/bpe.codes" >>"$OUT_DIR/bpe.log" 2>&1 \
            || die "fast applybpe failed on $OUT_DIR/tok/train.$l"
    done
    cat "${L[@]/#/$OUT_DIR/bpe/train.}" >"$OUT_DIR/bpe/train.all"
    rm -rf "$OUT_DIR/dict.tmp"
    fairseq-preprocess --only-source --source-lang all --trainpref "$OUT_DIR/bpe/train" \
        --destdir "$OUT_DIR/dict.tmp" --workers "$WORKERS" --dict-only >"$OUT_DIR/dict.log" 2>&1 \
        || { tail -n 20 "$OUT_DIR/dict.log" >&2; die "fairseq-preprocess (dictionary) failed (log: $OUT_DIR/dict.log)"; }
    mv -f "$OUT_DIR/dict.tmp/dict.all.txt" "$OUT_DIR/dict.txt"
    rm -rf "$OUT_DIR/dict.tmp" "$OUT_DIR/bpe/train.all"
    printf '%s\n' "$PARAMS" >"$OUT_DIR/.params"
    FORCE_ARG=(--force)  # new codes: every pair is redone
fi
log "joint codes $OUT_DIR/bpe.codes, dictionary $(wc -l <"$OUT_DIR/dict.txt" | tr -d ' ') types"

# ---- 2. every pair, with those codes and that dictionary ----------------------------------
rm -rf "$OUT_DIR/data-bin.tmp"; mkdir -p "$OUT_DIR/data-bin.tmp"
for ((i = 0; i < ${#L[@]}; i++)); do
    for ((j = i + 1; j < ${#L[@]}; j++)); do
        a="${L[$i]}"; b="${L[$j]}"; P="$OUT_DIR/pairs/$a-$b"
        log "pair $a-$b"
        bash "$SCRIPT_DIR/prepare_data.sh" "$RAW_DIR" "$a" "$b" "$P" --codes "$OUT_DIR/bpe.codes" \
            --srcdict "$OUT_DIR/dict.txt" --workers "$WORKERS" ${FORCE_ARG[@]+"${FORCE_ARG[@]}"}
        cp -f "$P"/data-bin/{train,valid,test}."$a-$b".* "$OUT_DIR/data-bin.tmp/"
        for l in "$a" "$b"; do
            cp -f "$OUT_DIR/dict.txt" "$OUT_DIR/data-bin.tmp/dict.$l.txt"
            cp -f "$P/raw/test.$l" "$OUT_DIR/raw/test.$l"
        done
    done
done
rm -rf "$OUT_DIR/data-bin"; mv "$OUT_DIR/data-bin.tmp" "$OUT_DIR/data-bin"
log "done: $OUT_DIR/data-bin (${#L[@]} languages, $(( ${#L[@]} * (${#L[@]} - 1) / 2 )) pairs); references $OUT_DIR/raw/test.L"
