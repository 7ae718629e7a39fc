"""Image preprocessing ops, chosen by name in the config.

A pipeline is a string of ops joined by `|`, e.g. the paper's training recipe
`"inception_crop|flip_lr|value_range"` and its evaluation recipe
`"resize_small|central_crop|value_range"`. An op may take numeric arguments:
`inception_crop(0.35)` crops at least 35% of the area, `randaug(2,15)` is
RandAugment with 2 operations at magnitude 15 (`randaug.py`). Every op maps
`(image uint8/float HxWxC, seed, size, *args) -> image`; random ops are
stateless and take a per-example seed, so the pipeline is deterministic.
Grayscale images always become 3-channel; the output is float32 (uint8
where the train step applies the last op, see `make_image_fn`).

Sources hand over images still encoded (`Encoded`). Where a pipeline starts
with `inception_crop` and the file is a JPEG, only the sampled window is
decoded (`tf.image.decode_and_crop_jpeg`, as Inception-style pipelines do):
exactly the pixels of decoding the whole image and cropping it, for a
fraction of the work (`crop_on_decode=False` decodes the whole image first).
"""

import ast
import dataclasses
import re
from typing import Callable

import tensorflow as tf

from vit_jax.data import randaug as randaug_lib
from vit_jax.errors import UserError

Op = Callable[[tf.Tensor, tf.Tensor, int], tf.Tensor]

# Resize the shorter side to size/0.875 before a central crop (224 -> 256).
_CROP_FRACTION = 0.875


def resize(image, seed, size, to=None):
  """Plain resize to size x size, or to x to (`resize(256)` before a
  central crop, as big_vision's few-shot evaluation); upsamples small
  images such as digits."""
  del seed
  to = size if to is None else int(to)
  return tf.image.resize(tf.cast(image, tf.float32), (to, to),
                         method="bilinear", antialias=True)


def resize_small(image, seed, size):
  """Resizes the shorter side to size / 0.875, keeping the aspect ratio."""
  del seed
  target = tf.cast(tf.math.round(size / _CROP_FRACTION), tf.float32)
  height, width = tf.unstack(tf.cast(tf.shape(image)[:2], tf.float32))
  scale = target / tf.minimum(height, width)
  new_hw = tf.cast(tf.math.round(tf.stack([height, width]) * scale), tf.int32)
  return tf.image.resize(tf.cast(image, tf.float32), new_hw, method="bilinear",
                         antialias=True)


def central_crop(image, seed, size):
  """Crops the central size x size window (image must be at least that big)."""
  del seed
  height, width = tf.shape(image)[0], tf.shape(image)[1]
  top, left = (height - size) // 2, (width - size) // 2
  return image[top:top + size, left:left + size]


def inception_box(shape, seed, min_area=0.05):
  """(begin, size) of a random box of min_area-100% area, aspect 3/4-4/3."""
  begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
      shape, bounding_boxes=tf.zeros([1, 0, 4], tf.float32), seed=seed,
      area_range=(min_area, 1.0), aspect_ratio_range=(3 / 4, 4 / 3),
      min_object_covered=0.0, use_image_if_no_bounding_boxes=True)
  return begin, crop_size


def inception_crop(image, seed, size, min_area=0.05, antialias=False):
  """Inception-style random crop (see `inception_box`), resized to size
  (bilinear; `antialias` also low-pass filters a crop that shrinks)."""
  begin, crop_size = inception_box(tf.shape(image), seed, min_area)
  return _resize_square(tf.slice(image, begin, crop_size), size, antialias)


def _resize_square(image, size, antialias=True):
  return tf.image.resize(tf.cast(image, tf.float32), (size, size),
                         method="bilinear", antialias=antialias)


def flip_lr(image, seed, size):
  del size
  return tf.image.stateless_random_flip_left_right(image, seed=seed)


def randaug(image, seed, size, num_ops=2, magnitude=10):
  """RandAugment: `num_ops` random operations at `magnitude` (AugReg's
  scale, e.g. randaug(2,15)); see `randaug.py`. Input and output in
  [0, 255], so it goes before value_range."""
  del size
  return randaug_lib.randaug(image, seed, num_ops, magnitude)


def value_range(image, seed, size):
  """Maps [0, 255] to [-1, 1]."""
  del seed, size
  return tf.cast(image, tf.float32) / 127.5 - 1.0


OPS: dict[str, Op] = {
    "resize": resize,
    "resize_small": resize_small,
    "central_crop": central_crop,
    "inception_crop": inception_crop,
    "flip_lr": flip_lr,
    "randaug": randaug,
    "value_range": value_range,
}

_OP_PATTERN = re.compile(r"^(\w+)(?:\((.*)\))?$")


def parse(spec: str) -> list[tuple[str, tuple[float, ...]]]:
  """Splits and validates a pipeline string into (op name, args) pairs."""
  ops = []
  for part in (p.strip() for p in spec.split("|") if p.strip()):
    match = _OP_PATTERN.match(part)
    if not match or match.group(1) not in OPS:
      raise UserError(f"Unknown preprocessing op {part!r} in {spec!r}. "
                      f"Known ops: {', '.join(OPS)}.")
    try:
      args = ast.literal_eval(f"({match.group(2)},)") if match.group(2) else ()
      if not all(isinstance(a, (int, float)) for a in args):
        raise ValueError
    except (ValueError, SyntaxError) as e:
      raise UserError(f"Op {part!r} in {spec!r} takes numbers as arguments, "
                      "e.g. inception_crop(0.35).") from e
    if match.group(1) == "randaug":
      try:
        randaug_lib.check_arguments(*args)
      except (ValueError, TypeError) as e:
        raise UserError(f"Op {part!r} in {spec!r}: {e} Use e.g. "
                        "randaug(2,15).") from e
    ops.append((match.group(1), tuple(args)))
  return ops


@dataclasses.dataclass(frozen=True)
class Encoded:
  """An image file's bytes and the source's decoder for them."""
  data: tf.Tensor  # Scalar string: the encoded image.
  decode: Callable[[tf.Tensor], tf.Tensor]  # data -> uint8 HxWxC.


def _rgb(image):
  return tf.image.grayscale_to_rgb(image) if image.shape[-1] == 1 else image


def decode_inception_window(encoded: Encoded, seed, min_area=0.05):
  """The `inception_crop` window of an encoded image, uint8 HxWx3: a JPEG
  decodes only that window; other formats decode whole, then crop. The
  window is the one `inception_crop` samples with this seed."""
  data = encoded.data

  def jpeg():
    shape = tf.image.extract_jpeg_shape(data)
    begin, crop_size = inception_box(shape, seed, min_area)
    # libjpeg upsamples subsampled chroma at a window's left and right edges
    # from the edge column alone: one more column each side, cut off after,
    # gives exactly the whole image's pixels.
    left = tf.minimum(begin[1], 1)
    right = tf.minimum(shape[1] - begin[1] - crop_size[1], 1)
    window = tf.stack(
        [begin[0], begin[1] - left, crop_size[0], crop_size[1] + left + right])
    wider = tf.image.decode_and_crop_jpeg(data, window, channels=3)
    return wider[:, left:left + crop_size[1]]

  def other():
    image = _rgb(encoded.decode(data))
    begin, crop_size = inception_box(tf.shape(image), seed, min_area)
    return tf.slice(image, begin, crop_size)

  return tf.ensure_shape(tf.cond(tf.io.is_jpeg(data), jpeg, other),
                         (None, None, 3))


def make_image_fn(
    spec: str, size: int, *, crop_on_decode: bool = True,
    crop_antialias: bool = False,
    uint8: bool = False) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """Returns `fn(image, seed) -> float32 size x size x 3` for a pipeline;
  `image` is a decoded uint8 tensor or `Encoded` (see the module doc).
  `crop_antialias` is inception_crop's; with `uint8` a pipeline ending in
  value_range stops before it and returns the image rounded to uint8."""
  ops = parse(spec)
  uint8 = uint8 and bool(ops) and ops[-1][0] == "value_range"
  if uint8:
    ops = ops[:-1]
  # A distinct stateless seed per op keeps random ops independent.
  op_seed = lambda seed, i: tf.random.experimental.stateless_fold_in(seed, i)
  apply = lambda name, image, seed, args: (
      inception_crop(image, seed, size, *args, antialias=crop_antialias)
      if name == "inception_crop" else OPS[name](image, seed, size, *args))

  def fn(image, seed):
    first = 0
    if isinstance(image, Encoded):
      if crop_on_decode and ops and ops[0][0] == "inception_crop":
        window = decode_inception_window(image, op_seed(seed, 0), *ops[0][1])
        image, first = _resize_square(window, size, crop_antialias), 1
      else:
        image = image.decode(image.data)
    image = _rgb(image)
    for i, (name, args) in enumerate(ops[first:], first):
      image = apply(name, image, op_seed(seed, i), args)
    if uint8:  # Resized values are within [0, 255]; round to the nearest.
      image = tf.cast(tf.round(tf.cast(image, tf.float32)), tf.uint8)
    return tf.ensure_shape(tf.cast(image, tf.uint8 if uint8 else tf.float32),
                           (size, size, 3))

  return fn
