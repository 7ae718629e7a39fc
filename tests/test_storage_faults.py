"""Object storage that fails some requests (HTTP 503/429, reset
connections, slow answers) costs retries, never a checkpoint: a run killed
and resumed, and loading weights by URL, through `helpers/faulty_proxy.py`
in front of fake-gcs-server end as they do without faults; storage that
stays broken stops a run with one line naming the last step saved.
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
from tests.helpers import processes
from vit_jax import paths
from vit_jax import weights

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
           every=20, gcs=None, model=()):
  """`vit-jax train` with its storage at `storage_url` (and `model`'s
  overrides); SIGKILLs it once that step is committed in `gcs`'s bucket
  (seen past the proxy). Returns (returncode, stdout, stderr)."""
  cmd = [
      sys.executable, "-m", "vit_jax", "train",
      "--config=configs/digits.py:runlocal", f"--workdir={workdir}",
      f"--config.data_dir={data_dir}", f"--config.total_steps={steps}",
      f"--config.checkpoint_every_steps={every}",
      f"--config.log_every_steps={every}", "--config.eval_every_steps=0", *model
  ]
  env = processes.command_env(STORAGE_EMULATOR_HOST=storage_url)
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


def _state(workdir, step=STEPS):
  """(params, their average) saved at `step`."""
  path = paths.resolve(workdir) / "checkpoints" / str(step) / "default"
  saved = ocp.StandardCheckpointer().restore(path)
  return saved["params"], saved["ema_params"]


def _complete_steps(gcs, prefix) -> list[int]:
  """Steps whose folder Orbax committed (its commit_success.txt)."""
  return sorted(
      int(o.split("/")[-2])
      for o in gcs.list("bucket", f"{prefix}/checkpoints/")
      if o.endswith("/commit_success.txt") and o.count("/") == 3)


# The run of the killed-and-resumed test: its average and dropout must be
# resumed too.
_MODEL = ("--config.model.variant=digits", "--config.ema_decay=0.99",
          "--config.model.dropout_rate=0.1")


def test_a_run_killed_on_flaky_storage_resumes_from_the_bucket_bit_identically(
    gcs, tfds_data_dir):
  """A run on gs:// keeps everything in the bucket. Another, through storage
  that fails a tenth of its requests, is killed (SIGKILL) once step 20 is
  committed, and resumes from the bucket: it ends with the first run's
  parameters, average and final loss, bit for bit."""
  code, reference, err = _train(gcs.url, "gs://bucket/whole", tfds_data_dir,
                                model=_MODEL)
  assert code == 0, err[-3000:]
  objects = gcs.list("bucket", "whole/")
  assert "whole/config.json" in objects
  assert any(o.startswith("whole/events.out.tfevents.") for o in objects)
  assert f"whole/checkpoints/{STEPS}/commit_success.txt" in objects
  assert not os.path.exists(os.path.join(REPO, "gs:"))  # Nothing local.

  proxy = faulty_proxy.FaultyProxy(gcs.url, share=SHARE,
                                   max_faults=MAX_FAULTS).start()
  try:
    code, _, err = _train(proxy.url, "gs://bucket/cut", tfds_data_dir,
                          kill_after_step=20, gcs=gcs, model=_MODEL)
    assert code == -signal.SIGKILL, err[-3000:]
    first = dict(proxy.counts)
    # What a resume would take is complete: Orbax's manager lists no step
    # that lacks its commit.
    listed = ocp.CheckpointManager(
        paths.resolve("gs://bucket/cut/checkpoints")).all_steps()
    assert 20 in listed and set(listed) <= set(_complete_steps(gcs, "cut"))
    # This process's listing is stale once the run goes on; epath's
    # filesystem (made with these arguments) keeps it: forget it.
    fsspec.filesystem("gcs", finalize_on_close=True).invalidate_cache()
    code, resumed, err = _train(proxy.url, "gs://bucket/cut", tfds_data_dir,
                                model=_MODEL)
    assert code == 0, err[-3000:]
  finally:
    proxy.stop()
  print("faults injected:", first, "then", dict(proxy.counts))
  assert sum(proxy.counts[k] for k in faulty_proxy.KINDS) > 5
  assert "Resuming at step" in err and "gs://bucket/cut" in err
  final = lambda text: text.strip().splitlines()[-1]
  assert final(resumed) == final(reference)
  jax.tree.map(np.testing.assert_array_equal, _state("gs://bucket/cut"),
               _state("gs://bucket/whole"))
  # Both runs' metrics are kept: the resumed run writes new event files.
  events = [o for o in gcs.list("bucket", "cut/") if "tfevents" in o]
  assert len(events) == 2, events

  # Fine-tuning from the bucket reads the parameters' average, nothing else.
  fmt, tensors = weights.read_file("gs://bucket/whole")
  assert fmt == "orbax"
  ema = _state("gs://bucket/whole")[1]
  np.testing.assert_array_equal(tensors["head/kernel"], ema["head"]["kernel"])
  assert len(tensors) == len(jax.tree.leaves(ema))
  assert not any(k.startswith(("opt_state", "step")) for k in tensors)


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
            "paths.configure_storage(); from vit_jax import weights; "
            "fmt, t = weights.read_file(sys.argv[1]); "
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
