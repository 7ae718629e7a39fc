"""vit_jax/data/throughput.py, behind `vit-jax benchmark-input`: what it
times is the training pipeline and the listing, and a bad spec is refused."""

import pytest

from vit_jax.data import throughput
from vit_jax.errors import UserError


def test_the_listing_of_a_built_tree_counts_its_classes_and_files(tmp_path):
  result = throughput.measure_listing("3x4", str(tmp_path / "tree"))
  assert (result["classes"], result["files"]) == (3, 12)
  assert result["listing_s"] >= 0
  again = throughput.measure_listing("3x4", str(tmp_path / "tree"))  # Reused.
  assert (again["classes"], again["files"]) == (3, 12)


def test_a_listing_spec_that_is_not_classes_x_files_is_refused():
  with pytest.raises(UserError, match="is not CLASSESxFILES, e.g. 2000x500"):
    throughput.measure_listing("2000")


def test_the_pipeline_is_timed_on_the_configs_training_batches(digits_config):
  result = throughput.measure(digits_config, num_batches=2)
  assert result["batch"] == digits_config.batch_size
  assert result["dataset"] == "digits" and result["images_per_sec"] > 0
