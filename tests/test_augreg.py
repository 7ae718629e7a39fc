"""AugReg's regularisers: mixup, stochastic depth, RandAugment, presets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from configs import pretrain
from tests.test_models import images, random_params, tiny_model
from vit_jax import config_checks, mixup, sharding, steps
from vit_jax.data import input_pipeline, preprocess, randaug
from vit_jax.errors import UserError


# ------------------------------------------------------------------ mixup --


def _batch(seed=0, size=8, classes=5):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(size, 4, 4, 3)).astype(np.float32)
  y = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, size)]
  return jnp.asarray(x), jnp.asarray(y)


@pytest.mark.parametrize("alpha,p", [(0.5, 0.0), (0.0, 1.0)])
def test_mixup_off_is_the_identity(alpha, p):
  x, y = _batch()
  mx, my, w = mixup.mix(jax.random.key(0), x, y, alpha, p)
  np.testing.assert_array_equal(mx, x)
  np.testing.assert_array_equal(my, y)
  np.testing.assert_array_equal(w, 1.0)


def test_mixup_mixes_images_and_labels_with_the_same_weights():
  x, y = _batch()
  for seed in range(3):
    mx, my, w = mixup.mix(jax.random.key(seed), x, y, alpha=0.8, p=1.0)
    w = np.asarray(w)
    assert np.all(w == w[0]) and 0.5 <= w[0] < 1.0  # One draw, own >= half.
    partner_x, partner_y = np.roll(x, 1, axis=0), np.roll(y, 1, axis=0)
    np.testing.assert_allclose(mx, w[0] * x + (1 - w[0]) * partner_x,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(my, w[0] * y + (1 - w[0]) * partner_y,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.sum(my, -1), 1.0, rtol=1e-6)


def test_mixup_with_p_mixes_about_that_share():
  x, y = _batch(size=4000, classes=3)
  _, my, w = mixup.mix(jax.random.key(1), x, y, alpha=1.0, p=0.3)
  share = np.mean(np.asarray(w) < 1.0)
  assert 0.27 < share < 0.33
  unmixed = np.asarray(w) == 1.0
  np.testing.assert_array_equal(np.asarray(my)[unmixed], np.asarray(y)[unmixed])


def test_the_train_step_mixes_only_when_configured(digits_config):
  """The objective's loss with mixup equals the loss on the mixed batch
  that `mixup.mix` makes from the split key (the step's wiring)."""
  x, y = _batch(size=4, classes=7)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 16, 16, 3)),
                  jnp.float32)
  model = tiny_model()
  params = random_params(model)
  apply = lambda images, **kw: model.apply({"params": params}, images,
                                           train=True, **kw)
  rng = jax.random.key(3)
  plain = steps.supervised(steps.softmax_xent)
  mixed = steps.supervised(steps.softmax_xent, mixup_alpha=0.5, mixup_p=1.0)
  loss_plain, _ = plain(apply, {"image": x, "labels": y}, rng)
  loss_mixed, _ = mixed(apply, {"image": x, "labels": y}, rng)
  mixup_rng, _ = jax.random.split(rng)
  mx, my, _ = mixup.mix(mixup_rng, x, y, 0.5, 1.0)
  expected = jnp.mean(steps.softmax_xent(apply(mx)[0], my))
  np.testing.assert_allclose(loss_mixed, expected, rtol=1e-6)
  assert abs(float(loss_mixed) - float(loss_plain)) > 1e-4


# --------------------------------------------------------- stochastic depth --


def _outputs(model, params, x, train, seed=0):
  logits, _ = model.apply({"params": params}, x, train=train,
                          rngs={"dropout": jax.random.key(seed)})
  return np.asarray(logits)


def test_drop_path_rate_zero_is_no_drop_path():
  x = images()
  plain = tiny_model(dropout_rate=0.1)
  params = random_params(plain)
  with_zero = tiny_model(dropout_rate=0.1, drop_path_rate=0.0)
  # Bit for bit, in training too: dropout's random stream is unchanged.
  np.testing.assert_array_equal(_outputs(plain, params, x, True),
                                _outputs(with_zero, params, x, True))


def test_drop_path_is_off_at_evaluation_and_on_in_training():
  x = images()
  model = tiny_model(drop_path_rate=0.5)
  params = random_params(model)
  reference = _outputs(tiny_model(), params, x, False)
  np.testing.assert_array_equal(_outputs(model, params, x, False), reference)
  trained = [_outputs(model, params, x, True, seed) for seed in range(4)]
  assert not np.allclose(trained[0], reference, atol=1e-3)
  assert not np.allclose(trained[0], trained[1], atol=1e-3)


def test_drop_path_drops_whole_examples():
  """At rate 0.5 both branches of a block are dropped for about a quarter of
  the examples (its output is then exactly its input), for all of an
  example's tokens or none."""
  model = tiny_model(drop_path_rate=0.5)
  x = images(shape=(64, 16, 16, 3))
  params = random_params(model, x)
  _, out = model.apply({"params": params}, x, train=True,
                       rngs={"dropout": jax.random.key(0)},
                       return_intermediates=True)
  block_in, block_out = np.asarray(out["blocks"][0]), np.asarray(
      out["blocks"][1])
  same_BxN = np.all(block_in == block_out, axis=-1)
  assert np.all(same_BxN.all(1) | ~same_BxN.any(1))  # Whole examples.
  assert 6 <= same_BxN.all(1).sum() <= 26  # About 16 of 64.
  _, evaluated = model.apply({"params": params}, x, train=False,
                             return_intermediates=True)
  assert not np.any(np.all(np.asarray(evaluated["blocks"][0]) ==
                           np.asarray(evaluated["blocks"][1]), axis=-1))


# ------------------------------------------------------------ RandAugment --


def _images(count=6, size=32, seed=0):
  return np.random.default_rng(seed).integers(
      0, 256, (count, size, size, 3)).astype(np.uint8)


def _randaug_dataset(layer, images_u8, base=0):
  def fn(i, image):
    seed = tf.random.experimental.stateless_fold_in(
        tf.constant([base, 0], tf.int64), i)
    return randaug.apply(layer, image, seed)
  options = tf.data.Options()
  options.deterministic = True
  ds = tf.data.Dataset.from_tensor_slices(images_u8).enumerate().map(
      fn, num_parallel_calls=4).with_options(options)
  return np.stack(list(ds.as_numpy_iterator()))


def test_randaug_stays_in_range_and_is_deterministic_per_seed():
  images_u8 = _images()
  layer = randaug.make_layer(2, 15)
  first = _randaug_dataset(layer, images_u8)
  again = _randaug_dataset(randaug.make_layer(2, 15), images_u8)
  other = _randaug_dataset(layer, images_u8, base=1)
  assert first.dtype == np.float32 and first.shape == images_u8.shape
  assert first.min() >= 0.0 and first.max() <= 255.0
  np.testing.assert_array_equal(first, again)  # Parallel map, new layer.
  assert not np.array_equal(first, other)
  assert not np.array_equal(first, images_u8.astype(np.float32))


def test_randaug_computes_what_keras_computes():
  """Our dispatch (only the drawn operation) gives Keras's own pixels."""
  layer = randaug.make_layer(2, 20)
  image = tf.constant(_images(1)[0], tf.float32)[None]
  for seed in range(8):
    layer.use_seed(tf.constant([seed, 7], tf.int64))
    transformation = layer.get_random_transformation(image, training=True)
    ours = layer.transform_images(image, transformation)
    keras_own = super(type(layer), layer).transform_images(image,
                                                           transformation)
    np.testing.assert_array_equal(ours.numpy(), keras_own.numpy())


def test_randaug_in_a_pipeline_before_value_range():
  fn = preprocess.make_image_fn("randaug(2,10)|value_range", 32)
  out = fn(tf.constant(_images(1)[0]), tf.constant([0, 0], tf.int64)).numpy()
  assert out.shape == (32, 32, 3) and -1.0 <= out.min() and out.max() <= 1.0


def test_randaug_after_value_range_is_refused(digits_config):
  digits_config.pp_train = "inception_crop|value_range|randaug(2,10)"
  with pytest.raises(UserError, match="before value_range"):
    config_checks.check_config(digits_config, sharding.make_mesh())


# ---------------------------------------------------------------- presets --


@pytest.mark.parametrize("setting,magnitude,alpha", [
    ("none", None, 0.0), ("light1", 0, 0.0), ("light2", 10, 0.2),
    ("medium1", 15, 0.2), ("medium2", 15, 0.5), ("strong1", 20, 0.5),
    ("strong2", 20, 0.8)])
@pytest.mark.parametrize("data,bias", [("i1k", -6.9), ("i21k", -10.0)])
def test_augreg_presets(setting, magnitude, alpha, data, bias):
  config = pretrain.get_config(f"augreg_{data},aug={setting}")
  ops = [name for name, _ in preprocess.parse(config.pp_train)]
  if magnitude is None:
    assert "randaug" not in ops
  else:
    assert f"randaug(2,{magnitude})" in config.pp_train
  assert config.mixup.alpha == alpha
  assert config.model.head_bias_init == bias
  assert config.loss == "sigmoid_xent" and config.lr == 1e-3
  assert config.warmup_steps == 10_000 and config.decay_type == "cosine"
  assert config.num_epochs == 300


def test_augreg_preset_trains_locally(tfds_data_dir, tmp_path):
  """randaug, mixup and drop-path together, end to end on digits."""
  from vit_jax import trainer  # pylint: disable=g-import-not-at-top
  config = pretrain.get_config("augreg_i1k,aug=strong2,reg=0.1,runlocal")
  assert "randaug" in config.pp_train and config.mixup.alpha > 0
  assert config.model.drop_path_rate > 0
  config.data_dir = tfds_data_dir
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert np.isfinite(result["train/loss"])
  assert 0.0 <= result["test/accuracy"] <= 1.0
  batch = next(input_pipeline.make_train_iterator(
      config, input_pipeline.make_source(config)))
  assert batch["image"].dtype == np.uint8  # randaug stays on the host.
