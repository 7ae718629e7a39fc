"""The preprocessing registry: one test per registered op (a new op without
one fails `test_every_op_is_tested`), arguments bound and checked when a
pipeline is parsed, and an op registered from outside the package."""

import numpy as np
import pytest
import tensorflow as tf

from vit_jax.data import preprocess
from vit_jax.errors import UserError

SEED = tf.constant([3, 0], tf.int64)
IMAGE = tf.constant(
    np.random.RandomState(0).randint(0, 256, (30, 40, 3)).astype(np.uint8))


def _apply(spec: str, size: int = 16, image=IMAGE):
  [op] = preprocess.parse(spec, size)
  return op.fn(image, SEED).numpy()


def _resize():
  assert _apply("resize").shape == (16, 16, 3)
  assert _apply("resize(20)").shape == (20, 20, 3)


def _resize_small():
  # The shorter side to size / 0.875 (16 -> 18), the aspect kept.
  assert _apply("resize_small").shape == (18, 24, 3)


def _central_crop():
  out = _apply("central_crop")
  np.testing.assert_array_equal(out, IMAGE.numpy()[7:23, 12:28])


def _inception_crop():
  out = _apply("inception_crop(0.5)")
  assert out.shape == (16, 16, 3) and out.min() >= 0 and out.max() <= 255
  [op] = preprocess.parse("inception_crop", 16)
  assert op.from_encoded is not None  # Can start from an encoded image.


def _flip_lr():
  [op] = preprocess.parse("flip_lr", 16)
  outs = [
      op.fn(IMAGE, tf.constant([s, 0], tf.int64)).numpy() for s in range(20)
  ]
  image = IMAGE.numpy()
  assert all(
      np.array_equal(o, image) or np.array_equal(o, image[:, ::-1])
      for o in outs)
  assert {np.array_equal(o, image) for o in outs} == {True, False}


def _randaug():
  out = _apply("randaug(2,15)")
  assert out.shape == IMAGE.shape and out.min() >= 0 and out.max() <= 255


def _value_range():
  out = _apply("value_range")
  np.testing.assert_allclose(out, IMAGE.numpy() / 127.5 - 1, atol=1e-6)


def _sequence_op(spec: str):
  [op] = preprocess.parse(spec, 16, patch_size=4, sequence_length=24)
  return op.fn(IMAGE, SEED)


def _resize_to_sequence():
  # 30 x 40 -> the largest grid within 24 patches of 4 px: 4 x 6.
  assert _sequence_op("resize_to_sequence").shape == (16, 24, 3)
  assert _sequence_op("resize_to_sequence(2, 12)").shape == (6, 8, 3)


def _resize_to_random_sequence():
  sizes = {
      tuple(op.fn(IMAGE, tf.constant([i, 0], tf.int64)).shape)
      for i in range(12)
      for op in preprocess.parse("resize_to_random_sequence(4)", 16,
                                 patch_size=4, sequence_length=24)
  }
  assert len(sizes) > 2 and all(h * w <= 24 * 16 for h, w, _ in sizes)


def _aspect_crop():
  height, width, _ = _apply("aspect_crop(0.5)").shape
  assert 0.5 * 30 * 40 - 60 <= height * width <= 30 * 40
  assert abs(width / height - 40 / 30) < 0.1


def _patchify():
  with pytest.raises(tf.errors.InvalidArgumentError, match="more patches"):
    _sequence_op("patchify")  # 30 x 40: 7 x 10 patches, more than 24.
  [op] = preprocess.parse("patchify", 16, patch_size=8, sequence_length=24)
  out = op.fn(IMAGE, SEED)
  assert out["patches"].shape == (
      24, 192) and out["grids"].numpy().tolist() == [[3, 5]]


CASES = {
    "resize_to_sequence": _resize_to_sequence,
    "resize_to_random_sequence": _resize_to_random_sequence,
    "aspect_crop": _aspect_crop,
    "patchify": _patchify,
    "resize": _resize,
    "resize_small": _resize_small,
    "central_crop": _central_crop,
    "inception_crop": _inception_crop,
    "flip_lr": _flip_lr,
    "randaug": _randaug,
    "value_range": _value_range,
}


@pytest.mark.parametrize("name", CASES)
def test_op(name):
  CASES[name]()


def test_every_op_is_tested():
  assert set(preprocess.known_ops()) == set(CASES)


@pytest.mark.parametrize("spec, message", [
    ("flip_lr(3)", "Op 'flip_lr(3)' in 'flip_lr(3)': too many positional"),
    ("resize(1, 2)", "Op 'resize(1, 2)' in 'resize(1, 2)': too many"),
    ("inception_crop(2)", "its minimum area 2 is not in"),
    ("randaug(2,40)", "randaug's magnitude 40 is outside"),
    ("inception_crop(x)", "its arguments are not Python literals"),
    ("blur", "Unknown preprocessing op 'blur' in 'blur'. Known ops: "),
])
def test_a_bad_op_is_refused_when_parsed_naming_it(spec, message):
  with pytest.raises(UserError, match=message.replace("(", r"\(").replace(
      ")", r"\)")):
    preprocess.parse(spec, 16)


def test_an_op_registered_elsewhere_joins_pipelines(monkeypatch):
  """What a user's module does (config.imports loads it): register a
  factory; its arguments and the context's size reach it."""
  monkeypatch.setattr(preprocess, "_REGISTRY", dict(preprocess._REGISTRY))

  @preprocess.register("test_invert")
  def invert(scale=1.0, *, size):
    del size
    return lambda image, seed: 255.0 * scale - tf.cast(image, tf.float32)

  fn = preprocess.make_image_fn("resize|test_invert(1.0)|value_range", 8)
  out = fn(IMAGE, SEED).numpy()
  plain = preprocess.make_image_fn("resize|value_range", 8)(IMAGE, SEED)
  np.testing.assert_allclose(out, -plain.numpy(), atol=1e-5)
  with pytest.raises(UserError, match="test_invert"):
    preprocess.parse("test_invert(1, 2)", 8)
  with pytest.raises(UserError, match="'flip_lr' is registered twice"):
    preprocess.register("flip_lr")(invert)
