#!/usr/bin/env bash
# A Cloud TPU pod slice: the same command on every worker over ssh. Needs
# gcloud here, authenticated for the TPU's project.
#
# Once per TPU VM: copy this repository (its committed files) to ~/vit_jax on
# every worker and install it with JAX's TPU build (the `tpu` extra):
#
#   launch/tpu_pod.sh setup TPU_NAME ZONE
#
# Then train; `--distributed` lets jax.distributed.initialize find the other
# workers through the TPU metadata:
#
#   launch/tpu_pod.sh TPU_NAME ZONE --config=configs/pretrain.py:i1k \
#       --workdir=gs://BUCKET/runs/vit_b16_i1k --config.data_dir=gs://BUCKET/tfds
#
# Use gs:// paths: every worker reads the data and writes checkpoint shards.
# A preempted slice sends SIGTERM: all workers save the same step and stop;
# rerunning this command resumes from the last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "setup" ]]; then
  tpu=$2 zone=$3
  archive=$(mktemp --suffix=.tar.gz)
  git archive --format=tar.gz -o "$archive" HEAD
  gcloud compute tpus tpu-vm scp "$archive" "$tpu:~/vit_jax.tar.gz" \
    --zone="$zone" --worker=all
  gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all \
    --command="rm -rf ~/vit_jax && mkdir -p ~/vit_jax \
      && tar -xzf ~/vit_jax.tar.gz -C ~/vit_jax && cd ~/vit_jax \
      && python3 -m venv .venv && .venv/bin/pip install --quiet --upgrade pip \
      && .venv/bin/pip install --quiet -c constraints.txt -e '.[tpu]' \
      && .venv/bin/python -c 'import jax; print(jax.device_count(), \"TPU devices\")'"
  rm -f "$archive"
  exit 0
fi

tpu=$1 zone=$2
shift 2
args=$(printf ' %q' "$@")
gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all \
  --command="cd ~/vit_jax && .venv/bin/vit-jax train --distributed$args"
