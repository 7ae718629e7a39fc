"""Image preprocessing: ops registered by name, chosen in the config.

A pipeline is a string of ops joined by `|`, e.g. the paper's training recipe
`"inception_crop|flip_lr|value_range"` and its evaluation recipe
`"resize_small|central_crop|value_range"`. An op may take arguments, Python
literals: `inception_crop(0.35)` crops at least 35% of the area,
`randaug(2,15)` is RandAugment with 2 operations at magnitude 15.

An op is a factory registered with `@register("name")`. `parse` calls it
with the pipeline's arguments and, by keyword, with what it asks for of the
pipeline's context (`size`: the output resolution; `antialias`:
config.pp_crop_antialias), when the string is parsed: a wrong argument is an
error naming the op before anything compiles. It returns `fn(image, seed)
-> image`, or an `Op` that also says how to start from an image still
encoded (`from_encoded`: inception_crop decodes only its window of a JPEG,
exactly the pixels of decoding the whole image and cropping it, for a
fraction of the work). Random ops are stateless and take a per-example,
per-op seed, so the pipeline is deterministic. Grayscale images become
3-channel; the output is float32, or uint8 where the train step applies the
last op (see `make_image_fn`). A module of the user's registers more ops the
same way (config.imports loads it).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from typing import Any
from typing import Callable
from typing import Optional

from vit_jax import models
from vit_jax.config import imports
from vit_jax.data import randaug as randaug_lib
from vit_jax.data import sequence_ops
from vit_jax.errors import UserError

tf = imports.lazy("tensorflow")  # Loaded where data is first read.

# (image, seed) -> image.
ImageFn = Callable[["tf.Tensor", "tf.Tensor"], "tf.Tensor"]


@dataclasses.dataclass(frozen=True)
class Op:
  """One op of a parsed pipeline."""
  fn: ImageFn
  # (Encoded, seed) -> image: the op applied to an image not yet decoded.
  from_encoded: Optional[Callable[[Any, tf.Tensor], tf.Tensor]] = None
  name: str = ""  # Set by `parse`.
  args: tuple = ()  # The pipeline's arguments, as written.


_REGISTRY: dict[str, Callable[..., Any]] = {}
# What a factory may ask for by keyword, besides the pipeline's arguments.
CONTEXT = ("size", "antialias", "patch_size", "sequence_length")


def register(name: str):
  """Registers the decorated factory as the op `name`."""

  def add(factory):
    # Compared by where it is defined: a module loaded again (a reload, or
    # by path and by name) registers the same op again.
    origin = lambda f: (f.__code__.co_filename, f.__qualname__)
    if name in _REGISTRY and origin(_REGISTRY[name]) != origin(factory):
      raise UserError(
          f"The preprocessing op {name!r} is registered twice: by "
          f"{_REGISTRY[name].__module__} and {factory.__module__}; rename "
          "one.")
    _REGISTRY[name] = factory
    return factory

  return add


def known_ops() -> list[str]:
  return sorted(_REGISTRY)


# Resize the shorter side to size/0.875 before a central crop (224 -> 256).
_CROP_FRACTION = 0.875


@register("resize")
def resize(to=None, *, size):
  """Plain resize to size x size, or to x to (`resize(256)` before a
  central crop, as big_vision's few-shot evaluation); upsamples small
  images such as digits."""
  to = size if to is None else int(to)
  return lambda image, seed: tf.image.resize(tf.cast(image, tf.float32), (
      to, to), method="bilinear", antialias=True)


@register("resize_small")
def resize_small(*, size):
  """Resizes the shorter side to size / 0.875, keeping the aspect ratio."""

  def fn(image, seed):
    del seed
    target = tf.cast(tf.math.round(size / _CROP_FRACTION), tf.float32)
    height, width = tf.unstack(tf.cast(tf.shape(image)[:2], tf.float32))
    scale = target / tf.minimum(height, width)
    new_hw = tf.cast(tf.math.round(tf.stack([height, width]) * scale), tf.int32)
    return tf.image.resize(tf.cast(image, tf.float32), new_hw,
                           method="bilinear", antialias=True)

  return fn


@register("central_crop")
def central_crop(*, size):
  """Crops the central size x size window (image must be at least that big)."""

  def fn(image, seed):
    del seed
    height, width = tf.shape(image)[0], tf.shape(image)[1]
    top, left = (height - size) // 2, (width - size) // 2
    return image[top:top + size, left:left + size]

  return fn


def inception_box(shape, seed, min_area=0.05):
  """(begin, size) of a random box of min_area-100% area, aspect 3/4-4/3."""
  begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
      shape, bounding_boxes=tf.zeros([1, 0, 4], tf.float32), seed=seed,
      area_range=(min_area, 1.0), aspect_ratio_range=(3 / 4, 4 / 3),
      min_object_covered=0.0, use_image_if_no_bounding_boxes=True)
  return begin, crop_size


@register("inception_crop")
def inception_crop(min_area=0.05, *, size, antialias=False):
  """Inception-style random crop (see `inception_box`), resized to size
  (bilinear; `antialias` also low-pass filters a crop that shrinks). From
  an encoded JPEG it decodes only the crop (`decode_inception_window`)."""
  if not 0 < min_area <= 1:
    raise ValueError(f"its minimum area {min_area} is not in (0, 1].")

  def crop(image, seed):
    begin, crop_size = inception_box(tf.shape(image), seed, min_area)
    return _resize_square(tf.slice(image, begin, crop_size), size, antialias)

  def from_encoded(encoded, seed):
    window = decode_inception_window(encoded, seed, min_area)
    return _resize_square(window, size, antialias)

  return Op(crop, from_encoded)


def _resize_square(image, size, antialias=True):
  return tf.image.resize(tf.cast(image, tf.float32), (size, size),
                         method="bilinear", antialias=antialias)


@register("flip_lr")
def flip_lr():
  return lambda image, seed: tf.image.stateless_random_flip_left_right(
      image, seed=seed)


@register("randaug")
def randaug(num_ops=2, magnitude=10):
  """RandAugment: `num_ops` random operations at `magnitude` (AugReg's
  scale, e.g. randaug(2,15)); see `randaug.py`. Input and output in
  [0, 255], so it goes before value_range."""
  randaug_lib.check_arguments(num_ops, magnitude)
  return lambda image, seed: randaug_lib.randaug(image, seed, num_ops, magnitude
                                                )


@register("value_range")
def value_range():
  """Maps [0, 255] to [-1, 1]."""
  return lambda image, seed: tf.cast(image, tf.float32) / 127.5 - 1.0


_OP_PATTERN = re.compile(r"^(\w+)(?:\((.*)\))?$")


def parse(spec: str, size: int, antialias: bool = False, patch_size: int = 0,
          sequence_length: Optional[int] = None) -> list[Op]:
  """The ops of a pipeline string, each made by its factory with the
  string's arguments and the context (see the module doc; `patch_size`,
  `sequence_length`: images at their own shape, `sequence_ops`)."""
  context = {
      "size": size,
      "antialias": antialias,
      "patch_size": patch_size,
      "sequence_length": sequence_length
  }
  ops = []
  for part in (p.strip() for p in spec.split("|") if p.strip()):
    match = _OP_PATTERN.match(part)
    if not match or match.group(1) not in _REGISTRY:
      raise UserError(f"Unknown preprocessing op {part!r} in {spec!r}. "
                      f"Known ops: {', '.join(known_ops())}.")
    name, factory = match.group(1), _REGISTRY[match.group(1)]
    try:
      args = ast.literal_eval(f"({match.group(2)},)") if match.group(2) else ()
    except (ValueError, SyntaxError) as e:
      raise UserError(f"Op {part!r} in {spec!r}: its arguments are not "
                      "Python literals, e.g. inception_crop(0.35).") from e
    wanted = inspect.signature(factory).parameters
    kwargs = {k: v for k, v in context.items() if k in wanted}
    try:
      inspect.signature(factory).bind(*args, **kwargs)
      made = factory(*args, **kwargs)
    except (TypeError, ValueError) as e:
      raise UserError(f"Op {part!r} in {spec!r}: {e}") from e
    op = made if isinstance(made, Op) else Op(made)
    ops.append(dataclasses.replace(op, name=name, args=tuple(args)))
  if "patchify" in [op.name for op in ops[:-1]]:
    raise UserError(f"{spec!r}: patchify must be the pipeline's last op (it "
                    "turns the image into a sequence of patches).")
  return ops


def op_names(config, spec: str, sequence_length=None) -> list[str]:
  """The op names of a pipeline, parsed (so checked) as the input will be."""
  return [
      op.name for op in parse(spec, config.image_size, config.pp_crop_antialias,
                              models.stride(config.model), sequence_length or
                              config.get("sequence_length"))
  ]


def evaluated_pipelines(config) -> list[tuple[str, str]]:
  """(field, pipeline) of every evaluation pipeline the config sets."""
  evaluated = [("pp_eval", config.pp_eval),
               ("fewshot.pp_eval", config.fewshot.pp_eval)]
  return evaluated + [(f"evals.{name}.data.pp", entry.data.pp)
                      for name, entry in config.evals.items()]


def sequence_pipelines(config) -> list[tuple[str, str]]:
  """(field, pipeline) of the config's pipelines that end with patchify:
  images at their own shape, as patch sequences."""
  return [(field, spec)
          for field, spec in [("pp_train", config.pp_train)] +
          evaluated_pipelines(config)
          if spec and op_names(config, spec)[-1:] == ["patchify"]]


def check_pipelines(config):
  """Every pipeline of the config parses; RandAugment runs on [0, 255]
  pixels of training images only; patch sequences go to a plain ViT.
  (What an objective needs of them, its own checks say.)"""
  train_ops = op_names(config, config.pp_train)
  if ("randaug" in train_ops and "value_range" in train_ops and
      train_ops.index("randaug") > train_ops.index("value_range")):
    raise UserError(f"config.pp_train={config.pp_train!r} applies randaug "
                    "after value_range; RandAugment works on [0, 255] "
                    "pixels: put it before value_range.")
  for field, spec in evaluated_pipelines(config):
    if spec and "randaug" in op_names(config, spec):
      raise UserError(f"config.{field}={spec!r} augments evaluation images "
                      "at random; randaug belongs in config.pp_train.")
  for field, spec in sequence_pipelines(config):
    variant = models.get_variant(config.model.variant)
    if isinstance(variant, models.MixerVariant) or variant.resnet is not None:
      raise UserError(
          f"config.{field}={spec!r} gives images at their own shape (patch "
          f"sequences), which only a plain ViT takes; {config.model.variant} "
          "needs whole square images: end the pipeline with value_range.")
    if field == "pp_train" and config.mixup.alpha > 0:
      raise UserError(
          f"config.pp_train={spec!r} gives images of different grids, which "
          "mixup cannot blend pixel by pixel; set config.mixup.alpha=0.")


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


def make_image_fn(spec: str, size: int, *, crop_on_decode: bool = True,
                  crop_antialias: bool = False,
                  device_ops: tuple[str, ...] = (), patch_size: int = 0,
                  sequence_length: Optional[int] = None) -> ImageFn:
  """Returns `fn(image, seed) -> float32 size x size x 3` for a pipeline;
  `image` is a decoded uint8 tensor or `Encoded` (see the module doc).
  `crop_antialias` is the context's `antialias`. A last op named in
  `device_ops`, which the train step applies on the device, is left out
  and the image handed over rounded to uint8 (a quarter of the bytes).
  A pipeline ending with patchify returns its dict of a patch sequence
  (`sequence_ops`), patches uint8 or float32 likewise."""
  ops = parse(spec, size, crop_antialias, patch_size, sequence_length)
  to_sequence = ops[-1].fn if ops and ops[-1].name == "patchify" else None
  if to_sequence is not None:
    ops = ops[:-1]
  uint8 = bool(ops) and ops[-1].name in device_ops
  if uint8:
    ops = ops[:-1]
  # A distinct stateless seed per op keeps random ops independent.
  op_seed = lambda seed, i: tf.random.experimental.stateless_fold_in(seed, i)

  def fn(image, seed):
    first = 0
    if isinstance(image, Encoded):
      if crop_on_decode and ops and ops[0].from_encoded is not None:
        image, first = ops[0].from_encoded(image, op_seed(seed, 0)), 1
      else:
        image = image.decode(image.data)
    image = _rgb(image)
    for i, op in enumerate(ops[first:], first):
      image = op.fn(image, op_seed(seed, i))
    if uint8:  # Resized values are within [0, 255]; round to the nearest.
      image = tf.cast(tf.round(tf.cast(image, tf.float32)), tf.uint8)
    image = tf.cast(image, tf.uint8 if uint8 else tf.float32)
    if to_sequence is not None:
      return to_sequence(image, seed)
    return tf.ensure_shape(image, (size, size, 3))

  return fn


register("resize_to_sequence")(sequence_ops.resize_to_sequence)
register("resize_to_random_sequence")(sequence_ops.resize_to_random_sequence)
register("aspect_crop")(sequence_ops.aspect_crop)
register("patchify")(sequence_ops.patchify)
