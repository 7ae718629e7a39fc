#!/usr/bin/env bash
# The worker side of tpu_pod.sh: what it runs on each TPU VM worker over
# ssh, in the repository's copy there (~/vit_jax).
#
#   launch/tpu_worker.sh check           # Python, JAX and the slice's devices
#   launch/tpu_worker.sh idle            # fails if a run is going (setup asks first)
#   launch/tpu_worker.sh start FLAGS...  # vit-jax train --distributed FLAGS, detached
#   launch/tpu_worker.sh status          # running or not; the log's last line
#   launch/tpu_worker.sh stop [SECONDS]  # SIGTERM, then wait for the save and exit
#   launch/tpu_worker.sh mount BUCKET    # gs://BUCKET read-only at ~/data/BUCKET
#
# The run is detached from the ssh session (it survives a dropped
# connection); its output is appended to logs/train.log, its pid kept in
# logs/train.pid. Only process 0 (worker 0) logs progress; the others' logs
# hold their warnings and errors.
set -euo pipefail
cd "$(dirname "$0")/.."
log=logs/train.log
pidfile=logs/train.pid

running() {  # The pid is alive and still ours (pids get reused).
  [[ -s $pidfile ]] && grep -qa vit-jax "/proc/$(cat "$pidfile")/cmdline" 2>/dev/null
}
last_line() { tail -n 1 "$log" 2>/dev/null || echo "(no log yet)"; }
idle() {
  if running; then
    echo "error: a run is going (pid $(cat "$pidfile")); stop it first" >&2
    exit 1
  fi
}

case ${1:-} in
  check)
    # Every worker runs this at once: the TPU runtime and
    # jax.distributed.initialize (what --distributed calls) wait for the
    # whole slice, so a worker that never comes makes the others time out.
    timeout "${VIT_JAX_CHECK_SECONDS:-300}" .venv/bin/python -c '
import platform, jax
jax.distributed.initialize()
here = jax.local_devices()
print(f"Python {platform.python_version()}, JAX {jax.__version__},",
      f"{len(here)} {here[0].device_kind} devices here,",
      f"{jax.device_count()} in {jax.process_count()} processes")'
    ;;
  idle) idle ;;
  mount)
    # TFDS datasets in ArrayRecord files are read by index from local paths
    # only: Cloud Storage FUSE shows the bucket as one, read-only.
    bucket=${2:?name the bucket: mount BUCKET}
    target=$HOME/data/$bucket
    if mountpoint -q "$target"; then
      echo "gs://$bucket is mounted at $target"
      exit 0
    fi
    if ! command -v gcsfuse >/dev/null; then  # Google's apt repository.
      repo=gcsfuse-$(lsb_release -c -s)
      curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg |
        sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null
      echo "deb [signed-by=/usr/share/keyrings/cloud.google.asc]" \
        "https://packages.cloud.google.com/apt $repo main" |
        sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null
      sudo apt-get update -qq && sudo apt-get install -y -qq gcsfuse
    fi
    mkdir -p "$target"
    gcsfuse --implicit-dirs -o ro "$bucket" "$target"
    echo "gs://$bucket mounted at $target"
    ;;
  start)
    shift
    idle
    for flag in "$@"; do  # A bucket that `mount` showed is gone after a reboot.
      case $flag in
        '--config.data_dir=~/data/'* | "--config.data_dir=$HOME/data/"*)
          bucket=${flag#--config.data_dir=}
          bucket=${bucket#\~/data/}
          bucket=${bucket#"$HOME"/data/}
          bucket=${bucket%%/*}
          if ! mountpoint -q "$HOME/data/$bucket"; then
            echo "error: $HOME/data/$bucket is not mounted (the VM restarted?);" \
              "run: launch/tpu_pod.sh mount TPU ZONE $bucket" >&2
            exit 1
          fi
          ;;
      esac
    done
    mkdir -p logs
    echo "== $(date -u +%FT%TZ) vit-jax train --distributed $*" >>"$log"
    nohup setsid .venv/bin/vit-jax train --distributed "$@" >>"$log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    # A mistake in the flags or the config ends the run within seconds.
    sleep "${VIT_JAX_START_SECONDS:-20}"
    if ! running; then
      echo "error: the run ended at once: $(last_line)" >&2
      exit 1
    fi
    echo "running (pid $(cat "$pidfile")), log ~/vit_jax/$log"
    ;;
  status)
    if running; then
      echo "running (pid $(cat "$pidfile")): $(last_line)"
    else
      echo "not running: $(last_line)"
    fi
    ;;
  stop)
    limit=${2:-900}
    if ! running; then
      echo "not running: $(last_line)"
      exit 0
    fi
    pid=$(cat "$pidfile")
    kill -TERM "$pid" || true  # It may have ended since.
    for ((waited = 0; waited < limit; waited += 2)); do
      if ! running; then
        echo "stopped after ${waited} s: $(last_line)"
        exit 0
      fi
      sleep 2
    done
    echo "error: still running ${limit} s after SIGTERM (pid $pid); see ~/vit_jax/$log" >&2
    exit 1
    ;;
  *)
    echo "usage: $0 {check|idle|start FLAGS...|status|stop [SECONDS]|mount BUCKET}" >&2
    exit 2
    ;;
esac
