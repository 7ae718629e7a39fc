#!/usr/bin/env bash
# The PyTorch environment (.venv-torch): Python 3.11 with torch's CPU build,
# timm and transformers at the pins of requirements.txt. It runs
# tests/references/generate.py (`make references`) and, in the suite, the
# timm side of `benchmarks/gpu_check.sh --dry`. vit_jax is not installed in
# it (vit_jax needs Python 3.12+, torch's CPU build here is for 3.11).
#
#   tests/references/torch_env.sh [DIR]    # DIR defaults to .venv-torch
#
# On PyPI, Linux's `torch` is the CUDA build (several GB with its
# libraries), so torch must come without an index: this machine kind keeps
# the CPU build for Python 3.11 in /opt/wheels, which PIP_FIND_LINKS names.
# Elsewhere, put the CPU wheel in a folder PIP_FIND_LINKS names (pip
# download torch==VERSION --index-url https://download.pytorch.org/whl/cpu).
# Where there is none, it builds nothing, says so in one line and exits 0;
# the tests that need it are then skipped with that reason. TORCH_PYTHON
# picks the Python (default python3.11). Rerunning keeps an environment
# newer than requirements.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.venv-torch}
requirements=tests/references/requirements.txt
python=${TORCH_PYTHON:-python3.11}
if [[ -f $dir/.installed && $dir/.installed -nt $requirements ]]; then
  exit 0
fi
torch_pin=$(grep -E '^torch==' "$requirements")
skip() {
  rm -rf "$dir"
  echo "Not building $dir: $1; the tests that need PyTorch are skipped." >&2
  exit 0
}
"$python" -c '' 2>/dev/null || skip "there is no $python (set TORCH_PYTHON)"
rm -rf "$dir"
"$python" -m venv "$dir"
"$dir/bin/pip" install --quiet --no-index --no-deps "$torch_pin" 2>/dev/null ||
  skip "pip finds no local build of $torch_pin for $("$python" --version) (PIP_FIND_LINKS)"
"$dir/bin/pip" install --quiet -r "$requirements"
touch "$dir/.installed"
