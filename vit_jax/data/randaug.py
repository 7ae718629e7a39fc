"""RandAugment (Cubuk et al. 2020) as AugReg trained with it: `randaug(N, M)`.

N times, one of 16 operations is drawn uniformly and applied at magnitude
M, on big_vision's 0-10 level scale (AugReg's settings go up to 20, which
extrapolates). The operations and their arguments at level M are those of
the EfficientNet RandAugment that big_vision's `randaug` op uses:

  AutoContrast, Equalize, Invert          no argument
  Rotate                                  +-30 deg x M/10
  ShearX, ShearY                          +-0.3 x M/10
  TranslateX, TranslateY                  +-100 px x M/10 (*)
  Posterize                               keep int(4 x M/10) bits
  Solarize                                invert above int(256 x M/10)
  SolarizeAdd                             add int(110 x M/10) below 128
  Color, Contrast, Brightness, Sharpness  blend factor 0.1 + 1.8 x M/10
  Cutout                                  a grey square of side 2 int(40 x M/10)
                                          (*)

(*) in pixels of a 224-px image, AugReg's resolution; they scale with the
image (big_vision keeps them absolute, which at 16 px shifts every pixel
out of the image).
(+- is a random sign; geometric operations sample nearest pixels and fill
with grey 128.) The pixel operations follow PIL's ImageOps and ImageEnhance
(tested against PIL), with one deliberate difference from big_vision's
copy: its Contrast blends with a grey of (pixel count / 256) rather than
the image's mean grey, a slip in that code; here it is the mean, as in PIL.

Why not a library's RandAugment: Keras 3's `keras.layers.RandAugment` draws
geometric and colour strengths from [0, f] (every image is rotated, sheared
and shifted the same way round; a strength of 0.5 rotates by up to 180
degrees) and has no AugReg magnitude scale; the TF Model Garden's pins an
older TensorFlow. Every draw here comes from the example's stateless seed,
so a resumed run sees the same images. Images are uint8 inside (as in
big_vision); input and output are [0, 255], before value_range.
"""

from __future__ import annotations

import math

from vit_jax.config import imports

tf = imports.lazy("tensorflow")  # Loaded where data is first read.

MAX_LEVEL = 10.0
GREY = 128
TRANSLATE_PIXELS = 100.0  # At level 10 (EfficientNet's constant).
CUTOUT_PIXELS = 40.0  # Half the side of the square at level 10.
REFERENCE_SIZE = 224.0  # The image size those pixel counts are for.


def _blend(degenerate, image, factor):
  """PIL's Image.blend: degenerate + factor (image - degenerate), clipped,
  truncated to uint8."""
  degenerate, image = tf.cast(degenerate, tf.float32), tf.cast(
      image, tf.float32)
  mixed = degenerate + factor * (image - degenerate)
  return tf.cast(tf.clip_by_value(mixed, 0.0, 255.0), tf.uint8)


def _grey(image):
  """PIL's "L" conversion (ITU-R 601-2 luma, rounded), as uint8 HxWx1."""
  rgb = tf.cast(image, tf.float32)
  luma = rgb[..., :1] * 0.299 + rgb[..., 1:2] * 0.587 + rgb[..., 2:] * 0.114
  return tf.cast(tf.round(luma), tf.uint8)


def _affine(image, transform):
  """Projective `transform` (output -> input coordinates, 8 numbers),
  nearest pixel, grey outside the image."""
  shape = tf.shape(image)[:2]
  out = tf.raw_ops.ImageProjectiveTransformV3(
      images=image[None], transforms=tf.cast(
          tf.stack(transform)[None], tf.float32), output_shape=shape,
      fill_value=float(GREY), interpolation="NEAREST", fill_mode="CONSTANT")
  return out[0]


# Each operation: (uint8 image, argument, seed) -> uint8 image.
def auto_contrast(image, arg, seed):
  del arg, seed

  def channel(c):
    lo, hi = tf.reduce_min(c), tf.reduce_max(c)
    lo, hi = tf.cast(lo, tf.float32), tf.cast(hi, tf.float32)
    scale = 255.0 / tf.maximum(hi - lo, 1.0)
    stretched = tf.clip_by_value((tf.cast(c, tf.float32) - lo) * scale, 0, 255)
    return tf.where(hi > lo, tf.cast(stretched, tf.uint8), c)

  return tf.stack([channel(image[..., i]) for i in range(3)], -1)


def equalize(image, arg, seed):
  """PIL's ImageOps.equalize, channel by channel."""
  del arg, seed

  def channel(c):
    values = tf.reshape(tf.cast(c, tf.int32), [-1])
    hist = tf.math.bincount(values, minlength=256, maxlength=256)
    last = tf.gather(hist, tf.reduce_max(tf.where(hist > 0)))
    step = (tf.reduce_sum(hist) - last) // 255
    lut = (tf.cumsum(hist) - hist + step // 2) // tf.maximum(step, 1)
    lut = tf.cast(tf.clip_by_value(lut, 0, 255), tf.uint8)
    return tf.where(step > 0, tf.gather(lut, tf.cast(c, tf.int32)), c)

  return tf.stack([channel(image[..., i]) for i in range(3)], -1)


def invert(image, arg, seed):
  del arg, seed
  return 255 - image


def rotate(image, degrees, seed):
  del seed
  height, width = (
      tf.cast(s, tf.float32) for s in tf.unstack(tf.shape(image)[:2]))
  radians = degrees * math.pi / 180.0
  cos, sin = tf.cos(radians), tf.sin(radians)
  # About the image centre, as tf-addons' rotate.
  dx = ((width - 1) - (cos * (width - 1) - sin * (height - 1))) / 2.0
  dy = ((height - 1) - (sin * (width - 1) + cos * (height - 1))) / 2.0
  return _affine(image, [cos, -sin, dx, sin, cos, dy, 0.0, 0.0])


def shear_x(image, level, seed):
  del seed
  return _affine(image, [1.0, level, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])


def shear_y(image, level, seed):
  del seed
  return _affine(image, [1.0, 0.0, 0.0, level, 1.0, 0.0, 0.0, 0.0])


def _scaled(pixels, size):
  """Pixels of a REFERENCE_SIZE image, for an image of `size` pixels."""
  return pixels * tf.cast(size, tf.float32) / REFERENCE_SIZE


def translate_x(image, pixels, seed):
  del seed
  shift = _scaled(pixels, tf.shape(image)[1])
  return _affine(image, [1.0, 0.0, -shift, 0.0, 1.0, 0.0, 0.0, 0.0])


def translate_y(image, pixels, seed):
  del seed
  shift = _scaled(pixels, tf.shape(image)[0])
  return _affine(image, [1.0, 0.0, 0.0, 0.0, 1.0, -shift, 0.0, 0.0])


def posterize(image, bits, seed):
  del seed
  shift = 8 - tf.cast(bits, tf.int32)
  keep = tf.cast(tf.bitwise.left_shift(255, shift) & 255, tf.uint8)
  return tf.bitwise.bitwise_and(image, keep)


def solarize(image, threshold, seed):
  del seed
  return tf.where(tf.cast(image, tf.float32) < threshold, image, 255 - image)


def solarize_add(image, addition, seed):
  del seed
  added = tf.clip_by_value(tf.cast(image, tf.float32) + addition, 0, 255)
  return tf.where(image < GREY, tf.cast(added, tf.uint8), image)


def color(image, factor, seed):
  del seed
  return _blend(tf.image.grayscale_to_rgb(_grey(image)), image, factor)


def contrast(image, factor, seed):
  del seed
  mean = tf.round(tf.reduce_mean(tf.cast(_grey(image), tf.float32)))
  return _blend(tf.fill(tf.shape(image), mean), image, factor)


def brightness(image, factor, seed):
  del seed
  return _blend(tf.zeros_like(image), image, factor)


def sharpness(image, factor, seed):
  """Blends with PIL's SMOOTH filter of the image (3x3, centre 5, sum 13);
  the one-pixel border keeps its values."""
  del seed
  kernel = tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32) / 13.0
  kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
  smooth = tf.nn.depthwise_conv2d(
      tf.cast(image, tf.float32)[None], kernel, [1, 1, 1, 1], "VALID")[0]
  smooth = tf.cast(tf.clip_by_value(tf.round(smooth), 0, 255), tf.uint8)
  inner = tf.pad(smooth, [[1, 1], [1, 1], [0, 0]])
  height, width = tf.shape(image)[0], tf.shape(image)[1]
  rows, cols = tf.range(height)[:, None, None], tf.range(width)[None, :, None]
  is_inner = ((rows > 0) & (rows < height - 1) & (cols > 0) &
              (cols < width - 1))
  return _blend(tf.where(is_inner, inner, image), image, factor)


def cutout(image, half_side, seed):
  """A grey square of side 2 x half_side (scaled) at a random centre (cut
  off at the image's edges)."""
  height, width = tf.shape(image)[0], tf.shape(image)[1]
  draw = tf.random.stateless_uniform([2], seed, 0, 2**30, tf.int32)
  centre = draw % tf.stack([height, width])
  half = tf.cast(tf.round(_scaled(half_side, tf.minimum(height, width))),
                 tf.int32)
  rows, cols = tf.range(height)[:, None, None], tf.range(width)[None, :, None]
  inside = ((rows >= centre[0] - half) & (rows < centre[0] + half) &
            (cols >= centre[1] - half) & (cols < centre[1] + half))
  return tf.where(inside, tf.cast(GREY, tf.uint8), image)


# name -> (operation, its argument at level M, whether the sign is random).
OPERATIONS = {
    "AutoContrast": (auto_contrast, lambda m: 0.0, False),
    "Equalize": (equalize, lambda m: 0.0, False),
    "Invert": (invert, lambda m: 0.0, False),
    "Rotate": (rotate, lambda m: m / MAX_LEVEL * 30.0, True),
    "Posterize": (posterize, lambda m: float(int(m / MAX_LEVEL * 4)), False),
    "Solarize": (solarize, lambda m: float(int(m / MAX_LEVEL * 256)), False),
    "Color": (color, lambda m: m / MAX_LEVEL * 1.8 + 0.1, False),
    "Contrast": (contrast, lambda m: m / MAX_LEVEL * 1.8 + 0.1, False),
    "Brightness": (brightness, lambda m: m / MAX_LEVEL * 1.8 + 0.1, False),
    "Sharpness": (sharpness, lambda m: m / MAX_LEVEL * 1.8 + 0.1, False),
    "ShearX": (shear_x, lambda m: m / MAX_LEVEL * 0.3, True),
    "ShearY": (shear_y, lambda m: m / MAX_LEVEL * 0.3, True),
    "TranslateX": (
        translate_x, lambda m: m / MAX_LEVEL * TRANSLATE_PIXELS, True),
    "TranslateY": (
        translate_y, lambda m: m / MAX_LEVEL * TRANSLATE_PIXELS, True),
    "Cutout": (
        cutout, lambda m: float(int(m / MAX_LEVEL * CUTOUT_PIXELS)), False),
    "SolarizeAdd": (
        solarize_add, lambda m: float(int(m / MAX_LEVEL * 110)), False),
}


def check_arguments(num_ops, magnitude):
  """Raises ValueError for arguments randaug cannot use."""
  if num_ops != int(num_ops) or num_ops < 0:
    raise ValueError(f"randaug's number of operations must be a whole "
                     f"number >= 0, not {num_ops}.")
  if not 0 <= magnitude <= 30:
    raise ValueError(f"randaug's magnitude {magnitude} is outside [0, 30] "
                     "(big_vision's 0-10 level scale; AugReg uses up to 20).")


def randaug(image, seed, num_ops: int = 2, magnitude: float = 10.0):
  """RandAugment of one HxWx3 image in [0, 255] with a stateless seed:
  float32 in [0, 255] (whole numbers: the operations work on uint8)."""
  check_arguments(num_ops, magnitude)
  image = tf.cast(
      tf.clip_by_value(tf.round(tf.cast(image, tf.float32)), 0, 255), tf.uint8)
  names = list(OPERATIONS)
  for i in range(int(num_ops)):
    op_seed = tf.random.experimental.stateless_fold_in(seed, i)
    choice_seed, sign_seed, own_seed = tf.unstack(
        tf.random.experimental.stateless_split(op_seed, 3))
    chosen = tf.random.stateless_uniform([], choice_seed, 0, len(names),
                                         tf.int32)
    sign = tf.where(tf.random.stateless_uniform([], sign_seed) < 0.5, -1.0, 1.0)

    def branch(name, x=image, sign=sign, own_seed=own_seed):
      operation, argument, signed = OPERATIONS[name]
      arg = argument(float(magnitude))
      return operation(x, sign * arg if signed else tf.constant(arg), own_seed)

    image = tf.switch_case(chosen, [lambda n=n: branch(n) for n in names])
    image = tf.ensure_shape(image, (None, None, 3))
  return tf.cast(image, tf.float32)
