#!/usr/bin/env bash
# A Cloud TPU VM slice (one worker or many), driven from your workstation:
#
#   launch/tpu_pod.sh setup  TPU ZONE           # once, and after changing the code
#   launch/tpu_pod.sh train  TPU ZONE FLAGS...  # start `vit-jax train` on every worker
#   launch/tpu_pod.sh logs   TPU ZONE [WORKER]  # follow a worker's log (default 0)
#   launch/tpu_pod.sh status TPU ZONE           # each worker: running or not
#   launch/tpu_pod.sh stop   TPU ZONE           # all save the same step and exit
#
# Needs gcloud, authenticated, with the TPU's project set (gcloud config set
# project PROJECT). `setup` copies this repository's committed files to
# ~/vit_jax on every worker (keeping its .venv and logs) and runs
# launch/setup_host.sh tpu there, which brings its own CPython 3.13 where the
# image has no Python 3.12+ (Ubuntu 22.04 images: 3.10); then every worker
# prints its Python, JAX and devices, found together through
# jax.distributed.initialize. `train` starts `vit-jax train --distributed
# FLAGS` detached on every worker (launch/tpu_worker.sh), so it survives a
# closed laptop; use gs:// for --workdir and the data, since every worker
# reads data and writes checkpoint shards. To resume after `stop`, a
# preemption or a crash, run the same `train` command again.
#
# Commands that touch the workers run on all of them at once and print one
# line per worker; if any fails, one line names the workers that failed and
# the folder that keeps each worker's whole output.
set -euo pipefail
cd "$(dirname "$0")/.."

if (($# < 3)); then
  sed -n '3,7s/^# //p' "$0" >&2
  exit 2
fi
command=$1 tpu=$2 zone=$3
shift 3
case $command in
  setup | train | logs | status | stop) ;;
  *)
    echo "error: unknown command '$command'; use setup, train, logs, status or stop" >&2
    exit 2
    ;;
esac

ssh_to() {  # WORKER COMMAND
  gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker="$1" \
    --quiet --command="$2"
}

# Runs COMMAND on every worker at once; returns 1, having named the workers
# that failed, if any did. Leaves the others' numbers in `succeeded`.
on_every_worker() {  # WHAT COMMAND
  local what=$1 command=$2 outputs w pids=() failed=()
  succeeded=()
  outputs=$(mktemp -d)
  for ((w = 0; w < workers; w++)); do
    ssh_to "$w" "$command" >"$outputs/worker$w.txt" 2>&1 </dev/null &
    pids+=($!)
  done
  for ((w = 0; w < workers; w++)); do
    if wait "${pids[w]}"; then
      echo "worker $w: $(tail -n 1 "$outputs/worker$w.txt")"
      succeeded+=("$w")
    else
      failed+=("$w")
    fi
  done
  if ((${#failed[@]} == 0)); then
    rm -rf "$outputs"
    return 0
  fi
  local first=${failed[0]} names
  names=$(IFS=,; echo "${failed[*]}")
  echo "error: $what failed on worker $names of $workers (worker $first:" \
    "$(grep -v '^[[:space:]]*$' "$outputs/worker$first.txt" | tail -n 1));" \
    "each worker's output is in $outputs" >&2
  return 1
}

read -r state workers <<<"$(gcloud compute tpus tpu-vm describe "$tpu" \
  --zone="$zone" --format='value(state,networkEndpoints.len())')"
if [[ $state != READY || ${workers:-0} -lt 1 ]]; then
  echo "error: $tpu is ${state:-not found}, not READY; wait until" \
    "'gcloud compute tpus tpu-vm describe $tpu --zone=$zone' says READY" >&2
  exit 1
fi
echo "$tpu: $workers workers."
# gcloud makes its ssh key on first use; one call first, so that the
# parallel ones do not all make it at once.
if [[ ! -f ~/.ssh/google_compute_engine ]]; then
  ssh_to 0 true
fi

case $command in
  setup)
    if [[ -n $(git status --porcelain) ]]; then
      echo "Note: uncommitted changes and untracked files are not copied" \
        "(git archive HEAD)."
    fi
    archive=$(mktemp -d)/vit_jax.tar.gz
    git archive --format=tar.gz -o "$archive" HEAD
    gcloud compute tpus tpu-vm scp "$archive" "$tpu:~/vit_jax.tar.gz" \
      --zone="$zone" --worker=all --quiet
    rm -rf "$(dirname "$archive")"
    on_every_worker setup "set -e; mkdir -p ~/vit_jax; cd ~/vit_jax
      if [[ -x launch/tpu_worker.sh ]]; then launch/tpu_worker.sh idle; fi
      find . -mindepth 1 -maxdepth 1 ! -name .venv ! -name logs -exec rm -rf {} +
      tar -xzf ~/vit_jax.tar.gz
      rm ~/vit_jax.tar.gz
      launch/setup_host.sh tpu"
    on_every_worker "the device check" "~/vit_jax/launch/tpu_worker.sh check"
    ;;
  train)
    flags=""
    if (($# > 0)); then
      flags=$(printf ' %q' "$@")
    fi
    if ! on_every_worker train "~/vit_jax/launch/tpu_worker.sh start$flags"; then
      # Those that started would wait for the others until they time out.
      for w in ${succeeded[@]+"${succeeded[@]}"}; do
        ssh_to "$w" "~/vit_jax/launch/tpu_worker.sh stop 60" >/dev/null 2>&1 &
      done
      wait
      exit 1
    fi
    echo "Follow it: $0 logs $tpu $zone"
    ;;
  logs)
    ssh_to "${1:-0}" "tail -n 100 -F ~/vit_jax/logs/train.log"
    ;;
  status)
    on_every_worker status "~/vit_jax/launch/tpu_worker.sh status"
    ;;
  stop)
    on_every_worker stop "~/vit_jax/launch/tpu_worker.sh stop"
    echo "Stopped. The same train command resumes from the last checkpoint."
    ;;
esac
