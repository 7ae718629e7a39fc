#!/bin/bash
# ViT-B/16 bf16 training speed on one GPU: the attention implementations,
# a larger batch, an XLA flag and FP8 matmuls, each a `vit-jax benchmark`
# run writing JSON into $1 (default: .); the first also profiles where the
# time goes.
# Needs jax, flax, optax and ml_collections; no TensorFlow.
set -u
out=${1:-.}
variant=${VARIANT:-ViT-B/16}
bench() {  # NAME BATCH XLA_FLAGS ARGS...
  local name=$1 batch=$2 xla=$3; shift 3
  echo "== $name: batch $batch, XLA_FLAGS='$xla' $*"
  XLA_FLAGS="$xla" python3 -m vit_jax benchmark --variant="$variant" \
      --batch="$batch" --dtype=bfloat16 --steps=20 --out="$out/$name.json" \
      "$@" > /dev/null 2>&1
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print({k: r[k] for k in ("attention", "images_per_sec", "mfu", "step_s", "peak_device_memory_gib")})' "$out/$name.json"
}
bench auto 256 "" --profile_steps=3
bench explicit 256 "" --attention=explicit
bench auto_b512 512 ""
bench auto_no_triton_gemm 256 "--xla_gpu_enable_triton_gemm=false"
bench fp8 256 "" --fp8
