"""Workdirs and data on object storage, against a real GCS server.

The server is fake-gcs-server on 127.0.0.1; the code under test only sees
STORAGE_EMULATOR_HOST, as a user trying it locally would set.
"""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from PIL import Image
import pytest

from tests.helpers import gcs_server
from vit_jax import paths
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.fewshot import sweep
from vit_jax.weights import formats

pytestmark = pytest.mark.xdist_group("gcs")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 40


@pytest.fixture(scope="module")
def gcs():
  with gcs_server.serving("bucket") as server:
    yield server


def _train(gcs, workdir, data_dir, kill_after_checkpoint=None):
  """Runs main on `workdir`; SIGKILLs it once that checkpoint is committed
  in the bucket. Returns (returncode, stdout, stderr)."""
  cmd = [
      sys.executable, "-m", "vit_jax", "train",
      "--config=configs/digits.py:runlocal", f"--workdir={workdir}",
      f"--config.data_dir={data_dir}", "--config.model.variant=digits",
      f"--config.total_steps={STEPS}", "--config.checkpoint_every_steps=20",
      "--config.log_every_steps=20", "--config.ema_decay=0.99",
      "--config.model.dropout_rate=0.1"
  ]
  proc = subprocess.Popen(cmd, cwd=REPO, env={
      **gcs.env(), "XLA_FLAGS": ""
  }, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  if kill_after_checkpoint is not None:
    prefix = workdir[len("gs://bucket/"):]
    # On GCS, Orbax commits a step by writing this file last.
    marker = f"{prefix}/checkpoints/{kill_after_checkpoint}/commit_success.txt"
    deadline = time.time() + 240
    while marker not in gcs.list("bucket", prefix) and proc.poll() is None:
      assert time.time() < deadline, "no checkpoint appeared in the bucket"
      time.sleep(0.05)
    proc.kill()
  stdout, stderr = proc.communicate(timeout=300)
  return proc.returncode, stdout, stderr


def _final_state(workdir):
  path = paths.resolve(workdir) / "checkpoints" / str(STEPS) / "default"
  saved = ocp.StandardCheckpointer().restore(path)
  return saved["params"], saved["ema_params"]


def test_a_killed_run_resumes_from_the_bucket_bit_identically(
    gcs, tfds_data_dir, tmp_path):
  code, reference, err = _train(gcs, "gs://bucket/whole", tfds_data_dir)
  assert code == 0, err[-3000:]
  objects = gcs.list("bucket", "whole/")
  assert "whole/config.json" in objects
  assert any(o.startswith("whole/events.out.tfevents.") for o in objects)
  assert f"whole/checkpoints/{STEPS}/commit_success.txt" in objects
  assert not os.path.exists(os.path.join(REPO, "gs:"))  # Nothing local.

  code, _, err = _train(gcs, "gs://bucket/cut", tfds_data_dir,
                        kill_after_checkpoint=20)
  assert code == -signal.SIGKILL, err[-3000:]
  code, resumed, err = _train(gcs, "gs://bucket/cut", tfds_data_dir)
  assert code == 0, err[-3000:]
  assert "Resuming at step" in err and "gs://bucket/cut" in err
  final = lambda text: text.strip().splitlines()[-1]
  assert final(resumed) == final(reference)
  jax.tree.map(np.testing.assert_array_equal, _final_state("gs://bucket/cut"),
               _final_state("gs://bucket/whole"))
  # Both runs' metrics are kept: the resumed run writes new event files.
  events = [o for o in gcs.list("bucket", "cut/") if "tfevents" in o]
  assert len(events) == 2, events

  # Fine-tuning from the bucket reads the parameters' average, nothing else.
  fmt, tensors = formats.read("gs://bucket/whole")
  assert fmt == "orbax"
  ema = _final_state("gs://bucket/whole")[1]
  np.testing.assert_array_equal(tensors["head/kernel"], ema["head"]["kernel"])
  assert len(tensors) == len(jax.tree.leaves(ema))
  assert not any(k.startswith(("opt_state", "step")) for k in tensors)


def _write_png(path, pixels):
  import io
  buffer = io.BytesIO()
  Image.fromarray(pixels).save(buffer, format="PNG")
  target = paths.resolve(path)
  target.parent.mkdir(parents=True, exist_ok=True)
  target.write_bytes(buffer.getvalue())


def test_image_folder_in_a_bucket_reads_like_a_local_one(
    gcs, digits_config, tmp_path):
  rng = np.random.default_rng(0)
  for split, count in (("train", 4), ("test", 2)):
    for name in ("cat", "dog"):
      for i in range(count):
        pixels = rng.integers(0, 255, (10, 12, 3)).astype(np.uint8)
        for root in ("gs://bucket/images", str(tmp_path / "images")):
          _write_png(f"{root}/{split}/{name}/{i}.png", pixels)
  for root in ("gs://bucket/images", str(tmp_path / "images")):
    paths.resolve(f"{root}/test/dog/9.png").write_bytes(b"")  # Unreadable.
  batches, logs = [], []
  for root in ("gs://bucket/images", str(tmp_path / "images")):
    config = digits_config.copy_and_resolve_references()
    config.dataset = f"folder:{root}"
    config.pp_eval = "resize|value_range"
    config.eval_batch_size = 8
    config.max_unreadable_share = 0.5
    source = input_pipeline.make_source(specs.training(config))
    assert source.class_names == ["cat", "dog"]
    assert source.num_examples("train") == 8
    evaluation = input_pipeline.make_eval_batches(specs.evaluation(config),
                                                  source)
    batches.append(next(evaluation()))
    logs.append(evaluation.unreadable.names)
  np.testing.assert_array_equal(batches[0]["image"], batches[1]["image"])
  np.testing.assert_array_equal(batches[0]["labels"], batches[1]["labels"])
  np.testing.assert_array_equal(batches[0]["mask"], batches[1]["mask"])
  assert batches[0]["mask"].sum() == 4  # 5 files, the empty one left out.
  assert logs == [["gs://bucket/images/test/dog/9.png"],
                  [str(tmp_path / "images/test/dog/9.png")]]


def test_fewshot_tables_are_written_to_the_bucket(gcs):
  table = {"ckpt": {"digits": {"1shot": 0.5, "full": 0.75}}}
  sweep.write(table, "gs://bucket/fewshot")
  assert gcs.list(
      "bucket", "fewshot/") == ["fewshot/fewshot.csv", "fewshot/fewshot.json"]
  text = paths.resolve("gs://bucket/fewshot/fewshot.json").read_text()
  assert json.loads(text) == table
