"""Self-supervised pre-training end to end: masked patch prediction on
digits, then its checkpoint fine-tuned and few-shot evaluated like any
other."""

import math

import optax
import pytest

from configs import fewshot as fewshot_configs
from configs import finetune
from configs import selfsup
from tests.test_masked_patch import MASKED_PARTS
from vit_jax import evaluators
from vit_jax import models
from vit_jax import objectives
from vit_jax import sharding
from vit_jax import weights
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.fewshot import sweep
from vit_jax.loop import trainer
from vit_jax.training import train_state

# The module's tests share the pre-trained workdir on one xdist worker.
pytestmark = pytest.mark.xdist_group("selfsup")


def _selfsup_config(tfds_data_dir, steps_=40):
  config = selfsup.get_config("digits,runlocal")
  config.data_dir = tfds_data_dir
  config.total_steps = steps_
  config.lr = 3e-3
  return config


@pytest.fixture(scope="session")
def pretrained(tfds_data_dir, tmp_path_factory):
  """(workdir, final metrics) of 40 masked-patch steps on digits; once per
  xdist worker, which the module's xdist group makes one."""
  workdir = str(tmp_path_factory.mktemp("selfsup"))
  return workdir, trainer.train_and_evaluate(_selfsup_config(tfds_data_dir),
                                             workdir)


def test_training_lowers_the_loss_and_evaluation_repeats(
    pretrained, tfds_data_dir):
  workdir, result = pretrained
  # The zero-initialised head starts at exactly ln(512), chance 1/512.
  assert result["train/loss"] < 0.8 * math.log(512), result
  assert result["masked_patch/loss"] < 0.8 * math.log(512), result
  assert result["masked_patch/accuracy"] > 0.05, result
  assert result["masked_patch/num_examples"] == 360
  assert result["masked_patch/num_patches"] == 360 * 8  # Half of 16 each.
  assert "test/accuracy" not in result  # No labels, no classification.
  # Every evaluation corrupts the same patches: evaluating the saved
  # parameters again gives the numbers the run logged.
  config = _selfsup_config(tfds_data_dir)
  mesh = sharding.mesh_from_config(config)
  model = objectives.model(objectives.decide(config), None)
  state, shardings = train_state.create_train_state(model, optax.identity(), 16,
                                                    1, mesh)
  params = weights.init_params(config, workdir, state.params, shardings.params)
  [entry] = evaluators.from_config(
      config, model, mesh, shardings.params,
      input_pipeline.make_source(specs.training(config)))
  assert entry.name == "masked_patch"  # The only entry for this objective.
  evaluator = entry.evaluator
  again = evaluator.run(params)
  for key in ("loss", "accuracy", "num_patches"):
    assert again[key] == pytest.approx(result[f"masked_patch/{key}"], rel=1e-6)


def test_checkpoint_fine_tunes_with_the_masked_parts_dropped(
    pretrained, tfds_data_dir, tmp_path):
  workdir, _ = pretrained
  config = finetune.get_config(f"digits,runlocal,init={workdir}")
  config.data_dir = tfds_data_dir
  config.total_steps = 3
  target = models.param_shapes(objectives.model(objectives.decide(config), 10),
                               32)
  _, report = weights.load_for_config(config, workdir, target)
  assert {name for name, _ in report.dropped} == MASKED_PARTS
  assert {name for name, _ in report.reinitialised} == {
      "head/kernel", "head/bias"
  }
  assert [r[0] for r in report.resized] == [weights.POSEMB]  # 16 -> 32 px.
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert 0.0 <= result["test/accuracy"] <= 1.0


def test_fewshot_of_the_checkpoint_and_of_random_init(pretrained, tfds_data_dir,
                                                      tmp_path):
  """`random` is the config's model at random init: the same numbers as a
  file holding that initialisation."""
  workdir, _ = pretrained
  config = fewshot_configs.get_config("digits,runlocal")
  config.data_dir = tfds_data_dir
  model = models.build_model(weights.decide(config).model, None)
  state, _ = train_state.create_train_state(model, optax.identity(), 16,
                                            config.seed, sharding.make_mesh())
  init_path = str(tmp_path / "init.npz")
  weights.save_npz(state.params, init_path)
  table, _ = sweep.sweep(config, [workdir, sweep.RANDOM_INIT, init_path])
  assert table[sweep.RANDOM_INIT] == table[init_path]
  assert set(table[workdir]["digits"]) >= {"1shot", "5shot", "full"}
