"""AugReg's regularisers: mixup, stochastic depth, RandAugment, presets."""

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image
from PIL import ImageEnhance
from PIL import ImageOps
import pytest
import tensorflow as tf

from configs import pretrain
from tests.test_models import images
from tests.test_models import random_params
from tests.test_models import tiny_model
from vit_jax import sharding
from vit_jax.data import input_pipeline
from vit_jax.data import preprocess
from vit_jax.data import randaug
from vit_jax.data import specs
from vit_jax.errors import UserError
from vit_jax.loop import checks
from vit_jax.objectives import supervised
from vit_jax.training import losses
from vit_jax.training import mixup

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
    np.testing.assert_allclose(mx, w[0] * x + (1 - w[0]) * partner_x, rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(my, w[0] * y + (1 - w[0]) * partner_y, rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(np.sum(my, -1), 1.0, rtol=1e-6)


def test_mixup_with_p_mixes_about_that_share():
  x, y = _batch(size=4000, classes=3)
  _, my, w = mixup.mix(jax.random.key(1), x, y, alpha=1.0, p=0.3)
  share = np.mean(np.asarray(w) < 1.0)
  assert 0.27 < share < 0.33
  unmixed = np.asarray(w) == 1.0
  np.testing.assert_array_equal(np.asarray(my)[unmixed], np.asarray(y)[unmixed])


def test_the_train_step_mixes_only_when_configured():
  """The objective's loss with mixup equals the loss on the mixed batch
  that `mixup.mix` makes from the split key (the step's wiring)."""
  _, y = _batch(size=4, classes=7)
  x = jnp.asarray(images())
  model = tiny_model()
  params = random_params(model)
  apply = lambda images, **kw: model.apply({"params": params}, images, train=
                                           True, **kw)
  rng = jax.random.key(3)
  plain = supervised.classification_loss(losses.softmax_xent)
  mixed = supervised.classification_loss(losses.softmax_xent, mixup_alpha=0.5,
                                         mixup_p=1.0)
  loss_plain, _ = plain(apply, {"image": x, "labels": y}, rng)
  loss_mixed, _ = mixed(apply, {"image": x, "labels": y}, rng)
  mixup_rng, _ = jax.random.split(rng)
  mx, my, _ = mixup.mix(mixup_rng, x, y, 0.5, 1.0)
  expected = jnp.mean(losses.softmax_xent(apply(mx)[0], my))
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
  _, out = model.apply({"params": params}, x, train=True, rngs={
      "dropout": jax.random.key(0)
  }, return_intermediates=True)
  block_in, block_out = np.asarray(out["blocks"][0]), np.asarray(
      out["blocks"][1])
  same_BxN = np.all(block_in == block_out, axis=-1)
  assert np.all(same_BxN.all(1) | ~same_BxN.any(1))  # Whole examples.
  assert 6 <= same_BxN.all(1).sum() <= 26  # About 16 of 64.
  _, evaluated = model.apply({"params": params}, x, train=False,
                             return_intermediates=True)
  assert not np.any(
      np.all(
          np.asarray(evaluated["blocks"][0]) == np.asarray(
              evaluated["blocks"][1]), axis=-1))


# ------------------------------------------------------------ RandAugment --


def _images(count=6, size=32, seed=0):
  """Smooth gradients with noise: structure for every operation to act on."""
  rng = np.random.default_rng(seed)
  y, x = np.mgrid[0:size, 0:size] / size
  out = []
  for _ in range(count):
    base = np.stack([
        x * rng.uniform(50, 200), y * rng.uniform(50, 200),
        (x + y) * rng.uniform(20, 100)
    ], -1) + rng.uniform(0, 60)
    out.append(np.clip(base + rng.normal(0, 12, base.shape), 0, 255))
  return np.round(np.stack(out)).astype(np.uint8)


def _randaug_dataset(images_u8, magnitude=15, base=0):

  def fn(i, image):
    seed = tf.random.experimental.stateless_fold_in(
        tf.constant([base, 0], tf.int64), i)
    return randaug.randaug(image, seed, 2, magnitude)

  options = tf.data.Options()
  options.deterministic = True
  ds = tf.data.Dataset.from_tensor_slices(images_u8).enumerate().map(
      fn, num_parallel_calls=4).with_options(options)
  return np.stack(list(ds.as_numpy_iterator()))


def test_randaug_stays_in_range_and_is_deterministic_per_seed():
  images_u8 = _images()
  first = _randaug_dataset(images_u8)
  again = _randaug_dataset(images_u8)
  assert first.dtype == np.float32 and first.shape == images_u8.shape
  assert first.min() >= 0.0 and first.max() <= 255.0
  np.testing.assert_array_equal(first, again)  # A parallel map, run twice.
  assert not np.array_equal(first, images_u8.astype(np.float32))
  # Other seeds give other images (see also the one-operation test).
  other = randaug.randaug(images_u8[0], tf.constant([1, 0], tf.int64), 2, 15)
  assert not np.array_equal(first[0], other.numpy())


def _pil(image_u8):
  return Image.fromarray(image_u8)


@pytest.mark.parametrize("name,arg,pil_fn,tolerance", [
    ("AutoContrast", 0.0, ImageOps.autocontrast, 1),
    ("Equalize", 0.0, ImageOps.equalize, 0),
    ("Invert", 0.0, ImageOps.invert, 0),
    ("Posterize", 2.0, lambda im: ImageOps.posterize(im, 2), 0),
    ("Solarize", 100.0, lambda im: ImageOps.solarize(im, 100), 0),
    ("Color", 1.9, lambda im: ImageEnhance.Color(im).enhance(1.9), 1),
    ("Color", 0.1, lambda im: ImageEnhance.Color(im).enhance(0.1), 1),
    ("Contrast", 2.8, lambda im: ImageEnhance.Contrast(im).enhance(2.8), 1),
    ("Contrast", 0.1, lambda im: ImageEnhance.Contrast(im).enhance(0.1), 1),
    ("Brightness", 1.9, lambda im: ImageEnhance.Brightness(im).enhance(1.9), 1),
    ("Sharpness", 2.8, lambda im: ImageEnhance.Sharpness(im).enhance(2.8), 1),
    ("Sharpness", 0.1, lambda im: ImageEnhance.Sharpness(im).enhance(0.1), 1),
])
def test_pixel_operations_agree_with_pil(name, arg, pil_fn, tolerance):
  """PIL's ImageOps / ImageEnhance are the reference the policy's pixel
  operations were defined by."""
  operation = randaug.OPERATIONS[name][0]
  for image in _images(3, size=20):
    ours = operation(tf.constant(image), tf.constant(arg),
                     tf.constant([0, 0], tf.int64)).numpy()
    theirs = np.asarray(pil_fn(_pil(image)))
    assert ours.dtype == np.uint8
    assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= tolerance


def test_geometric_operations_move_pixels_as_stated():
  image = _images(1, size=9)[0]
  seed = tf.constant([0, 0], tf.int64)
  quarter = randaug.rotate(tf.constant(image), tf.constant(90.0), seed).numpy()
  np.testing.assert_array_equal(quarter, np.rot90(image))  # Anticlockwise.
  # 3 px of this 9-px image (the argument is in pixels of a 224-px one).
  shifted = randaug.translate_x(tf.constant(image), tf.constant(3 * 224 / 9),
                                seed).numpy()
  np.testing.assert_array_equal(shifted[:, 3:], image[:, :-3])
  assert np.all(shifted[:, :3] == randaug.GREY)
  sheared = randaug.shear_x(tf.constant(image), tf.constant(1.0), seed).numpy()
  for row in range(9):  # Row r moves left by r: out[r, c] = in[r, c + r].
    np.testing.assert_array_equal(sheared[row, :9 - row], image[row, row:])
  square = randaug.cutout(tf.constant(image), tf.constant(2 * 224 / 9),
                          seed).numpy()
  grey = np.all(square == randaug.GREY, -1)
  assert 1 <= grey.sum() <= 16 and not np.all(grey)


def test_arguments_follow_augregs_level_table():
  argument = lambda name, m: randaug.OPERATIONS[name][1](m)
  assert argument("Rotate", 15) == 45.0 and argument("Rotate", 20) == 60.0
  assert argument("ShearX", 10) == 0.3 and argument("TranslateY", 10) == 100
  assert argument("Posterize", 10) == 4 and argument("Posterize", 15) == 6
  assert argument("Solarize", 5) == 128 and argument("SolarizeAdd", 10) == 110
  assert argument("Contrast", 0) == pytest.approx(0.1)
  assert argument("Color", 10) == pytest.approx(1.9)
  assert argument("Cutout", 15) == 60
  signed = {n for n, (_, _, s) in randaug.OPERATIONS.items() if s}
  assert signed == {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"}


def test_one_operation_is_drawn_per_step_with_either_sign():
  """With one operation per image, every output is exactly one of the 16
  operations (the geometric ones turned either way); over 96 seeds most
  operations and both signs occur."""
  image = tf.constant(_images(1, size=16)[0])
  seed0 = tf.constant([0, 0], tf.int64)
  candidates = {}
  for name, (operation, argument, signed) in randaug.OPERATIONS.items():
    for sign in ((1.0, -1.0) if signed else (1.0,)):
      if name != "Cutout":  # Its square's place is random.
        out = operation(image, tf.constant(sign * argument(10.0)), seed0)
        candidates.setdefault(out.numpy().tobytes(), set()).add((name, sign))
  seen = set()
  for i in range(96):
    out = randaug.randaug(image, tf.constant([i, 1], tf.int64), 1, 10)
    out = out.numpy().astype(np.uint8).tobytes()
    if out in candidates:
      seen |= candidates[out]
  names = {name for name, _ in seen}
  assert len(names) >= 12
  assert ("Rotate", 1.0) in seen and ("Rotate", -1.0) in seen


def test_randaug_in_a_pipeline_before_value_range():
  fn = preprocess.make_image_fn("randaug(2,10)|value_range", 32)
  out = fn(tf.constant(_images(1)[0]), tf.constant([0, 0], tf.int64)).numpy()
  assert out.shape == (32, 32, 3) and -1.0 <= out.min() and out.max() <= 1.0


@pytest.mark.parametrize("spec",
                         ["randaug(2.5,10)", "randaug(2,40)", "randaug(-1,10)"])
def test_bad_randaug_arguments_are_refused(spec):
  with pytest.raises(UserError, match="randaug"):
    preprocess.parse(spec, 32)


def test_misplaced_regularisers_are_refused(digits_config):
  mesh = sharding.make_mesh()
  bad = digits_config.copy_and_resolve_references()
  bad.pp_train = "inception_crop|value_range|randaug(2,10)"
  with pytest.raises(UserError, match="before value_range"):
    checks.check_config(bad, mesh)
  bad = digits_config.copy_and_resolve_references()
  bad.pp_eval = "randaug(2,10)|resize|value_range"
  with pytest.raises(UserError, match="belongs in config.pp_train"):
    checks.check_config(bad, mesh)
  bad = digits_config.copy_and_resolve_references()
  bad.objective, bad.mixup.alpha = "masked_patch", 0.2
  with pytest.raises(UserError, match="config.mixup.alpha"):
    checks.check_config(bad, mesh)
  with pytest.raises(UserError, match="choose one with aug="):
    pretrain.get_config("augreg_i1k,variant=ViT-H/14")


# ---------------------------------------------------------------- presets --


@pytest.mark.parametrize("setting,magnitude,alpha", [("none", None, 0.0),
                                                     ("light1", 0, 0.0),
                                                     ("light2", 10, 0.2),
                                                     ("medium1", 15, 0.2),
                                                     ("medium2", 15, 0.5),
                                                     ("strong1", 20, 0.5),
                                                     ("strong2", 20, 0.8)])
@pytest.mark.parametrize("data,bias", [("i1k", -6.9), ("i21k", -10.0)])
def test_augreg_presets(setting, magnitude, alpha, data, bias):
  config = pretrain.get_config(f"augreg_{data},aug={setting}")
  ops = [op.name for op in preprocess.parse(config.pp_train, 224)]
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
  from vit_jax.loop import trainer  # pylint: disable=g-import-not-at-top
  config = pretrain.get_config("augreg_i1k,aug=strong2,reg=0.1,runlocal")
  assert "randaug" in config.pp_train and config.mixup.alpha > 0
  assert config.model.drop_path_rate > 0
  config.data_dir = tfds_data_dir
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert np.isfinite(result["train/loss"])
  assert 0.0 <= result["test/accuracy"] <= 1.0
  batch = next(
      input_pipeline.make_train_iterator(
          specs.training(config),
          input_pipeline.make_source(specs.training(config))))
  assert batch["image"].dtype == np.uint8  # randaug stays on the host.
