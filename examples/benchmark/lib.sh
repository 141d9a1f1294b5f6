# Sourced by the Multi30K benchmark scripts (mask_predict.sh, ctc_imputer.sh, edit_based.sh,
# fertility_refinement.sh) after they set NAME: the repository root and Python, the shared defaults
# and the helpers every one of them needs.  Settings (environment):
#   SHARED            the shared data folder (default: ../shared beside the repository)
#   DATA_BIN          data-bin with the test split (default runs/m30k_distill/data-bin)
#   RAW_REF           raw German reference (default $SHARED/data/multi30k/test_2016_flickr.de.gz)
#   SRC, TGT          language pair (en, de)
#   TEACHER_CKPT      the AR teacher (default $SHARED/data/multi30k-teacher/teacher.pt), its budget
#                     TEACHER_UPDATES / TEACHER_WALL_S (default 5700 s, its README)
#   THREADS (2), LATENCY_SENTENCES (200), LIMIT (first N test sentences), CUDA=1,
#   OUT (benchmarks/results/$NAME.json: a current table; benchmarks/results/studies/STUDY/$NAME.json: a
#   study's table), DOCS (default: every generated page, `python -m benchmarks.tables --update-all`, which
#   shows a current table in docs/benchmarks.md and a study's in docs/studies/STUDY.md; or one page, whose
#   results section then shows the tables of OUT's folder),
#   TRAIN_COMMAND (how the systems were trained: recorded),
#   BENCHMARK_NAME (rows written as that benchmark instead of the script's own, see below)
#   <SYS>_CKPT, <SYS>_TRAIN_LOG (default: train.log beside the checkpoint), <SYS>_UPDATES, <SYS>_WALL_S
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python; fi
fi
SHARED="${SHARED:-$(dirname "$REPO")/shared}"
DATA_BIN="${DATA_BIN:-$REPO/runs/m30k_distill/data-bin}"
RAW_REF="${RAW_REF:-$SHARED/data/multi30k/test_2016_flickr.de.gz}"
SRC="${SRC:-en}"
TGT="${TGT:-de}"
TEACHER_CKPT="${TEACHER_CKPT:-$SHARED/data/multi30k-teacher/teacher.pt}"
TEACHER_UPDATES="${TEACHER_UPDATES:-}"
TEACHER_WALL_S="${TEACHER_WALL_S:-5700}"
THREADS="${THREADS:-2}"
LATENCY_SENTENCES="${LATENCY_SENTENCES:-200}"
LIMIT="${LIMIT:-}"
# BENCHMARK_NAME: write the rows as another benchmark (its own JSON, hypothesis folder and docs table),
# e.g. a subset of the systems re-measured on another machine; the script stays $SCRIPT
SCRIPT="$NAME"; NAME="${BENCHMARK_NAME:-$NAME}"
[[ "$NAME" =~ ^[a-z][a-z0-9_]*$ ]] || { echo "error: BENCHMARK_NAME '$NAME' is not a lower-case identifier" >&2; exit 1; }
OUT="${OUT:-benchmarks/results/$NAME.json}"
DOCS="${DOCS:-all}"
CUDA="${CUDA:-0}"

die() { echo "error: $*" >&2; exit 1; }
want() { [[ " $SYSTEMS " == *" $1 "* ]]; }
separate_table() {  # separate_table "SYS..." HINT: SYS... (another budget or data condition) need their own table
    local s mine=0 other=0
    for s in $SYSTEMS; do
        [[ "$s" == teacher || "$s" == reference ]] && continue
        if [[ " $1 " == *" $s "* ]]; then mine=1; else other=1; fi
    done
    if (( mine && other )); then
        die "SYSTEMS='$SYSTEMS' mixes $1 with systems of another budget or data condition (one table holds one): $2"
    fi
    return 0
}
[[ -z "$LIMIT" || "$LIMIT" =~ ^[1-9][0-9]*$ ]] || die "LIMIT must be a positive integer, got '$LIMIT'"

check_systems() {  # check_systems KNOWN...: every word of $SYSTEMS is one of KNOWN
    local s
    for s in $SYSTEMS; do [[ " $* " == *" $s "* ]] || die "SYSTEMS: unknown system '$s' ($*)"; done
}

ckpt_var() { echo "$(echo "$1" | tr '[:lower:]' '[:upper:]')_CKPT"; }  # system -> its variable

need_ckpts() {  # need_ckpts SYSTEM...: each wanted system's checkpoint exists
    local s v
    for s in "$@"; do
        v="$(ckpt_var "$s")"
        if want "$s"; then [[ -f "${!v:-}" ]] || die "checkpoint ${!v:-} not found (set $v, or leave $s out of SYSTEMS)"; fi
    done
}

command_settings() {  # command_settings PREFIX...: " P_CKPT=... P_UPDATES=... P_WALL_S=..." of those set
    local p v out=""
    for p in "$@"; do
        for v in "${p}_CKPT" "${p}_UPDATES" "${p}_WALL_S"; do [[ -n "${!v:-}" ]] && out+=" $v=${!v}"; done
    done
    echo "$out"
}

wanted_settings() {  # wanted_settings SYSTEM...: command_settings of each system in $SYSTEMS (a checkpoint
    local s out=""      # variable's default names no checkpoint the table was measured with)
    for s in "$@"; do want "$s" && out+="$(command_settings "$(echo "$s" | tr '[:lower:]' '[:upper:]')")"; done
    echo "$out"
}

finish_command() {  # the shared settings and this script's name close the recorded COMMAND
    COMMAND+=" THREADS=$THREADS LATENCY_SENTENCES=$LATENCY_SENTENCES${LIMIT:+ LIMIT=$LIMIT}"
    [[ "$CUDA" == 1 ]] && COMMAND+=" CUDA=1"
    [[ "$NAME" != "$SCRIPT" ]] && COMMAND+=" BENCHMARK_NAME=$NAME"
    COMMAND+=" bash examples/benchmark/$SCRIPT.sh"
    [[ -n "${TRAIN_COMMAND:-}" ]] && COMMAND="training: $TRAIN_COMMAND; benchmark: $COMMAND"
    return 0
}

harness_options() {  # -> HARNESS: options of every fairseq_nat_ext.evaluation.run call (after COMMAND is final)
    HARNESS=(--benchmark "$NAME" --threads "$THREADS" --latency-sentences "$LATENCY_SENTENCES" --out "$OUT"
             --command "$COMMAND")
    [[ -n "$LIMIT" ]] && HARNESS+=(--limit "$LIMIT")
    [[ "$CUDA" == 1 ]] && HARNESS+=(--cuda)
    return 0
}

train_stats() {  # train_stats PREFIX: the --train-* options of one system (P_UPDATES, P_WALL_S, its log)
    local p="$1" v log out=()
    v="${p}_UPDATES"; [[ -n "${!v:-}" ]] && out+=(--train-updates "${!v}")
    v="${p}_WALL_S"; [[ -n "${!v:-}" ]] && out+=(--train-wall-s "${!v}")
    if [[ "$p" != TEACHER ]]; then  # the shared teacher's budget is stated, it has no log here
        v="${p}_TRAIN_LOG"; log="${!v:-}"
        v="${p}_CKPT"; [[ -z "$log" && -n "${!v:-}" ]] && log="$(dirname "${!v}")/train.log"
        [[ -f "$log" ]] && out+=(--train-log "$log")
    fi
    echo "${out[@]}"
}

bench() { echo "[$NAME.sh] $*" >&2; "$PYTHON" -m fairseq_nat_ext.evaluation.run "$@"; }

update_tables() {  # redraw $NAME.png, print the results tables of OUT's folder, regenerate the docs ($DOCS)
    "$PYTHON" -m benchmarks.plot "$OUT" >&2 || echo "[$NAME.sh] plot not drawn (see the error above)" >&2
    "$PYTHON" -m benchmarks.tables "$(dirname "$OUT")"/*.json
    if [[ "$DOCS" == all ]]; then
        "$PYTHON" -m benchmarks.tables --update-all \
            || echo "[$NAME.sh] the generated docs pages were not all updated (see the error above)" >&2
    elif [[ -f "$DOCS" ]]; then
        "$PYTHON" -m benchmarks.tables "$(dirname "$OUT")"/*.json --update-docs "$DOCS" \
            || echo "[$NAME.sh] $DOCS not updated (see the error above)" >&2
    else
        echo "[$NAME.sh] $DOCS not found: results tables not written there" >&2
    fi
    echo "[$NAME.sh] done: $OUT" >&2
}
