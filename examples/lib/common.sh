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
