#!/usr/bin/env bash
# The GPU speed sweep: every speed candidate of `vit-jax benchmark` on
# ViT-B/16 (batch 256) and ViT-L/16 (batch 128) at 224 px in bf16, each
# against the default in the same sitting, as one table (images/s, MFU,
# the compiled step's memory, the loss after 20 steps; each against its
# baseline) and one JSON (OUT/sweep.json). Run it after
# benchmarks/gpu_check.sh, on the same machine.
#
#   benchmarks/gpu_sweep.sh          # an H100/H200 machine: at most 9 minutes
#   benchmarks/gpu_sweep.sh --dry    # any CPU: the tiny `testing` model, 3 steps
#
# The candidates and their order are benchmarks/sweep.py's: the defaults;
# the settings that keep the model (XLA's Triton GEMMs off, cuDNN GEMM
# fusions and LayerNorm, the latency-hiding scheduler, Adam's first moment
# in bf16, attention through XLA), the default again, the winners together;
# ViT-22B's block; FP8 against bf16 over 200 steps; then a larger batch,
# CUDA graphs off, QK LayerNorm, erf GELU, remat, the autotuner's
# exhaustive search, and L/16's rows of some settings. They run in one
# process (one start of JAX and the GPU; XLA's options per compiled
# step), which stops starting candidates when BUDGET seconds (default 540)
# are nearly spent; a process that dies in one is followed by another that
# goes on from the next, and the table shows what each failed run's log
# said last. PYTHON (default python3) runs it; OUT keeps the JSON and logs
# (default: a new temporary folder, named at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
dry=()
case ${1:-} in
  "") ;;
  --dry) dry=(--dry) ;;
  *) echo "usage: $0 [--dry]  (OUT=DIR keeps the results)" >&2; exit 2 ;;
esac
out=${OUT:-$(mktemp -d -t gpu_sweep.XXXXXX)}
mkdir -p "$out"
deadline=$((SECONDS + ${BUDGET:-540}))
if ! "$PYTHON" -c 'import ml_collections' 2>/dev/null; then
  export PYTHONPATH=$PWD/benchmarks/wheels/ml_collections-1.1.0-py3-none-any.whl${PYTHONPATH:+:$PYTHONPATH}
fi

source benchmarks/sweep_loop.sh
run_candidates "$PYTHON" benchmarks/sweep.py "$out" "$deadline" "${dry[@]}"
read -ra names < <("$PYTHON" benchmarks/sweep.py --names "${dry[@]}")
"$PYTHON" benchmarks/sweep_table.py "$out" "${names[@]}"
echo "(results and logs: $out)"
