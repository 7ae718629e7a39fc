#!/usr/bin/env bash
# Several processes on this machine, as if they were hosts of a pod: each
# gets its own fake CPU devices and they talk through JAX's CPU collectives
# on localhost. The way to try multi-host behaviour without a cluster.
#
#   launch/local.sh NUM_PROCESSES DEVICES_PER_PROCESS WORKDIR [main.py flags]
#   launch/local.sh 2 4 /tmp/two_hosts --config=configs/digits.py:runlocal
#
# Only process 0 prints and writes metrics; all write their checkpoint shards.
set -euo pipefail
cd "$(dirname "$0")/.."
num_processes=$1 devices=$2 workdir=$3
shift 3
port=$((20000 + RANDOM % 20000))
pids=()
for ((i = 0; i < num_processes; i++)); do
  XLA_FLAGS="--xla_force_host_platform_device_count=$devices" \
    .venv/bin/vit-jax train --workdir="$workdir" \
    --coordinator_address="localhost:$port" --num_processes="$num_processes" \
    --process_id="$i" "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
