#!/usr/bin/env bash
# Prints the path of a Python that vit_jax runs on (3.12 or newer; JAX 0.11
# and later need it), for `make` and launch/setup_host.sh:
#
#   1. python3, when it is 3.12 or newer;
#   2. else the newest python3.13 / python3.12 on PATH that runs (a pyenv
#      shim of a version pyenv does not have active is on PATH but fails);
#   3. else the newest 3.13 / 3.12 that pyenv has installed
#      ($PYENV_ROOT/versions/*), whether or not it is the active one.
#
# 3.13 and 3.12 are the versions constraints.txt is tested with. Finding
# none, it prints one line naming what to install on stderr and exits 1.
set -uo pipefail
python3_version=""

runs_and_is_new_enough() {  # A command or path that runs and is 3.12+.
  local version major minor
  version=$("$1" --version 2>/dev/null) || return 1  # "Python 3.12.3"
  [[ $1 == python3 ]] && python3_version=$version
  IFS=. read -r major minor _ <<<"${version#Python }"
  [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ ]] &&
    ((major > 3 || (major == 3 && minor >= 12)))
}

if runs_and_is_new_enough python3; then
  command -v python3
  exit 0
fi
for name in python3.13 python3.12; do
  if runs_and_is_new_enough "$name"; then
    command -v "$name"
    exit 0
  fi
done
root=${PYENV_ROOT:-$HOME/.pyenv}
for minor in 13 12; do
  # Newest patch release first (3.13.10 after 3.13.9: a version sort).
  for python in $(printf '%s\n' "$root"/versions/3."$minor".*/bin/python3."$minor" |
    sort -rV); do
    if runs_and_is_new_enough "$python"; then
      echo "$python"
      exit 0
    fi
  done
done
echo "error: vit_jax needs Python 3.12 or newer and found none here" \
  "(python3 is ${python3_version:-missing});" \
  "install python3.13 or python3.12 (e.g. 'uv python install 3.13'," \
  "'pyenv install 3.13', or 'apt-get install python3.12-venv')," \
  "or name one with PYTHON=/path/to/python3." >&2
exit 1
