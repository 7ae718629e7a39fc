"""Preprocessing ops for images at their own shape (NaFlex, NaViT).

    aspect_crop|flip_lr|resize_to_sequence|value_range|patchify

`resize_to_sequence` resizes an image, its aspect ratio kept up to rounding
to whole patches, to the largest patch grid within the sequence length
(`sequence_grid`); `patchify`, the last op of such a pipeline, cuts it into
patches and pads them to the length, giving a `models.sequences`
PatchSequence's fields for one image. Both read the patch size (the model's
stride) and the length (config.sequence_length) from the pipeline's
context unless given, e.g. `resize_to_sequence(16, 256)|patchify(16)`.
`aspect_crop` is the training crop that keeps the aspect ratio;
`resize_to_random_sequence(min_length)` NaViT's resolution sampled per
image, for packing.
`preprocess` registers them.
"""

from vit_jax.config import imports

tf = imports.lazy("tensorflow")


def _ceil_div(a, b):
  return -(-a // b)


def sequence_grid(height, width, patch: int, length: int):
  """(rows, cols) of the largest grid within `length` patches an image of
  height x width resizes to by one ratio r, each side rounded up to whole
  patches: rows = max(1, ceil(height r / patch)), cols likewise (big_vision's
  definition, which it meets by a binary search over r).

  The grid only grows with r, and changes where a side reaches a whole
  number of patches: rows = a at r = a patch / height (cols then
  ceil(width a / height)), or cols = b at r = b patch / width. Of those
  candidates (a, b = 1 .. length), the largest within the length is the
  answer, computed exactly in integers. Works on Python ints and on tensors.
  """
  del patch  # The ratio's scale; the candidates do not depend on it.
  if isinstance(height, int) and isinstance(width, int):
    best = (1, 1)
    for k in range(1, length + 1):
      for rows, cols in ((k, max(1, _ceil_div(width * k, height))), (max(
          1, _ceil_div(height * k, width)), k)):
        if rows * cols <= length and rows * cols > best[0] * best[1]:
          best = (rows, cols)
    return best
  return _grid_in_budget(height, width, length, length)


def _patch_and_length(patch, length, patch_size, sequence_length):
  patch = patch_size if patch is None else int(patch)
  length = sequence_length if length is None else int(length)
  if not patch or length is None:
    raise ValueError("it needs the patch size and the sequence length: set "
                     "config.sequence_length (or give both, e.g. "
                     "resize_to_sequence(16, 256)).")
  if patch < 1 or length < 1:
    raise ValueError(f"patch size {patch} and sequence length {length} must "
                     "be positive (a length is a number of patches per "
                     "image).")
  return patch, length


def resize_to_sequence(patch=None, length=None, *, patch_size, sequence_length):
  """Resizes (bilinear, antialiased) to `sequence_grid`'s grid of patches."""
  patch, length = _patch_and_length(patch, length, patch_size, sequence_length)

  def fn(image, seed):
    del seed
    return _resize_within(image, patch, length, length)

  return fn


def resize_to_random_sequence(min_length, patch=None, length=None, *,
                              patch_size, sequence_length):
  """NaViT's sampled resolution: each image's budget drawn uniformly from
  [min_length, length] (per image, from its seed), then as
  `resize_to_sequence`; packing (config.packing) fills the sequences."""
  patch, length = _patch_and_length(patch, length, patch_size, sequence_length)
  if not 1 <= min_length <= length:
    raise ValueError(f"its minimum length {min_length} is not in [1, "
                     f"{length}].")

  def fn(image, seed):
    budget = tf.random.stateless_uniform((), seed, min_length, length + 1,
                                         dtype=tf.int32)
    return _resize_within(image, patch, budget, length)

  return fn


def _resize_within(image, patch: int, budget, length: int):
  """Resized (bilinear, antialiased) to the largest grid of patches within
  `budget` (a tensor or int, at most `length`)."""
  shape = tf.shape(image)
  rows, cols = _grid_in_budget(shape[0], shape[1], budget, length)
  return tf.image.resize(tf.cast(image, tf.float32),
                         tf.stack([rows * patch, cols * patch]),
                         method="bilinear", antialias=True)


def _grid_in_budget(height, width, budget, length: int):
  """`sequence_grid` for a budget known only in the graph (at most
  `length`)."""
  k = tf.range(1, length + 1, dtype=tf.int64)
  height, width = tf.cast(height, tf.int64), tf.cast(width, tf.int64)
  one = tf.constant(1, tf.int64)
  rows = tf.concat([k, tf.maximum(one, _ceil_div(height * k, width))], 0)
  cols = tf.concat([tf.maximum(one, _ceil_div(width * k, height)), k], 0)
  size = tf.where(rows * cols <= tf.cast(budget, tf.int64), rows * cols, 0)
  best = tf.argmax(size)
  return tf.cast(rows[best], tf.int32), tf.cast(cols[best], tf.int32)


def aspect_crop(min_area=0.3):
  """A random crop of min_area-100% of the image with its aspect ratio (the
  training crop of images at their own shape; no resize)."""
  if not 0 < min_area <= 1:
    raise ValueError(f"its minimum area {min_area} is not in (0, 1].")

  def fn(image, seed):
    shape = tf.shape(image)
    area, top, left = tf.unstack(
        tf.random.stateless_uniform((3,), seed, minval=0.0, maxval=1.0))
    side = tf.sqrt(min_area + (1.0 - min_area) * area)
    hw = tf.cast(shape[:2], tf.float32)
    size = tf.maximum(tf.cast(tf.round(hw * side), tf.int32), 1)
    begin = tf.cast(
        tf.cast(shape[:2] - size, tf.float32) * tf.stack([top, left]), tf.int32)
    return tf.slice(image, tf.concat([begin, [0]], 0), tf.concat([size, [-1]],
                                                                 0))

  return fn


def patchify(patch=None, length=None, *, patch_size, sequence_length):
  """The last op: an image of whole patches -> {patches (length x P*P*C),
  coords (length x 2: row, column), segments (length: 1, then 0 for the
  padding), grids (1 x 2)}, patches row by row, padded with zeros."""
  patch, length = _patch_and_length(patch, length, patch_size, sequence_length)

  def fn(image, seed):
    del seed
    return to_sequence(image, patch, length)

  return fn


def to_sequence(image, patch: int, length: int) -> dict:
  """See `patchify`; an image of more patches than `length` is an error."""
  shape = tf.shape(image)
  rows, cols = shape[0] // patch, shape[1] // patch
  channels = image.shape[-1] or 3
  count = rows * cols
  tf.debugging.assert_less_equal(
      count, length, "patchify: the image has more patches than the "
      "sequence length; resize_to_sequence first.")
  x = tf.reshape(image[:rows * patch, :cols * patch],
                 (rows, patch, cols, patch, channels))
  x = tf.reshape(tf.transpose(x, (0, 2, 1, 3, 4)),
                 (count, patch * patch * channels))
  row, col = tf.meshgrid(tf.range(rows), tf.range(cols), indexing="ij")
  coords = tf.stack([tf.reshape(row, [-1]), tf.reshape(col, [-1])], axis=-1)
  pad = length - count
  return {
      "patches": tf.ensure_shape(tf.pad(x, [[0, pad], [0, 0]]),
                                 (length, patch * patch * channels)),
      "coords": tf.ensure_shape(tf.pad(coords, [[0, pad], [0, 0]]),
                                (length, 2)),
      "segments": tf.ensure_shape(
          tf.pad(tf.ones([count], tf.int32), [[0, pad]]), (length,)),
      "grids": tf.reshape(tf.stack([rows, cols]), (1, 2)),
  }
