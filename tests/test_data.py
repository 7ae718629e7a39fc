"""The built-in digits dataset, preprocessing ops and exact evaluation."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax import sharding
from vit_jax.data import input_pipeline, preprocess
from vit_jax.evaluators import classification


def test_digits_builder_has_fixed_splits(tfds_data_dir):
  builder = tfds.builder("digits", data_dir=tfds_data_dir)
  assert builder.info.splits["train"].num_examples == 1437
  assert builder.info.splits["test"].num_examples == 360
  assert builder.info.features["label"].num_classes == 10
  test = list(tfds.as_numpy(builder.as_dataset(split="test")))
  images = np.stack([ex["image"] for ex in test])
  labels = np.array([ex["label"] for ex in test])
  assert images.shape == (360, 8, 8, 1) and images.dtype == np.uint8
  assert images.max() == 255 and images.min() == 0
  assert set(labels) == set(range(10))


def test_pipeline_upsamples_to_rgb_in_value_range():
  fn = preprocess.make_image_fn("resize|value_range", 16)
  image = tf.constant(np.arange(64, dtype=np.uint8).reshape(8, 8, 1) * 4)
  out = fn(image, tf.constant([0, 0], tf.int64)).numpy()
  assert out.shape == (16, 16, 3) and out.dtype == np.float32
  assert -1.0 <= out.min() < out.max() <= 1.0
  np.testing.assert_array_equal(out[..., 0], out[..., 2])  # Gray -> RGB.


def test_inception_crop_and_flip_are_seeded():
  image = tf.constant(np.random.RandomState(0).randint(
      0, 255, (40, 60, 3)).astype(np.uint8))
  fn = preprocess.make_image_fn("inception_crop|flip_lr|value_range", 24)
  seed = lambda s: tf.constant([s, 0], tf.int64)
  a, b, c = (fn(image, seed(s)).numpy() for s in (1, 1, 2))
  assert a.shape == (24, 24, 3)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


def test_inception_crop_stays_inside_the_image():
  shape = tf.constant([50, 80, 3])
  areas = []
  for s in range(200):
    begin, size = (t.numpy() for t in preprocess.inception_box(
        shape, tf.constant([s, 0], tf.int64)))
    assert (begin >= 0).all() and (begin + size <= shape.numpy()).all()
    areas.append(size[0] * size[1] / (50 * 80))
  assert min(areas) >= 0.05 and max(areas) <= 1.0
  assert np.std(areas) > 0.1  # Crops really vary.


def test_flip_applies_to_about_half():
  image = tf.constant(np.arange(12, dtype=np.uint8).reshape(2, 2, 3))
  flip = preprocess.make_image_fn("flip_lr", 2)
  flipped = [not np.array_equal(flip(image, tf.constant([s, 0], tf.int64)),
                                tf.cast(image, tf.float32))
             for s in range(400)]
  assert 0.4 < np.mean(flipped) < 0.6


@pytest.mark.parametrize("spec", ["nope", "resize|blur", "inception_crop(x)"])
def test_unknown_op_is_a_clear_error(spec):
  with pytest.raises(ValueError, match="op"):
    preprocess.parse(spec)


def test_unknown_dataset_and_split(digits_config):
  digits_config.dataset = "no_such_dataset"
  with pytest.raises(ValueError, match="Unknown dataset 'no_such_dataset'"):
    input_pipeline.make_source(digits_config)
  digits_config.dataset = "digits"
  digits_config.eval_split = "validation"
  source = input_pipeline.make_source(digits_config)
  with pytest.raises(ValueError, match="no split 'validation'"):
    input_pipeline.get_info(digits_config, source)


def test_train_batches_have_the_configured_shape(digits_config):
  source = input_pipeline.make_source(digits_config)
  batch = next(input_pipeline.make_train_iterator(digits_config, source))
  size = digits_config.image_size
  assert batch["image"].shape == (digits_config.batch_size, size, size, 3)
  assert batch["labels"].shape == (digits_config.batch_size, 10)
  np.testing.assert_array_equal(batch["labels"].sum(-1), 1.0)


class _ConstantClassifier(nn.Module):
  """Always predicts `label`: its accuracy is that label's frequency."""
  label: int

  @nn.compact
  def __call__(self, images, train=False):
    del train
    bias = self.param("bias", nn.initializers.zeros, (10,))
    logits = bias + jax.nn.one_hot(self.label, 10) + 0 * images[:, 0, 0, :1]
    return logits, {}


def test_evaluation_counts_every_example_once(digits_config):
  digits_config.eval_batch_size = 64  # 360 = 5 * 64 + 40: the last is padded.
  source = input_pipeline.make_source(digits_config)
  assert input_pipeline.get_info(digits_config, source).num_eval_examples == 360
  batches = list(input_pipeline.make_eval_dataset(
      digits_config, source).as_numpy_iterator())
  assert len(batches) == 6
  assert all(b["image"].shape[0] == 64 for b in batches)
  assert sum(b["mask"].sum() for b in batches) == 360

  labels = np.array([ex["label"] for ex in tfds.as_numpy(
      tfds.builder("digits", data_dir=digits_config.data_dir).as_dataset(
          split="test"))])
  mesh = sharding.make_mesh()
  model = _ConstantClassifier(label=3)
  params = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))["params"]
  evaluator = classification.ClassificationEvaluator(
      model, lambda: batches, mesh,
      lambda logits, labels: jnp.zeros(logits.shape[0]),
      jax.tree.map(lambda _: sharding.replicated(mesh), params))
  metrics = evaluator.run(params)
  assert metrics["num_examples"] == 360
  assert metrics["accuracy"] == pytest.approx(np.mean(labels == 3), abs=1e-7)
