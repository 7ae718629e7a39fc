"""Every config loads, is locked, and passes the pre-compile checks."""

import glob
import importlib
import os

import pytest

from vit_jax import sharding
from vit_jax.config import defaults
from vit_jax.loop import checks
from vit_jax.loop import trainer

_CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "configs")
CONFIGS = sorted(
    os.path.basename(p)[:-3]
    for p in glob.glob(os.path.join(_CONFIG_DIR, "*.py"))
    if not os.path.basename(p).startswith("_"))


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("arg", [None, "runlocal"])
def test_config_is_valid_and_locked(name, arg):
  config = importlib.import_module(f"configs.{name}").get_config(arg)
  assert config.is_locked
  with pytest.raises(AttributeError):
    config.not_a_field = 1
  checks.check_config(config, sharding.make_mesh())


def test_every_default_is_documented():
  """Each field of vit_jax/config/defaults.py carries a comment saying what
  it does."""
  with open(defaults.__file__) as f:
    # Declarations are assignments (config.update() only overrides).
    fields = [
        line.strip()
        for line in f
        if line.strip().startswith(("config.", "model.")) and " = " in line
    ]
  undocumented = [
      line for line in fields
      if "#" not in line and "get_model_config" not in line
  ]
  assert not undocumented


@pytest.mark.parametrize("name", [
    "pretrain", "pretrain:plain_i1k", "pretrain:mixer_i1k", "finetune",
    "naflex:navit", "distill"
])
def test_recipe_runs_locally(name, tfds_data_dir, tmp_path):
  """Each recipe's `runlocal` form trains and evaluates end to end."""
  module, _, recipe = name.partition(":")
  config = importlib.import_module(f"configs.{module}").get_config(
      f"{recipe},runlocal" if recipe else "runlocal")
  config.data_dir = tfds_data_dir
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert 0.0 <= result["test/accuracy"] <= 1.0
  assert result["train/loss"] > 0
