#!/usr/bin/env bash
# Cloud TPU VM slices (one or several) driven from your workstation:
#
#   launch/tpu_pod.sh setup  TPU ZONE           # once, and after changing the code
#   launch/tpu_pod.sh train  TPU ZONE FLAGS...  # start `vit-jax train` on every worker
#   launch/tpu_pod.sh logs   TPU ZONE [WORKER]  # follow a worker's log (default 0)
#   launch/tpu_pod.sh status TPU ZONE           # each worker: running or not
#   launch/tpu_pod.sh stop   TPU ZONE           # all save the same step and exit
#   launch/tpu_pod.sh mount  TPU ZONE BUCKET    # gs://BUCKET read-only at ~/data/BUCKET
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
# preemption or a crash, run the same `train` command again. TFDS datasets
# in ArrayRecord files (read by index) need a local path: `mount` shows a
# bucket read-only at ~/data/BUCKET on every worker (Cloud Storage FUSE,
# installed where missing); pass --config.data_dir=~/data/BUCKET/tfds.
#
# Commands that touch the workers run on all of them at once and print one
# line per worker; if any fails, one line names the workers that failed and
# the folder that keeps each worker's whole output.
#
# Several slices (Multislice: the batch split across slices, joined over the
# data-centre network) come from a queued resource. It names its slices
# PREFIX-0 .. PREFIX-(N-1) and tells their workers how to join (the
# MEGASCALE_* values in each VM's metadata, which jax.distributed.initialize
# reads); all slices have the one accelerator type:
#
#   gcloud compute tpus queued-resources create my-run --zone=ZONE \
#     --accelerator-type=v5litepod-16 --runtime-version=v2-alpha-tpuv5-lite \
#     --node-count=2 --node-prefix=my-run
#   gcloud compute tpus queued-resources describe my-run --zone=ZONE  # ACTIVE?
#   launch/tpu_pod.sh setup my-run-0,my-run-1 ZONE
#
# Name the slices comma-separated, slice 0 first, in every command: each
# runs on every worker of every slice, and worker S/W is worker W of the
# S-th slice named (`logs my-run-0,my-run-1 ZONE 1/0`; default 0/0).
set -euo pipefail
cd "$(dirname "$0")/.."

if (($# < 3)); then
  sed -n '4,9s/^# //p' "$0" >&2
  exit 2
fi
command=$1 tpus=$2 zone=$3
shift 3
case $command in
  setup | train | logs | status | stop | mount) ;;
  *)
    echo "error: unknown command '$command'; use setup, train, logs, status, stop or mount" >&2
    exit 2
    ;;
esac
if [[ ,$tpus, == *,,* ]]; then
  echo "error: '$tpus': name the TPU, or its slices comma-separated" >&2
  exit 2
fi
IFS=, read -r -a slices <<<"$tpus"

ssh_to() {  # SLICE WORKER COMMAND (SLICE: its place in `slices`)
  gcloud compute tpus tpu-vm ssh "${slices[$1]}" --zone="$zone" \
    --worker="$2" --quiet --command="$3"
}

# Runs COMMAND on every worker at once; returns 1, having named the workers
# that failed, if any did. Leaves the others' places in `succeeded`.
on_every_worker() {  # WHAT COMMAND
  local what=$1 command=$2 outputs i pids=() failed=()
  succeeded=()
  outputs=$(mktemp -d)
  for ((i = 0; i < ${#ids[@]}; i++)); do
    ssh_to "$((i / workers))" "$((i % workers))" "$command" \
      >"$outputs/worker${ids[i]//\//-}.txt" 2>&1 </dev/null &
    pids+=($!)
  done
  for ((i = 0; i < ${#ids[@]}; i++)); do
    if wait "${pids[i]}"; then
      echo "worker ${ids[i]}: $(tail -n 1 "$outputs/worker${ids[i]//\//-}.txt")"
      succeeded+=("$i")
    else
      failed+=("${ids[i]}")
    fi
  done
  if ((${#failed[@]} == 0)); then
    rm -rf "$outputs"
    return 0
  fi
  local first=${failed[0]} names
  names=$(IFS=,; echo "${failed[*]}")
  echo "error: $what failed on worker $names of ${#ids[@]} (worker $first:" \
    "$(grep -v '^[[:space:]]*$' "$outputs/worker${first//\//-}.txt" |
      tail -n 1)); each worker's output is in $outputs" >&2
  return 1
}

workers=""
for tpu in "${slices[@]}"; do
  read -r state count <<<"$(gcloud compute tpus tpu-vm describe "$tpu" \
    --zone="$zone" --format='value(state,networkEndpoints.len())')"
  if [[ $state != READY || ${count:-0} -lt 1 ]]; then
    echo "error: $tpu is ${state:-not found}, not READY; wait until" \
      "'gcloud compute tpus tpu-vm describe $tpu --zone=$zone' says READY" >&2
    exit 1
  fi
  if [[ -n $workers && $count != "$workers" ]]; then
    echo "error: $tpu has $count workers and ${slices[0]} $workers; the" \
      "slices of a run are of one accelerator type" >&2
    exit 1
  fi
  workers=$count
done
# Every worker's name here: W on one slice, S/W on several.
ids=()
for ((i = 0; i < ${#slices[@]} * workers; i++)); do
  if ((${#slices[@]} == 1)); then
    ids+=("$i")
  else
    ids+=("$((i / workers))/$((i % workers))")
  fi
done
if ((${#slices[@]} == 1)); then
  echo "$tpus: $workers workers."
else
  echo "$tpus: ${#slices[@]} slices of $workers workers."
fi
# gcloud makes its ssh key on first use; one call first, so that the
# parallel ones do not all make it at once.
if [[ ! -f ~/.ssh/google_compute_engine ]]; then
  ssh_to 0 0 true
fi

case $command in
  setup)
    if [[ -n $(git status --porcelain) ]]; then
      echo "Note: uncommitted changes and untracked files are not copied" \
        "(git archive HEAD)."
    fi
    archive=$(mktemp -d)/vit_jax.tar.gz
    git archive --format=tar.gz -o "$archive" HEAD
    for tpu in "${slices[@]}"; do
      gcloud compute tpus tpu-vm scp "$archive" "$tpu:~/vit_jax.tar.gz" \
        --zone="$zone" --worker=all --quiet
    done
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
      for i in ${succeeded[@]+"${succeeded[@]}"}; do
        ssh_to "$((i / workers))" "$((i % workers))" \
          "~/vit_jax/launch/tpu_worker.sh stop 60" >/dev/null 2>&1 &
      done
      wait
      exit 1
    fi
    echo "Follow it: $0 logs $tpus $zone"
    ;;
  logs)
    worker=${1:-0} slice=0
    if [[ $worker == */* ]]; then
      slice=${worker%%/*} worker=${worker#*/}
    fi
    if ! [[ $slice =~ ^[0-9]+$ && $worker =~ ^[0-9]+$ ]] ||
      ((slice >= ${#slices[@]} || worker >= workers)); then
      echo "error: no worker ${1:-0}; use W (0-$((workers - 1)))" \
        "or, on several slices, S/W" >&2
      exit 2
    fi
    ssh_to "$slice" "$worker" "tail -n 100 -F ~/vit_jax/logs/train.log"
    ;;
  status)
    on_every_worker status "~/vit_jax/launch/tpu_worker.sh status"
    ;;
  mount)
    if (($# != 1)); then
      echo "error: name one bucket (no gs://): mount TPU ZONE BUCKET" >&2
      exit 2
    fi
    on_every_worker mount "~/vit_jax/launch/tpu_worker.sh mount $(printf %q "$1")"
    ;;
  stop)
    on_every_worker stop "~/vit_jax/launch/tpu_worker.sh stop"
    echo "Stopped. The same train command resumes from the last checkpoint."
    ;;
esac
