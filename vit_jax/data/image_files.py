"""Image files given on the command line, as padded batches for a model.

`find_images(["a.jpg", "folder/"])` lists the files (folders recursively:
.jpg, .jpeg and .png; local or on object storage), and `ImageFiles` reads
them with tf.data, decodes and preprocesses them with an evaluation pipeline
(`preprocess.py`), and yields numpy batches `{"image", "index", "mask"}` of
a fixed size (the last one padded, mask 0). Unlike training and evaluation
data, a file that cannot be read does not stop the run: it is left out, and
`failed` names it with the reason once the batches are consumed.
"""

from __future__ import annotations

from typing import Iterator
from typing import Sequence

import numpy as np

from vit_jax import paths
from vit_jax.config import imports
from vit_jax.data import image_folder
from vit_jax.data import preprocess
from vit_jax.data import unreadable
from vit_jax.errors import UserError

tf = imports.lazy("tensorflow")  # Loaded where data is first read.


def _walk(directory: str) -> list[str]:
  subdirs, files = paths.list_dir(directory)
  found = [
      f"{directory.rstrip('/')}/{f}" for f in files
      if f.lower().endswith(image_folder.IMAGE_EXTENSIONS)
  ]
  for subdir in subdirs:
    found += _walk(f"{directory.rstrip('/')}/{subdir}")
  return found


def find_images(inputs: Sequence[str]) -> list[str]:
  """Files named, and the image files under folders named (sorted)."""
  if not inputs:
    raise UserError("No images given: name image files or folders.")
  files = []
  for name in inputs:  # Kept as given (relative or not): the output shows it.
    path = paths.resolve(name)
    if path.is_dir():
      found = sorted(_walk(name))
      if not found:
        raise UserError(f"{name} holds no .jpg, .jpeg or .png files.")
      files += found
    elif path.exists():
      files.append(name)
    else:
      raise UserError(f"{name} does not exist.")
  return files


class ImageFiles:
  """Padded batches of `files` preprocessed by `pp_spec` at `image_size`."""

  def __init__(self, files: Sequence[str], pp_spec: str, image_size: int,
               batch_size: int, patch_size: int = 0, sequence_length=None):
    """`patch_size`, `sequence_length`: where `pp_spec` ends with patchify
    (images at their own shape; `sequence_ops`)."""
    self.files = list(files)
    self.batch_size = batch_size
    self.failed: list[tuple[str, str]] = []  # (path, reason), see __iter__.
    self._image_fn = preprocess.make_image_fn(pp_spec, image_size,
                                              patch_size=patch_size,
                                              sequence_length=sequence_length)
    self._by_tensorflow = all(paths.tensorflow_can_read(f) for f in files)

  def _dataset(self) -> tf.data.Dataset:

    def load(index, path):
      return {
          "image": self._load(path),
          "index": tf.cast(index, tf.int32),
          "mask": tf.constant(1.0, tf.float32)
      }

    ds = tf.data.Dataset.from_tensor_slices((np.arange(len(
        self.files)), self.files))
    # A file that fails to read or decode is dropped here; `__iter__`
    # finds which by the indices that never arrive.
    # As written (AutoGraph off), as input_pipeline's functions.
    ds = ds.map(tf.autograph.experimental.do_not_convert(load),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True).ignore_errors()
    return ds.batch(self.batch_size).prefetch(tf.data.AUTOTUNE)

  def _load(self, path):
    """One file, read, decoded and preprocessed (random ops: seed 0)."""
    image = image_folder.read_image(path, self._by_tensorflow)
    return self._image_fn(image, tf.constant([0, 0], tf.int64))

  def num_batches(self) -> int:
    return -(-len(self.files) // self.batch_size)

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    """Batches in file order. `failed` then names the files left out: all
    of them after a full pass; those before the last file read when the
    consumer stops early (the others were not reached)."""
    seen = np.zeros(len(self.files), bool)
    reached = 0  # Files up to here were read or failed.
    try:
      for batch in self._dataset().as_numpy_iterator():
        seen[batch["index"]] = True
        reached = int(batch["index"].max()) + 1
        missing = self.batch_size - len(batch["index"])
        if missing:  # A fixed batch shape: no recompilation for the last one.
          batch = _padded(batch, missing)
        yield batch
      reached = len(self.files)
    finally:
      self.failed = [(self.files[i], self._why_unreadable(self.files[i]))
                     for i in np.flatnonzero(~seen[:reached])]

  def _why_unreadable(self, path: str) -> str:
    """What is wrong with `path`, found by loading it again alone."""
    why = unreadable.why_unreadable(path, self._image_fn)
    return "could not be read" if why == "readable now" else why


def _padded(batch, missing: int):
  """`batch` (a dict of arrays, or of dicts: patch sequences) with
  `missing` rows of zeros."""
  if isinstance(batch, dict):
    return {k: _padded(v, missing) for k, v in batch.items()}
  return np.concatenate(
      [batch, np.zeros((missing,) + batch.shape[1:], batch.dtype)])
