#!/usr/bin/env bash
# A Cloud TPU pod slice: the same command on every worker over ssh.
# `--distributed` lets jax.distributed.initialize find the other workers
# through the TPU metadata. Needs gcloud here and this repository, set up
# with `make setup`, at ~/vit_jax on every worker.
#
#   launch/tpu_pod.sh TPU_NAME ZONE --config=configs/pretrain.py:i1k \
#       --workdir=gs://BUCKET/runs/vit_b16_i1k --config.data_dir=gs://BUCKET/tfds
#
# Use gs:// paths: every worker reads the data and writes checkpoint shards.
# A preempted slice sends SIGTERM: the run saves and stops; rerunning this
# command resumes from the last checkpoint.
set -euo pipefail
tpu=$1 zone=$2
shift 2
args=$(printf ' %q' "$@")
gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all \
  --command="cd ~/vit_jax && .venv/bin/python -m vit_jax.main --distributed$args"
