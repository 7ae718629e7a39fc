"""Workdirs written by an earlier version keep working: they resume,
fine-tune, predict and are swept.

tests/fixtures/workdirs_v0 holds two runs written by commit 2d68d6b (before
evaluators became config entries and the data a spec), their config.json
and last checkpoint (TensorBoard files left out):

    vit-jax train --config=configs/digits.py:runlocal \
        --workdir=supervised --config.total_steps=4 \
        --config.checkpoint_every_steps=2 --config.keep_checkpoints=1
    vit-jax train --config=configs/selfsup.py:digits,runlocal \
        --workdir=selfsup --config.total_steps=4 --config.keep_checkpoints=1
"""

import os
import shutil

from etils import epath
import numpy as np

from configs import digits
from configs import fewshot as fewshot_configs
from configs import finetune
from configs import selfsup
from vit_jax import inference
from vit_jax import models
from vit_jax import objectives
from vit_jax import weights
from vit_jax.config import defaults
from vit_jax.config import recorded
from vit_jax.data import image_files
from vit_jax.fewshot import sweep
from vit_jax.loop import trainer

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "workdirs_v0")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _copy(tmp_path, name: str) -> str:
  """A writable copy of a fixture workdir (resuming writes into it)."""
  return str(shutil.copytree(os.path.join(FIXTURES, name), tmp_path / name))


def test_an_old_run_resumes_where_it_stopped(tmp_path, tfds_data_dir, capsys):
  workdir = _copy(tmp_path, "supervised")
  config = digits.get_config("runlocal")
  config.data_dir = tfds_data_dir
  config.total_steps = 6
  result = trainer.train_and_evaluate(config, workdir)
  assert "Resuming at step 4" in capsys.readouterr().err
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "6"))
  assert np.isfinite(result["train/loss"])


def test_an_old_selfsup_run_resumes_with_a_fewshot_entry(
    tmp_path, tfds_data_dir, capsys):
  """Few-shot evaluation of a masked-patch model (no classification head)
  while it trains."""
  workdir = _copy(tmp_path, "selfsup")
  config = selfsup.get_config("digits,runlocal")
  config.data_dir = tfds_data_dir
  config.total_steps = 6
  config.evals.fewshot.datasets = ("digits",)
  config.evals.fewshot.every_steps = 0  # At the end.
  result = trainer.train_and_evaluate(config, workdir)
  assert "Resuming at step 4" in capsys.readouterr().err
  assert 0.0 <= result["fewshot/digits/full"] <= 1.0
  assert 0.0 <= result["masked_patch/accuracy"] <= 1.0


def test_an_old_selfsup_checkpoint_is_described():
  """`vit-jax inspect CHECKPOINT --config=configs/selfsup.py:...`."""
  checkpoint = os.path.join(FIXTURES, "selfsup", "checkpoints", "4")
  config = selfsup.get_config("digits,runlocal")
  text = weights.describe_weights(checkpoint, config,
                                  objective=objectives.of(config))
  assert "Loads into testing at 16 px with the masked_patch objective" in (
      text), text


def test_an_old_run_starts_a_fine_tuning(tmp_path, tfds_data_dir):
  config = finetune.get_config("digits,runlocal")
  config.data_dir = tfds_data_dir
  config.init.checkpoint = _copy(tmp_path, "supervised")
  config.total_steps = 2
  result = trainer.train_and_evaluate(config, str(tmp_path / "finetuned"))
  assert 0.0 <= result["test/accuracy"] <= 1.0


def test_an_old_run_predicts(tmp_path, tfds_data_dir):
  loaded = inference.load(_copy(tmp_path, "supervised"))
  assert loaded.trained_here and loaded.config.image_size == 16
  files = image_files.find_images([os.path.join(REPO, "docs", "digits")])
  batches = image_files.ImageFiles(files, loaded.config.pp_eval, 16, 8)
  rows = inference.predict(loaded, batches, files, top_k=3)
  assert [path for path, _, _ in rows] == files and len(files) == 10


def test_old_runs_are_swept(tmp_path, tfds_data_dir):
  config = fewshot_configs.get_config("digits,runlocal")
  config.data_dir = tfds_data_dir
  supervised = _copy(tmp_path, "supervised")
  selfsup = _copy(tmp_path, "selfsup")
  table, _ = sweep.sweep(config, [supervised, selfsup])
  for workdir in (supervised, selfsup):
    assert set(table[workdir]["digits"]) >= {"1shot", "5shot", "full"}


def test_recorded_configs_of_earlier_layouts_are_upgraded_where_read():
  """Each fixture's config.json, written before most of the model's form
  existed, reads with every field (`config/recorded.py`, once), and the
  form it gives is the one the run computed; a run recorded before the
  GELU was an option computed the exact erf, and one that moved RoPE's
  positions drew them per image."""
  for name in ("supervised", "selfsup"):
    run = recorded.read(epath.Path(FIXTURES) / name / "config.json")
    assert set(run["model"]) == set(defaults.get_model_config())
    assert models.ModelForm.from_config(run["model"]) == models.ModelForm(
        gelu_approximate=True)  # As recorded.
  older = recorded.upgrade({"model": {"variant": "testing"}})
  form = models.ModelForm.from_config(older["model"])
  assert form == models.ModelForm(gelu_approximate=False)
  # RoPE's augmentations were drawn per image before rope_augment_per.
  augmented = recorded.upgrade(
      {"model": {
          "variant": "testing",
          "rope": "dinov3",
          "rope_rescale": 2.0
      }})
  assert augmented["model"]["rope_augment_per"] == "image"
