"""ImageNet ReaL and ImageNet-v2 evaluation of an ImageNet model: the ReaL
accuracy rule, and both as classification entries of config.evals (as
configs/finetune.py:imagenet2012 declares them) on mocked TFDS data."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from configs import finetune
from tests.helpers import tfds_fakes
from vit_jax import evaluators
from vit_jax import objectives
from vit_jax import sharding
from vit_jax.config import defaults
from vit_jax.data import sources
from vit_jax.errors import UserError
from vit_jax.evaluators import classification
from vit_jax.training import losses
from vit_jax.training import train_state

# ReaL label sets of the fake validation images; one has none.
REAL_SETS = ([7], [3, 7, 9], [], [1, 2], [7, 500], [999])
V2_LABELS = (7, 0, 7, 7, 12)
PREDICTED = 7  # The class the test model predicts for every image.


def test_real_accuracy_counts_a_hit_in_the_label_set_and_skips_empty_sets():
  logits = jnp.eye(5)[jnp.array([0, 1, 2, 3])] * 4.0  # Top-1: 0, 1, 2, 3.
  labels = jnp.array(
      [
          [1, 0, 0, 0, 1],  # 0 in {0, 4}: correct.
          [0, 0, 1, 0, 0],  # 1 not in {2}: wrong.
          [0, 0, 0, 0, 0],  # No ReaL label: not counted.
          [0, 1, 0, 1, 0]
      ],  # 3 in {1, 3}: correct.
      jnp.float32)
  mask = jnp.array([1.0, 1.0, 1.0, 1.0])
  correct, counted = classification.top1_correct(logits, labels, mask,
                                                 skip_unlabelled=True)
  np.testing.assert_array_equal(correct, [1, 0, 0, 1])
  np.testing.assert_array_equal(counted, [1, 1, 0, 1])
  assert float(correct.sum() / counted.sum()) == pytest.approx(2 / 3)
  # The plain rule counts the unlabelled image as a miss; padding never.
  correct, counted = classification.top1_correct(logits, labels,
                                                 mask.at[3].set(0.0))
  assert (float(correct.sum()), float(counted.sum())) == (1.0, 3.0)


def test_an_empty_label_list_is_all_zeros():
  empty = sources.multi_hot(tf.constant([], tf.int64), 4)
  np.testing.assert_array_equal(empty, [0, 0, 0, 0])
  np.testing.assert_array_equal(
      sources.multi_hot(tf.constant([2, 0, 2], tf.int64), 4), [1, 0, 1, 0])


def test_real_and_v2_use_imagenets_class_order(tmp_path):
  names = lambda name, key: tfds.builder(name, data_dir=str(tmp_path)
                                        ).info.features[key]
  imagenet = names("imagenet2012", "label").names
  assert names("imagenet2012_real", "real_label").feature.names == imagenet
  assert names("imagenet_v2", "label").names == imagenet


def test_the_imagenet_preset_evaluates_real_and_v2():
  config = finetune.get_config("imagenet2012")
  assert config.evals.real.type == config.evals.v2.type == "classification"
  assert config.evals.real.data.label_key == "real_label"
  assert config.evals.real.skip_unlabelled
  local = finetune.get_config("imagenet2012,runlocal")  # Digits: 10 classes.
  assert "real" not in local.evals and "v2" not in local.evals
  assert "real" not in finetune.get_config("cifar10").evals


def _image(i):
  return np.full((8, 8, 3), 30 * i, np.uint8)


def _examples(builder, split):
  del split
  if builder.name == "imagenet2012_real":
    return [{
        "image": _image(i),
        "original_label": 0,
        "real_label": labels,
        "file_name": f"{i}.JPEG"
    } for i, labels in enumerate(REAL_SETS)]
  return [{
      "image": _image(i),
      "label": label,
      "file_name": f"{i}.jpeg"
  } for i, label in enumerate(V2_LABELS)]


@pytest.fixture
def imagenet_model(tmp_path):
  """A `testing` model with 1,000 classes that predicts PREDICTED, its
  config (ReaL and v2 on) and mocked imagenet2012_real and imagenet_v2."""
  config = defaults.get_config()
  defaults.runlocal(config)
  config.data_dir = str(tmp_path)
  config.eval_batch_size = 8
  imagenet = finetune.get_config("imagenet2012").evals
  config.evals = {"real": imagenet.real, "v2": imagenet.v2}
  tfds_fakes.write_metadata(config.data_dir, "imagenet2012_real",
                            {"validation": len(REAL_SETS)})
  tfds_fakes.write_metadata(config.data_dir, "imagenet_v2",
                            {"test": len(V2_LABELS)})
  mesh = sharding.make_mesh()
  model = objectives.model(objectives.decide(config), 1000)
  state, state_sharding = train_state.create_train_state(
      model, optax.identity(), config.image_size, 0, mesh, config.sharding)
  params = dict(state.params)  # The head's kernel is zero: logits = bias.
  params["head"] = {
      **params["head"], "bias": jnp.zeros(1000).at[PREDICTED].set(1.0)
  }
  with tfds_fakes.mock_tfds(config.data_dir, _examples):
    yield config, model, mesh, state_sharding.params, params


def test_real_and_v2_evaluators(imagenet_model):
  config, model, mesh, params_sharding, params = imagenet_model
  imagenet = types.SimpleNamespace(num_classes=1000)  # The training data.
  made = evaluators.from_config(config, model, mesh, params_sharding, imagenet)
  assert {e.every_steps for e in made} == {config.eval_every_steps}
  made = {e.name: e.evaluator for e in made}
  assert set(made) == {"real", "v2"}

  real = made["real"].run(params)
  labelled = [s for s in REAL_SETS if s]
  assert real["num_examples"] == len(labelled) and real["num_unlabelled"] == 1
  assert real["accuracy"] == pytest.approx(
      sum(PREDICTED in s for s in labelled) / len(labelled))  # 3 of 5.
  assert "1 without labels not counted" in made["real"].summary(real)
  # Logits: 1 for PREDICTED, 0 elsewhere; a set's loss is the mean of its
  # labels' -log p (uniform targets), as test/loss is for one label.
  log_z = np.log(np.e + 999)
  minus_log_p = lambda c: log_z - (c == PREDICTED)
  assert real["loss"] == pytest.approx(
      np.mean([np.mean([minus_log_p(c) for c in s]) for s in labelled]),
      rel=1e-5)

  v2 = made["v2"].run(params)
  assert v2["num_examples"] == len(V2_LABELS)
  assert v2["accuracy"] == pytest.approx(
      V2_LABELS.count(PREDICTED) / len(V2_LABELS))
  assert v2["loss"] == pytest.approx(
      np.mean([minus_log_p(c) for c in V2_LABELS]), rel=1e-5)


def test_real_softmax_loss_is_against_the_uniform_label_distribution():
  logits = jnp.array([[2.0, 0.0, -1.0, 0.5]] * 3)
  labels = jnp.array([[1, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]], jnp.float32)
  log_p = np.asarray(logits[0] - jax.nn.logsumexp(logits[0]))
  np.testing.assert_allclose(
      classification.eval_loss("softmax_xent", True)(logits, labels),
      [-(log_p[0] + log_p[2]) / 2, -log_p[3], 0.0], rtol=1e-6)
  # Sigmoids: one yes/no question per class, so the set is the target.
  np.testing.assert_allclose(
      classification.eval_loss("sigmoid_xent", True)(logits, labels),
      losses.sigmoid_xent(logits, labels))


def test_real_needs_a_head_of_imagenets_classes(imagenet_model):
  config, model, mesh, params_sharding, _ = imagenet_model
  digits = types.SimpleNamespace(num_classes=10)
  with pytest.raises(
      UserError, match="imagenet2012_real, which has 1000 "
      "classes, but the model's head has 10"):
    evaluators.from_config(config, model, mesh, params_sharding, digits)
  config.objective = "masked_patch"  # No head: an enabled entry is refused,
  with pytest.raises(
      UserError, match=r"config.evals.real \(classification\) "
      "cannot run: .*Set config.evals.real.enabled=False"):
    evaluators.check(config)
  for name in ("real", "v2"):  # and one switched off does not run.
    config.evals[name].enabled = False
  evaluators.check(config)
  assert evaluators.from_config(config, model, mesh, params_sharding,
                                digits) == []
