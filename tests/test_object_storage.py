"""Data and results on object storage, against a real GCS server.

The server is fake-gcs-server on 127.0.0.1; the code under test only sees
STORAGE_EMULATOR_HOST, as a user trying it locally would set. A training
run's workdir on gs://, killed and resumed: tests/test_storage_faults.py.
"""

import json
import os

import numpy as np
from PIL import Image
import pytest

from tests.helpers import gcs_server
from vit_jax import paths
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.fewshot import sweep

pytestmark = pytest.mark.xdist_group("gcs")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def gcs():
  with gcs_server.serving("bucket") as server:
    yield server


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
