"""FlexiViT: a ViT run at another patch size than it stores, trained at a
patch size drawn per step and evaluated at each (config.flexi).

The model at run size R must be the plain ViT at patch R whose kernel is
the PI-resize of the stored one and whose position embeddings are the
stored grid bilinearly resized (jax.image.resize, FlexiViT's own).
"""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import digits
from tests.helpers import tiny_models
from vit_jax.config import defaults
from vit_jax.errors import UserError
from vit_jax.loop import checks
from vit_jax.loop import trainer
from vit_jax.models import patch_resize
from vit_jax.training import flexi

TINY = dict(num_classes=5, hidden_size=32, mlp_dim=64, num_heads=4,
            num_layers=2, patch_size=8)


def _images(size=24, batch=2):
  return np.random.default_rng(0).uniform(-1, 1, (batch, size, size, 3)).astype(
      np.float32)


def _random(model, size=24):
  shapes = jax.eval_shape(model.init, jax.random.key(0),
                          jnp.zeros((1, size, size, 3)))["params"]
  rng = np.random.default_rng(1)
  return jax.tree.map(
      lambda x: (0.3 * rng.normal(size=x.shape)).astype(np.float32), shapes)


@pytest.mark.parametrize("run", [4, 6, 12])
@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_a_model_run_at_another_patch_size_is_the_resized_plain_vit(
    run, classifier):
  stored = tiny_models.vit(classifier=classifier, **TINY)
  params = _random(stored)  # Patch 8 on 24 px: a 3 x 3 grid.
  flexible = tiny_models.with_form(stored, patch_size=run)
  shapes = jax.eval_shape(flexible.init, jax.random.key(0),
                          jnp.zeros((1, 24, 24, 3)))["params"]
  assert jax.tree.map(np.shape, shapes) == jax.tree.map(np.shape, params)

  grid = 24 // run
  plain = flax.traverse_util.flatten_dict(params, sep="/")
  plain["embedding/kernel"] = patch_resize.pi_resize(
      np.asarray(plain["embedding/kernel"], np.float64), (run, run)).astype(
          np.float32)
  posemb = plain["Transformer/posembed_input/pos_embedding"]
  prefix = posemb.shape[1] - 9
  resized = jax.image.resize(posemb[0, prefix:].reshape(3, 3, 32),
                             (grid, grid, 32), "bilinear")
  plain["Transformer/posembed_input/pos_embedding"] = np.concatenate(
      [posemb[:, :prefix],
       np.asarray(resized).reshape(1, -1, 32)], axis=1)
  want = tiny_models.with_size(stored, patch_size=run).apply(
      {"params": flax.traverse_util.unflatten_dict(plain, sep="/")},
      _images())[0]
  got = flexible.apply({"params": params}, _images())[0]
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


def test_the_stored_size_is_the_plain_model_and_init_does_not_depend_on_it():
  stored = tiny_models.vit(**TINY)
  params = _random(stored)
  np.testing.assert_array_equal(
      tiny_models.with_form(stored, patch_size=8).apply({"params": params},
                                                        _images())[0],
      stored.apply({"params": params}, _images())[0])
  a = stored.init(jax.random.key(3), jnp.zeros((1, 24, 24, 3)))
  b = tiny_models.with_form(stored, patch_size=6).init(
      jax.random.key(3), jnp.zeros((1, 24, 24, 3)))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_patch_sizes_are_drawn_per_step_from_the_seed_and_step_alone():
  config = defaults.get_config()
  config.flexi.patch_sizes = (4, 8, 16)
  drawn = [flexi.patch_size_of_step(config, s) for s in range(200)]
  assert set(drawn) == {4, 8, 16}
  assert drawn == [flexi.patch_size_of_step(config, s) for s in range(200)]
  assert drawn[100:] == [
      flexi.patch_size_of_step(config, s) for s in range(100, 200)
  ]  # What a resume draws.


@pytest.mark.parametrize("change, message", [
    (dict(flexi_sizes=(4, 5)), "has 5, which does not tile"),
    (dict(variant="testing-hybrid"), "is not one"),
    (dict(objective="masked_patch"), "trains a classifier"),
    (dict(eval_only=(4,)), "eval_patch_sizes is set but"),
    (dict(image_size=30, flexi_sizes=(5, 15)), "set config.model.patch_size"),
    (dict(variant="testing-mixer", patch_size=4), "only a plain ViT runs"),
])
def test_bad_flexi_configs_are_refused_before_compiling(change, message):
  config = digits.get_config("runlocal")
  config.flexi.patch_sizes = change.get("flexi_sizes", (4, 8))
  config.flexi.eval_patch_sizes = change.get("eval_only", ())
  if "eval_only" in change:
    config.flexi.patch_sizes = ()
  config.model.variant = change.get("variant", "testing")
  config.objective = change.get("objective", "supervised")
  config.image_size = change.get("image_size", 16)
  config.model.patch_size = change.get("patch_size")
  if config.model.variant == "testing-mixer":
    config.model.classifier = "gap"
  with pytest.raises(UserError, match=message):
    checks.check_config(config, None)


def test_each_step_runs_at_its_drawn_size_from_where_the_run_starts():
  """A run resumed at step 100 draws what an uninterrupted one draws there."""
  config = defaults.get_config()
  config.flexi.patch_sizes = (4, 8, 16)
  step = flexi.FlexiTrainStep(config, tiny_models.vit(**TINY), lambda m:
                              (lambda s, b: m.form.patch_size), 100)
  assert sorted(step.steps) == [4, 8, 16]
  assert [step(None, None) for _ in range(50)] == [
      flexi.patch_size_of_step(config, s) for s in range(100, 150)
  ]


def test_flexi_training_evaluates_at_each_size(tfds_data_dir, tmp_path):
  from configs import pretrain
  config = pretrain.get_config("flexi_i21k,runlocal")
  config.data_dir = tfds_data_dir
  config.total_steps = 3
  result = trainer.train_and_evaluate(config, str(tmp_path))
  for size in (4, 8):
    assert 0.0 <= result[f"test_p{size}/accuracy"] <= 1.0, result
  assert "test/accuracy" not in result
