#!/usr/bin/env bash
# The CPU speed sweep: XLA's CPU options and our own choices on ViT-Ti/16
# and ViT-S/16 training (224 px, batch 32, fp32, Adam, 20 steps) and on
# `predict`'s jitted forward (batch 1 and 32), each against the default of
# the same sitting and against timm on this machine, as one table
# (images/s, x default, x timm, the loss after 20 steps or the largest
# logit difference, a verdict) and one JSON (OUT/sweep.json).
#
#   benchmarks/cpu_sweep.sh          # 2 CPU cores: all in about 75 minutes
#   benchmarks/cpu_sweep.sh --dry    # the tiny `testing` model, 3 steps
#
# The candidates and their order are benchmarks/cpu_sweep.py's. Ours run in
# one process (one start of JAX; XLA's options per compiled step), which
# stops starting candidates when BUDGET seconds (default 3000) are nearly
# spent; a process that dies in one is followed by another that goes on
# from the next. timm (benchmarks/timm_cpu.py, eager, as timm users run it
# on a CPU) runs before ours and again after, and the faster of its two
# runs counts. PYTHON (default .venv/bin/python) runs ours, TORCH_PYTHON
# (default .venv-torch/bin/python, which `make test` builds) timm's; OUT
# keeps the JSON and logs (default: a new temporary folder, named at the
# end).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
TORCH_PYTHON=${TORCH_PYTHON:-.venv-torch/bin/python}
dry=()
case ${1:-} in
  "") ;;
  --dry) dry=(--dry) ;;
  *) echo "usage: $0 [--dry]  (OUT=DIR keeps the results)" >&2; exit 2 ;;
esac
out=${OUT:-$(mktemp -d -t cpu_sweep.XXXXXX)}
mkdir -p "$out"
deadline=$((SECONDS + ${BUDGET:-3000}))

timm() {  # timm's runs, tagged $1; the table says where they are missing.
  if [[ ! -x $TORCH_PYTHON ]]; then
    echo "no $TORCH_PYTHON (make torch-env): timm not run" >>"$out/timm.log"
    return
  fi
  "$TORCH_PYTHON" benchmarks/timm_cpu.py --out="$out" --tag="$1" "${dry[@]}" \
    >>"$out/timm.log" 2>&1 || echo "timm's $1 runs failed: $out/timm.log" >&2
}

timm timm
source benchmarks/sweep_loop.sh
run_candidates "$PYTHON" benchmarks/cpu_sweep.py "$out" "$deadline" "${dry[@]}"
timm timm_again
read -ra names < <("$PYTHON" benchmarks/cpu_sweep.py --names "${dry[@]}")
"$PYTHON" benchmarks/cpu_sweep_table.py "$out" "${names[@]}"
echo "(results and logs: $out)"
