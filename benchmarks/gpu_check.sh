#!/usr/bin/env bash
# The GPU check: ViT-B/16 and ViT-L/16 training at 224 px in bf16 on one
# GPU, ours against timm, and ours with FP8 matmuls (config.model.fp8), as
# one table (images/s, MFU, peak memory, compile time, the loss after the
# timed steps) with the device and the JAX, torch and timm versions.
# Whoever next works on a GPU runs this first.
#
#   benchmarks/gpu_check.sh          # an H100/H200 machine: about 6 minutes
#   benchmarks/gpu_check.sh --dry    # any CPU: the tiny `testing` model, 2 steps,
#                                    # torch.compile's graph capture only (eager)
#
# Ours is `python3 -m vit_jax benchmark` from this checkout (JAX, Flax,
# Optax, Orbax; no TensorFlow); timm's is benchmarks/timm_speed.py on the
# same model, batch and image size (torch.compile, bf16 autocast, fused
# AdamW). It uses what the machine has (the lent GPU machines: Python 3.12,
# JAX 0.11.2, torch, timm), plus ml_collections from benchmarks/wheels/ (pure
# Python, 77 kB) where that is missing. B/16 runs at batch 256, L/16 at 128
# (the same for all codes; FP8 is ours only, timm has none here). The six
# runs share BUDGET seconds (default 540, so the whole check ends within 9
# minutes), each at most 200: one that hangs leaves the others their time,
# and a run that fails or runs out of time shows its last log line in the
# table.
#
# PYTHON (default python3) runs ours, TORCH_PYTHON (default $PYTHON)
# timm's; OUT keeps the JSON results and logs (default: a new temporary
# folder, named at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_PYTHON=${TORCH_PYTHON:-$PYTHON}
out=${OUT:-$(mktemp -d -t gpu_check.XXXXXX)}
mkdir -p "$out"
if [[ ${1:-} == --dry ]]; then  # torch.compile captures the graph only.
  rows=("testing 8 32") steps=2 backend=eager
else
  rows=("ViT-B/16 256 224" "ViT-L/16 128 224") steps=20 backend=inductor
fi
deadline=$((SECONDS + ${BUDGET:-540}))
limit() {  # Seconds the next run may take: 200, or what the budget has left.
  local left=$((deadline - SECONDS))
  echo $((left < 200 ? (left > 1 ? left : 1) : 200))
}
if ! "$PYTHON" -c 'import ml_collections' 2>/dev/null; then
  export PYTHONPATH=$PWD/benchmarks/wheels/ml_collections-1.1.0-py3-none-any.whl${PYTHONPATH:+:$PYTHONPATH}
fi

names=()
for row in "${rows[@]}"; do
  read -r variant batch size <<<"$row"
  name=${variant//\//_}
  names+=("$name")
  echo "== $variant, batch $batch, $size px: ours, then timm" >&2
  timeout "$(limit)" "$PYTHON" -m vit_jax benchmark --variant="$variant" \
    --batch="$batch" --image_size="$size" --dtype=bfloat16 --steps="$steps" \
    --out="$out/$name.ours.json" >"$out/$name.ours.log" 2>&1 ||
    echo "(exit status $?)" >>"$out/$name.ours.log"
  if [[ -f $out/$name.ours.json ]]; then
    timeout "$(limit)" "$TORCH_PYTHON" benchmarks/timm_speed.py \
      --like="$out/$name.ours.json" --steps="$steps" --compile_backend="$backend" \
      --out="$out/$name.timm.json" >"$out/$name.timm.log" 2>&1 ||
      echo "(exit status $?)" >>"$out/$name.timm.log"
  else
    echo "not run: it takes the model and batch from ours" >"$out/$name.timm.log"
  fi
  timeout "$(limit)" "$PYTHON" -m vit_jax benchmark --variant="$variant" \
    --batch="$batch" --image_size="$size" --dtype=bfloat16 --steps="$steps" \
    --fp8 --out="$out/$name.ours-fp8.json" >"$out/$name.ours-fp8.log" 2>&1 ||
    echo "(exit status $?)" >>"$out/$name.ours-fp8.log"
done
"$PYTHON" benchmarks/side_by_side.py "$out" "${names[@]}"
echo "(results and logs: $out)"
