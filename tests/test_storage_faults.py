"""Object storage that fails some requests (HTTP 503/429, reset
connections, slow answers) costs retries, never a checkpoint: training,
resuming and loading weights by URL through `helpers/faulty_proxy.py` in
front of fake-gcs-server end as they do without faults; storage that stays
broken stops a run with one line naming the last step saved.
"""

import hashlib
import os
import signal
import subprocess
import sys
import time

import fsspec
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.helpers import faulty_proxy
from tests.helpers import gcs_server
from vit_jax import paths

pytestmark = pytest.mark.xdist_group("gcs")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 40
SHARE = 0.1  # Of the requests, failed (at most MAX_FAULTS per run).
MAX_FAULTS = 40


@pytest.fixture(scope="module")
def gcs():
  with gcs_server.serving("bucket") as server:
    yield server


def _train(storage_url, workdir, data_dir, kill_after_step=None, steps=STEPS,
           every=20, gcs=None):
  """`vit-jax train` with its storage at `storage_url`; SIGKILLs it once
  that step is committed in `gcs`'s bucket (seen past the proxy). Returns
  (returncode, stdout, stderr)."""
  cmd = [
      sys.executable, "-m", "vit_jax", "train",
      "--config=configs/digits.py:runlocal", f"--workdir={workdir}",
      f"--config.data_dir={data_dir}", f"--config.total_steps={steps}",
      f"--config.checkpoint_every_steps={every}",
      f"--config.log_every_steps={every}", "--config.eval_every_steps=0"
  ]
  env = {**os.environ, "STORAGE_EMULATOR_HOST": storage_url, "XLA_FLAGS": ""}
  env.pop("TENSORSTORE_GCS_HTTP_URL", None)  # configure_storage sets it.
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  if kill_after_step is None:
    stdout, stderr = proc.communicate(timeout=400)
    return proc.returncode, stdout, stderr
  prefix = workdir[len("gs://bucket/"):]
  deadline = time.time() + 300
  while (kill_after_step not in _complete_steps(gcs, prefix) and
         proc.poll() is None):
    assert time.time() < deadline, "no checkpoint appeared in the bucket"
    time.sleep(0.05)
  proc.kill()
  stdout, stderr = proc.communicate(timeout=60)
  return proc.returncode, stdout, stderr


def _params(workdir, step=STEPS):
  path = paths.resolve(workdir) / "checkpoints" / str(step) / "default"
  return ocp.StandardCheckpointer().restore(path)["params"]


def _complete_steps(gcs, prefix) -> list[int]:
  """Steps whose folder Orbax committed (its commit_success.txt)."""
  return sorted(
      int(o.split("/")[-2])
      for o in gcs.list("bucket", f"{prefix}/checkpoints/")
      if o.endswith("/commit_success.txt") and o.count("/") == 3)


def test_training_and_resuming_through_flaky_storage_loses_nothing(
    gcs, tfds_data_dir):
  code, _, err = _train(gcs.url, "gs://bucket/calm", tfds_data_dir)
  assert code == 0, err[-3000:]
  proxy = faulty_proxy.FaultyProxy(gcs.url, share=SHARE,
                                   max_faults=MAX_FAULTS).start()
  try:
    code, _, err = _train(proxy.url, "gs://bucket/flaky", tfds_data_dir,
                          kill_after_step=20, gcs=gcs)
    assert code == -signal.SIGKILL, err[-3000:]
    first = dict(proxy.counts)
    # What a resume would take is complete: Orbax's manager lists no step
    # that lacks its commit.
    listed = ocp.CheckpointManager(
        paths.resolve("gs://bucket/flaky/checkpoints")).all_steps()
    assert 20 in listed and set(listed) <= set(_complete_steps(gcs, "flaky"))
    # This process's listing is stale once the run goes on; epath's
    # filesystem (made with these arguments) keeps it: forget it.
    fsspec.filesystem("gcs", finalize_on_close=True).invalidate_cache()
    code, _, err = _train(proxy.url, "gs://bucket/flaky", tfds_data_dir)
    assert code == 0, err[-3000:]
  finally:
    proxy.stop()
  print("faults injected:", first, "then", dict(proxy.counts))
  assert sum(proxy.counts[k] for k in faulty_proxy.KINDS) > 5
  jax.tree.map(np.testing.assert_array_equal, _params("gs://bucket/flaky"),
               _params("gs://bucket/calm"))


def test_weights_by_url_load_through_flaky_storage(gcs, tmp_path):
  rng = np.random.default_rng(0)
  tensors = {f"block_{i}/kernel": rng.normal(size=(64, 64)) for i in range(8)}
  local = tmp_path / "weights.npz"
  np.savez(local, **tensors)
  digest = hashlib.sha256(local.read_bytes()).hexdigest()
  subprocess.run([
      sys.executable, "-c", "import fsspec, sys; fs, p = "
      "fsspec.core.url_to_fs(sys.argv[2]); fs.put(sys.argv[1], p)",
      str(local), "gs://bucket/weights/w.npz"
  ], env={
      **os.environ, "STORAGE_EMULATOR_HOST": gcs.url
  }, check=True, timeout=60)
  proxy = faulty_proxy.FaultyProxy(gcs.url, share=0.3, max_faults=10,
                                   seed=1).start()
  try:
    done = subprocess.run(
        [
            sys.executable, "-c", "import sys; from vit_jax import paths; "
            "paths.configure_storage(); from vit_jax.weights import formats; "
            "fmt, t = formats.read(sys.argv[1]); "
            "print(fmt, sorted((k, float(v.sum())) for k, v in t.items()))",
            "gs://bucket/weights/w.npz"
        ], cwd=REPO, env={
            **os.environ, "STORAGE_EMULATOR_HOST": proxy.url,
            "VIT_JAX_CACHE_DIR": str(tmp_path / "cache")
        }, capture_output=True, text=True, timeout=300)
  finally:
    proxy.stop()
  assert done.returncode == 0, done.stderr[-3000:]
  print("faults injected:", dict(proxy.counts))
  assert sum(proxy.counts[k] for k in faulty_proxy.KINDS) >= 1
  expected = sorted((k, float(v.sum())) for k, v in tensors.items())
  assert done.stdout.strip() == f"npz {expected}"
  copy = tmp_path / "cache/gs/bucket/weights/w.npz"
  assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest


def test_a_save_that_keeps_failing_stops_the_run_naming_the_last_saved(
    gcs, tfds_data_dir):
  proxy = faulty_proxy.FaultyProxy(
      gcs.url, share=0, always=r"broken%2Fcheckpoints%2F4%2F|"
      r"broken/checkpoints/4/").start()
  try:
    code, _, err = _train(proxy.url, "gs://bucket/broken", tfds_data_dir,
                          steps=6, every=2)
  finally:
    proxy.stop()
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  assert code == 75, err[-3000:]
  assert len(errors) == 1, err[-3000:]
  assert errors[0].startswith(
      "error: The checkpoint of step 4 could not be saved to "
      "gs://bucket/broken/checkpoints (")
  assert errors[0].endswith(
      "); the last checkpoint saved is step 2. Rerun to resume from it once "
      "the storage works.")
  assert _complete_steps(gcs, "broken") == [2]
