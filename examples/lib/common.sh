# Shared helpers of the recipes (sourced, not run).
#
# default_cores: the machine's core count (`nproc`, which honours CPU affinity and OMP_NUM_THREADS is
# not read), used as the default of THREADS (torch / OMP threads) and WORKERS (tokenisation and
# fairseq-preprocess processes).  Every recipe still takes THREADS=N / WORKERS=N / OMP_NUM_THREADS=N.
default_cores() {
    local n
    n="$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)"
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || n=1
    echo "$n"
}

# Progress of long steps, on stderr, every PROGRESS_INTERVAL seconds (default 30).
# progress_line LABEL DONE TOTAL ELAPSED_S [final]: "[LABEL] DONE / TOTAL sentences (P%, R sent/s)"
progress_line() {
    awk -v l="$1" -v d="$2" -v t="$3" -v s="$4" -v f="${5:-}" 'BEGIN {
        if (s < 1) s = 1
        pct = (t > 0) ? sprintf("%.0f%%, ", 100 * d / t) : ""
        printf "[%s] %d / %d sentences%s (%s%.1f sent/s)\n", l, d, t, (f != "" ? " in " s " s" : ""), pct, d / s
    }' >&2
}
# watch_count LABEL TOTAL PID COMMAND...: while PID runs, print a progress line every PROGRESS_INTERVAL
# seconds, COMMAND's output being the number done (e.g. grep -c '^H-' generate.txt)
watch_count() {
    local label="$1" total="$2" pid="$3"; shift 3
    local start=$SECONDS last=$SECONDS interval="${PROGRESS_INTERVAL:-30}" n
    interval="${interval%%.*}"; [[ "$interval" =~ ^[0-9]+$ && "$interval" -ge 1 ]] || interval=1
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        if (( SECONDS - last >= interval )); then
            last=$SECONDS
            n="$("$@" 2>/dev/null)" || true
            progress_line "$label" "${n:-0}" "$total" $(( SECONDS - start ))
        fi
    done
}
# follow_lines PID FILE PATTERN: copy FILE's lines matching PATTERN to stderr as they are written, until
# PID ends (the progress lines of a step whose stderr goes to a log file)
follow_lines() {
    tail -n +1 -s 1 -F --pid="$1" "$2" 2>/dev/null | grep --line-buffered -E "$3" >&2 || true
}
