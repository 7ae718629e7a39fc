"""Images at their own shape through the usual workflows: a NaFlex tower
fine-tuned on a folder of non-square images (every test image counted
once), and swept few-shot at a chosen sequence length."""

import os

import numpy as np
import pytest

from configs import fewshot as fewshot_configs
from tests.helpers import mixed_shapes
from vit_jax.fewshot import sweep
from vit_jax.loop import trainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAFLEX = os.path.join(REPO, "tests", "references", "tiny_naflex_big_vision.npz")
SEQUENCE_PP = "resize_to_sequence|value_range|patchify"


@pytest.fixture(scope="module")
def mixed_folder(tfds_data_dir, tmp_path_factory):
  root = tmp_path_factory.mktemp("mixed")
  counts = mixed_shapes.write(root, tfds_data_dir, per_split=48)
  return str(root), counts


def test_a_naflex_tower_fine_tunes_on_non_square_images(digits_config,
                                                        mixed_folder, tmp_path):
  root, counts = mixed_folder
  config = digits_config
  config.dataset = f"folder:{root}"
  config.init.checkpoint = NAFLEX
  config.init.dont_load = ("head/.*",)
  config.model.classifier, config.model.class_token = "map", False
  config.sequence_length = 12
  config.pp_train = "aspect_crop(0.5)|flip_lr|resize_to_sequence|" + (
      "value_range|patchify")
  config.pp_eval = SEQUENCE_PP
  config.total_steps, config.batch_size, config.eval_batch_size = 4, 16, 16
  metrics = trainer.train_and_evaluate(config, str(tmp_path / "ft"))
  assert metrics["test/num_examples"] == counts["test"]  # Each once.
  assert np.isfinite(metrics["train/loss"])
  recorded = (tmp_path / "ft" / "config.json").read_text()
  assert '"sequence_length": 12' in recorded
  assert '"posemb_interpolation": "bilinear"' in recorded


def test_a_few_shot_sweep_at_a_chosen_sequence_length(tfds_data_dir):
  config = fewshot_configs.get_config("digits")
  config.data_dir = tfds_data_dir
  config.image_size = 16
  config.fewshot.shots = (2,)
  config.fewshot.seeds = 1
  config.fewshot.pp_eval = SEQUENCE_PP
  results = {}
  for length in (4, 16):
    config.sequence_length = length
    table, _ = sweep.sweep(config, [NAFLEX], ["digits"])
    results[length] = table[NAFLEX]["digits"]
  for row in results.values():
    assert {"2shot", "full"} <= set(row) and 0.0 <= row["full"] <= 1.0
  # 4 patches of a digit see less than 16: other features, other numbers.
  assert results[4]["full"] != results[16]["full"]
