"""The built-in digits dataset, preprocessing ops and exact evaluation."""

import io
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax import sharding
from vit_jax.data import handover
from vit_jax.data import input_pipeline
from vit_jax.data import preprocess
from vit_jax.data import specs
from vit_jax.evaluators import classification


def test_digits_builder_has_fixed_splits(tfds_data_dir):
  builder = tfds.builder("digits", data_dir=tfds_data_dir)
  assert builder.info.splits["train"].num_examples == 1437
  assert builder.info.splits["test"].num_examples == 360
  assert builder.info.features["label"].num_classes == 10
  test = list(builder.as_data_source(split="test"))
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
  image = tf.constant(
      np.random.RandomState(0).randint(0, 255, (40, 60, 3)).astype(np.uint8))
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
    begin, size = (
        t.numpy()
        for t in preprocess.inception_box(shape, tf.constant([s, 0], tf.int64)))
    assert (begin >= 0).all() and (begin + size <= shape.numpy()).all()
    areas.append(size[0] * size[1] / (50 * 80))
  assert min(areas) >= 0.05 and max(areas) <= 1.0
  assert np.std(areas) > 0.1  # Crops really vary.


def test_flip_applies_to_about_half():
  image = tf.constant(np.arange(12, dtype=np.uint8).reshape(2, 2, 3))
  flip = preprocess.make_image_fn("flip_lr", 2)
  flipped = [
      not np.array_equal(flip(image, tf.constant([s, 0], tf.int64)),
                         tf.cast(image, tf.float32)) for s in range(400)
  ]
  assert 0.4 < np.mean(flipped) < 0.6


def _jpeg(size, **save_options) -> bytes:
  """A smooth JPEG of `size` (width, height): chroma varies between pixels."""
  x, y = np.meshgrid(np.arange(size[0]), np.arange(size[1]))
  rgb = np.stack([x * 7 % 256, y * 5 % 256, (x * y) % 256], -1)
  mode = save_options.pop("mode", "RGB")
  out = io.BytesIO()
  Image.fromarray(rgb.astype(np.uint8)).convert(mode).save(
      out, "JPEG", **save_options)
  return out.getvalue()


@pytest.mark.parametrize("options", [
    dict(subsampling=0),
    dict(subsampling=1),
    dict(subsampling=2),
    dict(progressive=True),
    dict(mode="L")
], ids=["444", "422", "420", "progressive", "grey"])
def test_decoding_only_the_crop_gives_the_same_pixels(options):
  """decode_and_crop_jpeg alone differs at a window's edge columns where
  chroma is subsampled; the pipeline's crops equal the old path exactly."""
  data = tf.constant(_jpeg((61, 47), quality=90, **options))
  decode = lambda d: tf.io.decode_image(d, channels=3, expand_animations=False)
  encoded = preprocess.Encoded(data, decode)
  full = decode(data)
  spec = "inception_crop(0.08)|flip_lr|value_range"
  new = preprocess.make_image_fn(spec, 24, crop_on_decode=True)
  old = preprocess.make_image_fn(spec, 24, crop_on_decode=False)
  for s in range(60):
    seed = tf.constant([s, 0], tf.int64)
    np.testing.assert_array_equal(new(encoded, seed), old(encoded, seed))
    window_seed = tf.random.experimental.stateless_fold_in(seed, 0)
    begin, size = preprocess.inception_box(tf.shape(full), window_seed, 0.08)
    np.testing.assert_array_equal(
        preprocess.decode_inception_window(encoded, window_seed, 0.08),
        tf.slice(full, begin, size))


def test_only_jpegs_skip_the_whole_image_decoder():
  """A JPEG never goes through the source's decoder; a PNG does."""
  blank = lambda d: tf.zeros([47, 61, 3], tf.uint8)  # Not the real pixels.
  fn = preprocess.make_image_fn("inception_crop|value_range", 8)
  seed = tf.constant([0, 0], tf.int64)
  jpeg = preprocess.Encoded(tf.constant(_jpeg((61, 47))), blank)
  assert fn(jpeg, seed).numpy().max() > -1  # Decoded by decode_and_crop_jpeg.
  png = preprocess.Encoded(tf.io.encode_png(tf.ones([47, 61, 3], tf.uint8)),
                           blank)
  np.testing.assert_array_equal(fn(png, seed), -1.0)  # By `blank`.


def test_image_folder_batches_equal_with_and_without_crop_on_decode(
    digits_config, tmp_path):
  for c in range(2):
    os.makedirs(tmp_path / "train" / f"c{c}")
    for i in range(6):
      (tmp_path / "train" / f"c{c}" / f"{i}.jpg").write_bytes(
          _jpeg((40 + 3 * i, 30 + 5 * c), quality=80 + i))
  digits_config.dataset = f"folder:{tmp_path}"
  digits_config.update(batch_size=8, pp_train="inception_crop|flip_lr|"
                       "value_range", cache=False)
  source = input_pipeline.make_source(specs.training(digits_config))
  batches = []
  for crop_on_decode in (True, False):
    digits_config.pp_crop_on_decode = crop_on_decode
    it = input_pipeline.make_train_iterator(specs.training(digits_config),
                                            source)
    batches.append([next(it) for _ in range(3)])
  for new, old in zip(*batches):
    np.testing.assert_array_equal(new["image"], old["image"])
    np.testing.assert_array_equal(new["labels"], old["labels"])


def test_uint8_hand_over_rounds_what_value_range_would_map():
  """The host stops before value_range and rounds; the train step's
  mapping of those bytes equals the host's value_range of them."""
  image = tf.constant(
      np.random.RandomState(0).randint(0, 255, (40, 60, 3)).astype(np.uint8))
  spec = "inception_crop|flip_lr|value_range"
  as_bytes = preprocess.make_image_fn(spec, 24, device_ops=("value_range",))
  as_floats = preprocess.make_image_fn(spec, 24)
  for s in range(10):
    seed = tf.constant([s, 0], tf.int64)
    out = as_bytes(image, seed)
    assert out.dtype == tf.uint8
    mapped = np.asarray(handover.images_in_value_range(jnp.asarray(out)))
    np.testing.assert_allclose(  # To float rounding (XLA vs TensorFlow).
        mapped,
        preprocess.value_range()(out, None).numpy(), rtol=0, atol=2e-7)
    np.testing.assert_allclose(mapped, as_floats(image, seed), rtol=0,
                               atol=0.5 / 127.5 + 1e-6)
  # Only a pipeline ending in value_range hands bytes over.
  assert preprocess.make_image_fn("resize", 8, device_ops=("value_range",))(
      image, seed).dtype == tf.float32


def test_which_configs_hand_uint8_over(digits_config):
  assert handover.hands_over_uint8(digits_config)  # ...|value_range
  digits_config.pp_train = "resize"
  assert not handover.hands_over_uint8(digits_config)
  digits_config.pp_train, digits_config.pp_uint8 = "resize|value_range", False
  assert not handover.hands_over_uint8(digits_config)


def test_crop_antialias_only_changes_shrinking_crops():
  spec = "inception_crop(0.9)"
  seed = tf.constant([0, 0], tf.int64)
  for shape, shrinks in (((20, 20, 3), False), ((90, 90, 3), True)):
    image = tf.constant(
        np.random.RandomState(1).randint(0, 255, shape).astype(np.uint8))
    plain, filtered = (preprocess.make_image_fn(spec, 32, crop_antialias=a)(
        image, seed).numpy() for a in (False, True))
    assert (np.abs(plain - filtered).max() > 1) == shrinks
    if not shrinks:
      np.testing.assert_allclose(plain, filtered, rtol=0, atol=1e-3)


@pytest.mark.parametrize("spec", ["nope", "resize|blur", "inception_crop(x)"])
def test_unknown_op_is_a_clear_error(spec):
  with pytest.raises(ValueError, match="op"):
    preprocess.parse(spec, 16)


def test_unknown_dataset_and_split(digits_config):
  digits_config.dataset = "no_such_dataset"
  with pytest.raises(ValueError, match="Unknown dataset 'no_such_dataset'"):
    input_pipeline.make_source(specs.training(digits_config))
  digits_config.dataset = "digits"
  digits_config.eval_split = "validation"
  source = input_pipeline.make_source(specs.training(digits_config))
  with pytest.raises(ValueError, match="no split 'validation'"):
    input_pipeline.num_eval_batches(specs.evaluation(digits_config), source)


def test_train_batches_have_the_configured_shape(digits_config):
  source = input_pipeline.make_source(specs.training(digits_config))
  batch = next(
      input_pipeline.make_train_iterator(specs.training(digits_config), source))
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
  source = input_pipeline.make_source(specs.training(digits_config))
  assert source.num_examples(digits_config.eval_split) == 360
  batches = list(
      input_pipeline.make_eval_dataset(specs.evaluation(digits_config),
                                       source).as_numpy_iterator())
  assert len(batches) == 6
  assert all(b["image"].shape[0] == 64 for b in batches)
  assert sum(b["mask"].sum() for b in batches) == 360

  labels = np.array([
      ex["label"] for ex in tfds.builder("digits", data_dir=digits_config.
                                         data_dir).as_data_source(split="test")
  ])
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
