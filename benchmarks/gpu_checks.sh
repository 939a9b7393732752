#!/usr/bin/env bash
# Issue 52's checks on one lent GPU, as one run (the `device` tool: a fresh machine with a CUDA torch, no project
# venv; 15 minutes in all). Each result goes to $OUT (the folder the device tool brings back), then into results/:
#
#     bash benchmarks/gpu_checks.sh                       # on the GPU machine, from the repository's root
#
#   1. Wiola / LLaMA training step in turns, eager and compiled, bf16, batch 32 x 256, story and CS336 shapes
#      (target: at most 1.3x): results/step_ratio_cuda.json;
#   2. the host reads of a step and ATM's lengths, on the GPU: results/step_syncs_cuda.json (--steps 100);
#   3. the trainer's tokens/s for llama-cs336 compiled against a plain compiled loop of the same shape (target:
#      at least 0.9x): results/loop_bench_cuda.json;
#   4. tests/test_cuda.py (the trainer's CUDA path): its summary line in test_cuda.txt;
#   5. the two GPU rows of the recipes table (tokens/s, 20 timed steps each): results/recipes.json.
# Every command is printed before it runs; a failing one does not stop the rest (each writes its own file).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
out=${OUT:-results}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
run() { echo "+ $*"; "$@" || echo "FAILED ($?): $*"; }
run "$py" benchmarks/step_ratio.py --device cuda --precision bf16 --batch-story 32 --batch-cs336 32 \
    --result "$out/step_ratio_cuda.json"
run "$py" benchmarks/step_syncs.py --device cuda --steps 100 --result "$out/step_syncs_cuda.json"
run "$py" benchmarks/loop_bench.py --device cuda --result "$out/loop_bench_cuda.json"
"$py" -m pytest -o addopts= -p no:cacheprovider -q tests/test_cuda.py 2>&1 | tail -5 | tee "$out/test_cuda.txt"
cp results/recipes.json "$out/recipes.json" 2>/dev/null
run "$py" benchmarks/recipes.py --recipes consumer-gpu-1h datacenter-gpu-30min --result "$out/recipes.json"
