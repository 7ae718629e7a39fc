#!/usr/bin/env bash
# The GPU speed sweep: every speed candidate of `vit-jax benchmark` on
# ViT-B/16 (batch 256) and ViT-L/16 (batch 128) at 224 px in bf16, each
# against the default in the same sitting, as one table (images/s, MFU,
# peak memory, the loss after 20 steps; each also as a ratio to the
# default's) and one JSON (OUT/sweep.json). Run it after
# benchmarks/gpu_check.sh, on the same machine.
#
#   benchmarks/gpu_sweep.sh          # an H100/H200 machine: at most 9 minutes
#   benchmarks/gpu_sweep.sh --dry    # any CPU: the tiny `testing` model, 3 steps
#
# The candidates, in the order they run (most telling first, so a budget
# that runs out drops the least):
#   - settings that keep the model (a candidate for the default): XLA's
#     Triton GEMMs off (cuBLAS's), cuDNN GEMM fusions and LayerNorm, the
#     latency-hiding scheduler, CUDA graphs off, Adam's first moment in
#     bf16, attention through XLA instead of cuDNN, those that won together,
#     a larger batch, remat, the autotuner's exhaustive tiling search;
#   - settings that change the model (never a default; measured for the
#     record): ViT-22B's parallel block, no biases, QK LayerNorm, erf GELU;
#   - FP8 against bf16 on ViT-L/16 over 200 steps (the loss after 200).
# The runs share BUDGET seconds (default 540), each at most CAP (120): one
# that hangs or fails leaves the others their time, and the table shows its
# log's last line. PYTHON (default python3) runs them; OUT keeps the JSON
# and logs (default: a new temporary folder, named at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
out=${OUT:-$(mktemp -d -t gpu_sweep.XXXXXX)}
mkdir -p "$out"
dry=false
if [[ ${1:-} == --dry ]]; then  # L's rows only where B has no such flags.
  B=(testing 8) L=(testing 8) size=32 steps=3 long=25 dry=true
else
  B=(ViT-B/16 256) L=(ViT-L/16 128) size=224 steps=20 long=200
fi
deadline=$((SECONDS + ${BUDGET:-540}))
if ! "$PYTHON" -c 'import ml_collections' 2>/dev/null; then
  export PYTHONPATH=$PWD/benchmarks/wheels/ml_collections-1.1.0-py3-none-any.whl${PYTHONPATH:+:$PYTHONPATH}
fi

names=()
declare -A ran  # The flags each run had (the dry mode runs each once).
run() {  # NAME VARIANT BATCH STEPS [benchmark flags...]
  local name=$1 variant=$2 batch=$3 n=$4; shift 4
  local left=$((deadline - SECONDS)) cap=${CAP:-120}
  if $dry && [[ $name == L.* && -n ${ran["$batch $n $*"]:-} ]]; then return; fi
  ran["$batch $n $*"]=1
  names+=("$name")
  if ((left < 5)); then
    echo "not run: the sweep's budget was spent" >"$out/$name.log"
    return
  fi
  echo "== $name: $variant, batch $batch, $*" >&2
  timeout "$((left < cap ? left : cap))" "$PYTHON" -m vit_jax benchmark \
    --variant="$variant" --batch="$batch" --image_size="$size" \
    --dtype=bfloat16 --steps="$n" --out="$out/$name.json" "$@" \
    >"$out/$name.log" 2>&1 || echo "(exit status $?)" >>"$out/$name.log"
}
xla() { echo "--xla_flags=$*"; }

# Each model's default first: every other row is compared with it.
run B.default "${B[@]}" "$steps" --profile_steps=3
run L.default "${L[@]}" "$long" --profile_steps=3
run L.fp8 "${L[@]}" "$long" --fp8
settings=(no_triton_gemm mu_bf16 cudnn_gemm_fusion cudnn_layer_norm
          latency_hiding attention_xla no_cuda_graphs)
run B.no_triton_gemm "${B[@]}" "$steps" "$(xla --xla_gpu_enable_triton_gemm=false)"
run B.mu_bf16 "${B[@]}" "$steps" --mu_dtype=bfloat16
run B.cudnn_gemm_fusion "${B[@]}" "$steps" "$(xla --xla_gpu_cudnn_gemm_fusion_level=2)"
run B.cudnn_layer_norm "${B[@]}" "$steps" "$(xla --xla_gpu_enable_cudnn_layer_norm=true)"
run B.latency_hiding "${B[@]}" "$steps" "$(xla --xla_gpu_enable_latency_hiding_scheduler=true)"
run B.attention_xla "${B[@]}" "$steps" --attention=xla
run B.no_cuda_graphs "${B[@]}" "$steps" "$(xla --xla_gpu_enable_command_buffer=)"
run B.default_again "${B[@]}" "$steps"  # The default's own spread.
# The settings that won on B (faster, same loss), together, on both.
mapfile -t best < <("$PYTHON" benchmarks/sweep_table.py --winners "$out" B \
  "${settings[@]/#/B.}")
if ((${#best[@]})); then
  run B.best "${B[@]}" "$steps" "${best[@]}"
  run L.best "${L[@]}" "$steps" "${best[@]}"
fi
run B.batch_2x "${B[0]}" $((2 * B[1])) "$steps"
run B.parallel_block "${B[@]}" "$steps" --parallel_block
run L.parallel_block "${L[@]}" "$steps" --parallel_block
run B.no_bias "${B[@]}" "$steps" --nouse_bias
run L.parallel_no_bias "${L[@]}" "$steps" --parallel_block --nouse_bias
run L.no_triton_gemm "${L[@]}" "$steps" "$(xla --xla_gpu_enable_triton_gemm=false)"
run L.mu_bf16 "${L[@]}" "$steps" --mu_dtype=bfloat16
run B.qk_norm "${B[@]}" "$steps" --qk_norm
run B.gelu_erf "${B[@]}" "$steps" --nogelu_approximate
run B.remat_dots "${B[@]}" "$steps" --remat=dots
run L.no_bias "${L[@]}" "$steps" --nouse_bias
run B.exhaustive_tiling "${B[@]}" "$steps" "$(xla --xla_gpu_exhaustive_tiling_search=true)"
"$PYTHON" benchmarks/sweep_table.py "$out" "${names[@]}"
echo "(results and logs: $out)"
