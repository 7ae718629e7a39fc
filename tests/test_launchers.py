"""The TPU-pod launcher, with a stand-in `gcloud` that records its calls."""

import os
import subprocess
import tarfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAKE_GCLOUD = """#!/usr/bin/env bash
# Records each call; keeps a copy of what `scp` would upload.
printf '%s\\n' "$*" >> "$GCLOUD_LOG"
if [[ "$4" == "scp" ]]; then cp "$5" "$GCLOUD_LOG.upload"; fi
"""


def _run(tmp_path, *args):
  fake = tmp_path / "bin" / "gcloud"
  fake.parent.mkdir()
  fake.write_text(FAKE_GCLOUD)
  fake.chmod(0o755)
  log = tmp_path / "gcloud.log"
  env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}",
         "GCLOUD_LOG": str(log)}
  done = subprocess.run([os.path.join(REPO, "launch", "tpu_pod.sh"), *args],
                        env=env, capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  return log.read_text().splitlines(), log


def test_setup_copies_the_repository_and_installs_the_tpu_extra(tmp_path):
  calls, log = _run(tmp_path, "setup", "my-tpu", "us-central2-b")
  assert len(calls) == 2
  assert calls[0].startswith("compute tpus tpu-vm scp ")
  assert "my-tpu:~/vit_jax.tar.gz --zone=us-central2-b --worker=all" in calls[0]
  with tarfile.open(f"{log}.upload") as archive:
    names = archive.getnames()
  assert "setup.py" in names and "vit_jax/train.py" in names
  assert calls[1].startswith("compute tpus tpu-vm ssh my-tpu")
  assert "--worker=all" in calls[1]
  assert "pip install --quiet -c constraints.txt -e '.[tpu]'" in calls[1]


def test_run_starts_the_same_distributed_command_on_every_worker(tmp_path):
  calls, _ = _run(tmp_path, "my-tpu", "europe-west4-a",
                  "--config=configs/pretrain.py:i1k",
                  "--workdir=gs://b/run one")
  assert len(calls) == 1
  assert "--worker=all" in calls[0]
  assert ("cd ~/vit_jax && .venv/bin/vit-jax train --distributed "
          "--config=configs/pretrain.py:i1k --workdir=gs://b/run\\ one"
          in calls[0])
