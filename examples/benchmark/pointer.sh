#!/usr/bin/env bash
# Pointer-network benchmark (Vinyals et al. 2015 on CPU-sized budgets): data, training and evaluation
# by benchmarks.pointer -> benchmarks/results/pointer.json (+ pointer/<problem>.png),
# then the results section of docs/benchmarks.md is regenerated.
#
#   bash examples/benchmark/pointer.sh                     # everything, default budgets
#   EXPERIMENTS=tsp5-20 ARCHS=pointer_lstm MAX_UPDATE=5000 bash examples/benchmark/pointer.sh
#
# Experiments: hull50 (convex hull 50 -> 50), hull5-50 (trained on 5-50, tested on 5/10/50/100/200),
# delaunay5, delaunay10, tsp5-20 (trained on 5-20, tested on 5/10/20; references exact up to n = 12,
# LKH-3 via elkai above).
#
# Settings (environment, defaults in brackets):
#   WORK             data and checkpoints [runs/pointer]
#   EXPERIMENTS      [hull50,hull5-50,delaunay5,delaunay10,tsp5-20]
#   ARCHS            [pointer_lstm,pointer_transformer]
#   TRAIN_SIZE       training examples per experiment [100000]; VALID_SIZE [1000]; TEST_SIZE per n [1000]
#   MAX_UPDATE       training budget per model, updates [20000]
#   STOP_TIME_HOURS  training budget per model, wall hours [1.0]; whichever ends first
#   BATCH_SIZE [128]  LR [1e-3]  WARMUP [200]  CLIP_NORM [2.0]  AUGMENT [none]
#                    INDEX_RANGE [0] (examples/train_pointer.sh; pointer_transformer's models only)
#   BEAMS            beam widths evaluated, 1 = greedy [1,5]
#   THREADS          torch threads for training and decoding [2]
#   STAGES           [data,train,eval]
#   BENCHMARK_NAME   [pointer]; pointer_<name>: a subset re-measured on other hardware, as its own
#                    benchmark (file, pictures and docs table), so one table never mixes machines
#   OUT [benchmarks/results/$BENCHMARK_NAME.json]  DOCS [all: every generated page, benchmarks.tables --update-all; or one page] (DOCS= to skip the update)
#   CUDA=1           decode on CUDA when available
# Data generation is single-threaded: about 1 min per 100000 hulls of 50 points; TSP 5-20 needs LKH
# (about 10-15 ms per instance of n > 12), so 100000 examples take roughly 10-15 min.
# Budgets go into the results' "command".  Reruns resume: existing data files are kept, training
# resumes from checkpoint_last.pt (a finished model is not started again), rows are upserted.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
[[ -x "$REPO/.venv/bin/python" ]] && export PATH="$REPO/.venv/bin:$PATH"
PYTHON="${PYTHON:-python}"
export WORK="${WORK:-runs/pointer}"
export EXPERIMENTS="${EXPERIMENTS:-hull50,hull5-50,delaunay5,delaunay10,tsp5-20}"
export ARCHS="${ARCHS:-pointer_lstm,pointer_transformer}"
export TRAIN_SIZE="${TRAIN_SIZE:-100000}" VALID_SIZE="${VALID_SIZE:-1000}" TEST_SIZE="${TEST_SIZE:-1000}"
export MAX_UPDATE="${MAX_UPDATE:-20000}" STOP_TIME_HOURS="${STOP_TIME_HOURS:-1.0}"
export BATCH_SIZE="${BATCH_SIZE:-128}" LR="${LR:-1e-3}" WARMUP="${WARMUP:-200}" CLIP_NORM="${CLIP_NORM:-2.0}" AUGMENT="${AUGMENT:-none}" INDEX_RANGE="${INDEX_RANGE:-0}"
export BEAMS="${BEAMS:-1,5}" THREADS="${THREADS:-2}" STAGES="${STAGES:-data,train,eval}"
BENCHMARK_NAME="${BENCHMARK_NAME:-pointer}"
OUT="${OUT:-benchmarks/results/$BENCHMARK_NAME.json}"
DOCS="${DOCS-all}"
CUDA_FLAG=(); [[ "${CUDA:-0}" == 1 ]] && CUDA_FLAG=(--cuda)
export OMP_NUM_THREADS="$THREADS"
INDEX_NOTE=""; [[ "$INDEX_RANGE" != 0 ]] && INDEX_NOTE=" INDEX_RANGE=$INDEX_RANGE"
COMMAND="training: examples/train_pointer.sh per experiment and arch, MAX_UPDATE=$MAX_UPDATE STOP_TIME_HOURS=$STOP_TIME_HOURS (whichever first) BATCH_SIZE=$BATCH_SIZE LR=$LR WARMUP=$WARMUP CLIP_NORM=$CLIP_NORM AUGMENT=$AUGMENT$INDEX_NOTE THREADS=$THREADS, TRAIN_SIZE=$TRAIN_SIZE; benchmark: EXPERIMENTS=$EXPERIMENTS ARCHS=$ARCHS TEST_SIZE=$TEST_SIZE BEAMS=$BEAMS"
[[ "$BENCHMARK_NAME" != pointer ]] && COMMAND+=" BENCHMARK_NAME=$BENCHMARK_NAME"
COMMAND+=" bash examples/benchmark/pointer.sh"
"$PYTHON" -m benchmarks.pointer --work-dir "$WORK" --out "$OUT" --stages "$STAGES" \
  --experiments "$EXPERIMENTS" --archs "$ARCHS" --train-size "$TRAIN_SIZE" --valid-size "$VALID_SIZE" \
  --test-size "$TEST_SIZE" --beams "$BEAMS" --threads "$THREADS" --command "$COMMAND" --benchmark "$BENCHMARK_NAME" ${CUDA_FLAG[@]+"${CUDA_FLAG[@]}"}
if [[ "$DOCS" == all && -f "$OUT" ]]; then
  "$PYTHON" -m benchmarks.tables --update-all
elif [[ -n "$DOCS" && -f "$OUT" ]]; then
  "$PYTHON" -m benchmarks.tables "$(dirname "$OUT")"/*.json --update-docs "$DOCS"
fi
