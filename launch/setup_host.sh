#!/usr/bin/env bash
# Installs this repository into .venv on this host, with JAX's build for its
# accelerator, on a Python new enough for it. Run it on every machine that
# trains (tpu_pod.sh setup does so on each TPU VM worker) or, for SLURM, once
# from a login node onto the filesystem the nodes share:
#
#   launch/setup_host.sh tpu      # a TPU VM: jax[tpu] with its libtpu
#   launch/setup_host.sh cuda     # NVIDIA GPUs: jax[cuda12] with its CUDA libraries
#   launch/setup_host.sh cuda13   # the same on CUDA 13 (driver 580 or newer)
#   launch/setup_host.sh          # CPU only
#
# JAX 0.11 and later need Python 3.12 or newer. The venv is made from the
# Python launch/find_python.sh finds (as `make` does: python3 if it is new
# enough, else python3.13 / python3.12 on PATH or under pyenv). Where there
# is none (Google's TPU VM images are Ubuntu 22.04, whose python3 is 3.10)
# uv, installed from PyPI with the host's pip unless it is on PATH already,
# fetches a standalone CPython $VIT_JAX_PYTHON (default 3.13, the version
# CI tests constraints.txt on) into ~/.local/share/uv and makes the venv
# from it: no root, no apt. Rerunning keeps a .venv that is new enough and
# updates what it holds.
#
# Prints one line at the end: Python and JAX versions in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=${1:-}
want=${VIT_JAX_PYTHON:-3.13}

new_enough() {  # "Python 3.10.12" -> status 0 when >= 3.12
  local major minor
  IFS=. read -r major minor _ <<<"${1#Python }"
  [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ ]] &&
    ((major > 3 || (major == 3 && minor >= 12)))
}

if [[ -x .venv/bin/python ]] && new_enough "$(.venv/bin/python --version 2>&1)"; then
  echo "Keeping .venv ($(.venv/bin/python --version 2>&1))."
elif python=$(launch/find_python.sh 2>/dev/null); then
  rm -rf .venv
  if ! "$python" -m venv .venv; then
    echo "error: '$python -m venv' failed on $(hostname); install the" \
      "venv module (Debian/Ubuntu: sudo apt-get install python3-venv)." >&2
    exit 1
  fi
else
  host_python=$(python3 --version 2>&1 || echo "No python3")
  echo "$host_python here; JAX needs 3.12+: fetching CPython $want with uv."
  uv=$(command -v uv || echo "$HOME/.local/bin/uv")
  if [[ ! -x $uv ]] && ! python3 -m pip install --quiet --user uv; then
    echo "error: could not install uv with $(hostname)'s pip; install" \
      "uv (https://docs.astral.sh/uv/) or Python $want, then rerun." >&2
    exit 1
  fi
  rm -rf .venv
  "$uv" python install "$want"
  "$uv" venv --seed --python "$want" .venv
fi

.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet -c constraints.txt -e ".${extra:+[$extra]}"
.venv/bin/python -c 'import platform, jax
print(f"Python {platform.python_version()}, JAX {jax.__version__}")'
