"""End-to-end training on the built-in digits dataset, and config errors."""

import glob
import json
import math
import os

import pytest

from vit_jax import sharding
from vit_jax.errors import NonFiniteLossError
from vit_jax.errors import UserError
from vit_jax.loop import checks
from vit_jax.loop import trainer


@pytest.mark.xdist_group("trained_digits")
def test_train_and_evaluate_learns_digits(trained_digits_run):
  """The `digits` model, 400 steps on 8 devices (tests/conftest.py)."""
  workdir, result = trained_digits_run
  # The zero-initialised head starts at exactly ln(10).
  assert result["train/loss"] < 0.8 * math.log(10)
  assert result["test/accuracy"] > 0.6  # Chance is 0.1.
  assert glob.glob(os.path.join(workdir, "events.out.tfevents.*"))
  assert glob.glob(os.path.join(workdir, "plugins/profile/*/*.xplane.pb"))
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["model"]["variant"] == "digits"


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("image_size", 18, "not a multiple of the 4-pixel patches"),
        ("batch_size", 30, "not divisible by the 8 data shards"),
        ("eval_batch_size", 12, "eval_batch_size=12 is not divisible"),
        ("optimizer", "lamb", "optimizer='lamb' is not one of"),
        ("pp_train", "resize|sharpen", "Unknown preprocessing op 'sharpen'"),
        ("accum_steps", 3, "does not split into accum_steps=3 micro-batches"),
        # Once accepted: trained to loss 780, or failed after compiling.
        ("lr", -1.0, r"config.lr=-1.0 must be positive"),
        ("total_steps", 0, "total_steps=0 trains nothing"),
        ("num_epochs", -1.0, "num_epochs=-1.0 must be positive"),
        ("batch_size", 0, "batch_size=0 must be positive"),
        ("eval_batch_size", 0, "eval_batch_size=0 must be positive"),
        ("image_size", 0, "image_size=0 must be positive"),
        ("log_every_steps", 0, "log_every_steps=0 must be positive"),
        ("checkpoint_every_steps", 0, "checkpoint_every_steps=0 must be posit"),
        ("weight_decay", -0.1, "weight_decay=-0.1 must be zero or positive"),
        ("sequence_length", 0, "sequence_length=0 must be a positive number "
         "of patches"),
    ])
def test_bad_config_fails_before_compiling(digits_config, field, value,
                                           message):
  digits_config[field] = value
  with pytest.raises(UserError, match=message):
    checks.check_config(digits_config, sharding.make_mesh())


def test_zero_steps_is_allowed_to_evaluate_a_checkpoint(digits_config):
  digits_config.total_steps = 0
  digits_config.init.checkpoint = "/some/weights.npz"
  checks.check_config(digits_config, sharding.make_mesh())


def test_a_diverged_state_is_never_saved(digits_config, tmp_path):
  """The update of step 1 overflows: the run stops before saving it."""
  digits_config.update(
      dict(optimizer="sgd", lr=1e30, grad_clip_norm=0.0, warmup_steps=0,
           decay_type="constant", checkpoint_every_steps=1))
  with pytest.raises(NonFiniteLossError, match="diverged at step 1"):
    trainer.train_and_evaluate(digits_config, str(tmp_path))
  assert not [d for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()]


def test_a_workdir_that_is_a_file_is_refused(digits_config, tmp_path):
  path = tmp_path / "results.txt"
  path.write_text("not a directory")
  with pytest.raises(UserError, match="is an existing file, not a directory"):
    trainer.train_and_evaluate(digits_config, str(path))


def test_unknown_variant_lists_the_known_ones(digits_config):
  digits_config.model.variant = "ViT-X/99"
  with pytest.raises(ValueError, match="Unknown model variant.*ViT-B/16"):
    checks.check_config(digits_config, sharding.make_mesh())
