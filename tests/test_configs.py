"""Every config loads, is locked, and passes the pre-compile checks; each
recipe's `runlocal` form runs (what CI runs), and what CI must not skip."""

import dataclasses
import glob
import importlib
import math
import os
import re

import pytest

from tests.helpers import torch_env
from vit_jax import sharding
from vit_jax.config import defaults
from vit_jax.config import model_form
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
  it does, and so does each field of the model's form (model_form.py:
  on its line or the lines just above it)."""
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
  with open(model_form.__file__) as f:
    lines = f.read().split("class ModelForm")[1].split("\n  @")[0].splitlines()
  names = [f.name for f in dataclasses.fields(model_form.ModelForm)]
  for i, line in enumerate(lines):
    match = re.match(r"  (\w+): .* = ", line)
    if match and match.group(1) in names:
      names.remove(match.group(1))
      assert "#" in line or lines[i - 1].strip().startswith("#"), line
  assert not names  # Each field found, once.


@pytest.mark.parametrize("name", [
    "pretrain", "pretrain:plain_i1k", "pretrain:mixer_i1k", "finetune",
    "naflex:navit", "distill"
])
def test_recipe_runs_locally(name, tfds_data_dir, tmp_path):
  """Each recipe's `runlocal` form trains and evaluates end to end: its 10
  steps leave the zero-initialised head close to uniform over the 10
  classes (losses near ln 10; a loss summed, or averaged over padding, is
  far from it), and the evaluation counts each of the 360 test digits once
  (the accuracy is a count of them)."""
  module, _, recipe = name.partition(":")
  config = importlib.import_module(f"configs.{module}").get_config(
      f"{recipe},runlocal" if recipe else "runlocal")
  config.data_dir = tfds_data_dir
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result["test/num_examples"] == 360
  correct = result["test/accuracy"] * 360
  assert abs(correct - round(correct)) < 1e-3, correct
  assert result["test/loss"] == pytest.approx(math.log(10), abs=0.1)
  if config.objective == "distill":  # The digits teacher: trained.
    assert result["distill/teacher_accuracy"] > 0.95
  else:
    assert result["train/loss"] == pytest.approx(math.log(10), abs=0.1)


def test_ci_fails_a_comparison_with_timm_it_cannot_run(monkeypatch, tmp_path):
  """Without .venv-torch the timm comparisons are skipped, but under
  CI=true they fail: a comparison CI skips proves nothing."""
  missing = str(tmp_path / "no-venv" / "python")
  monkeypatch.delenv("CI", raising=False)
  with pytest.raises(pytest.skip.Exception, match="no .venv-torch"):
    torch_env.require(missing)
  skipped = pytest.TestReport("t", ("t.py", 1, "t"), {}, "skipped",
                              ("t.py", 1, f"Skipped: {torch_env.MISSING}"),
                              "call")
  torch_env.fail_skip_in_ci(skipped)
  assert skipped.skipped
  monkeypatch.setenv("CI", "true")
  with pytest.raises(pytest.fail.Exception, match="CI=true"):
    torch_env.require(missing)
  torch_env.fail_skip_in_ci(skipped)  # A test that skips by itself.
  assert skipped.failed and "CI=true" in str(skipped.longrepr)
