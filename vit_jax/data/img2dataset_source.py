"""img2dataset's outputs as image-text data, read by index.

`Img2DatasetSource(root, index_dir)` is the source of
`dataset="img2dataset:ROOT"` (`sources.make_source`), for either layout
img2dataset writes (`img2dataset_listing.py`). Its examples are
`{"image": the image still encoded, "caption": tf.string}`: set
config.text.key to "caption". It has no labels (`num_classes` 0) and no
splits: the whole output is `train`, its samples shuffled once with a fixed
seed, so slices like `train[:99%]` and `train[99%:]` are disjoint random
subsets (a held-out part to evaluate on). The listing is the index: a
shard's images are read by their offset and size from the shard file itself
(a chunk of them per call, each shard opened once), with captions from the
listing; a folder's image and caption are read from their files.
"""

from __future__ import annotations

import random

import numpy as np

from vit_jax import paths
from vit_jax.config import imports
from vit_jax.data import image_folder
from vit_jax.data import img2dataset_listing
from vit_jax.data import preprocess
from vit_jax.data import unreadable
from vit_jax.errors import UserError

# Loaded where data is first read.
tf = imports.lazy("tensorflow")
tfds = imports.lazy("tensorflow_datasets")

PREFIX = "img2dataset:"
SPLIT = "train"  # img2dataset writes no others.
TEXT_KEY = "caption"


class Img2DatasetSource:
  """The samples of an img2dataset output (see the module doc)."""

  def __init__(self, root: str, index_dir=None):
    self.name = PREFIX + root
    listing = img2dataset_listing.load_listing(root, index_dir)
    self.layout = listing["layout"]
    base = root.rstrip("/")
    if self.layout == img2dataset_listing.WEBDATASET:
      self._shards = [paths.resolve(f"{base}/{n}") for n in listing["parts"]]
      self._columns = _shard_columns(listing["parts"])
    else:
      self._columns = _folder_columns(base, listing["parts"])
    if not len(self._columns["key"]):
      raise UserError(f"{root} holds no sample with both an image "
                      "(.jpg/.jpeg/.png) and a caption (.txt).")
    # Fixed: slices are random subsets.
    order = list(range(len(self._columns["key"])))
    random.Random(0).shuffle(order)
    self._order = np.array(order, np.int64)
    self.num_classes = 0
    self.multi_label = False
    self.class_names = []
    self._tensorflow_reads = paths.tensorflow_can_read(root)

  @property
  def features(self):
    """Its examples' features as TFDS describes them (`sources.check_text`
    reads them)."""
    return tfds.features.FeaturesDict({
        "image": tfds.features.Image(),
        TEXT_KEY: tfds.features.Text()
    })

  def _bounds(self, split: str) -> tuple[int, int]:
    """'train', 'train[:99%]', 'train[10:]' as (from, to)."""
    size = len(self._order)
    try:
      instructions = tfds.core.ReadInstruction.from_spec(split).to_absolute({
          SPLIT: tfds.core.SplitInfo(name=SPLIT, shard_lengths=[size],
                                     num_bytes=0)
      })
    except (AssertionError, ValueError, KeyError) as e:
      raise UserError(f"{self.name} has no split {split!r}: img2dataset "
                      f"writes one, {SPLIT!r}; slice it to hold some out, "
                      "e.g. 'train[:99%]' and 'train[99%:]'.") from e
    if len(instructions) != 1:
      raise UserError(f"Split {split!r}: take one slice of {SPLIT!r}.")
    ins = instructions[0]
    return ins.from_ or 0, size if ins.to is None else ins.to

  def num_examples(self, split) -> int:
    start, stop = self._bounds(split)
    return stop - start

  def keys(self, split) -> list[str]:
    """The img2dataset keys of the split's samples, in index order."""
    start, stop = self._bounds(split)
    return list(self._columns["key"][self._order[start:stop]])

  reads_by_index = True  # Its listing is the index.

  def index_reader(self, split):
    start, stop = self._bounds(split)
    columns = {k: v[self._order[start:stop]] for k, v in self._columns.items()}
    if self.layout == img2dataset_listing.WEBDATASET:
      return ShardReader(self._shards, columns)
    return FileReader(columns)

  def fetch(self, record):
    """The record with its image's bytes and its caption (a folder's are
    read here; a shard's are in it already). Read before the pipeline
    leaves out unreadable images: a file gone is no broken image, and
    stops the run."""
    if "image" in record:
      return record
    read = lambda path: image_folder.read_bytes(path, self._tensorflow_reads)
    return {
        **record, "image": read(record["path"]),
        TEXT_KEY: read(record["caption_path"])
    }

  def decode(self, record):
    """The image still encoded (`preprocess.Encoded`); its caption stays
    in the record (read by config.text.key)."""
    return {"image": preprocess.Encoded(record["image"], _decode)}


def _decode(data):
  """JPEG or PNG bytes as uint8 RGB."""
  image = tf.io.decode_image(data, channels=3, expand_animations=False)
  return tf.ensure_shape(image, (None, None, 3))


def _shard_columns(parts: dict) -> dict[str, np.ndarray]:
  """A webdataset listing's samples as columns: "key", "shard" (its
  number in the listing's order), "offset", "size", "caption"."""
  column = lambda name, dtype: np.array(
      [v for part in parts.values() for v in part[name]], dtype)
  counts = [len(part["keys"]) for part in parts.values()]
  return {
      "key": column("keys", object),
      "shard": np.repeat(np.arange(len(parts), dtype=np.int32), counts),
      "offset": column("offsets", np.int64),
      "size": column("sizes", np.int64),
      "caption": column("captions", object)
  }


def _folder_columns(base: str, parts: dict) -> dict[str, np.ndarray]:
  """A files listing's samples as columns: "key", "image" and "caption"
  (their files' paths)."""
  files = [
      (folder, image) for folder, images in parts.items() for image in images
  ]
  keys = [img2dataset_listing.split_name(image)[0] for _, image in files]
  return {
      "key": np.array(keys, object),
      "image": np.array([f"{base}/{f}/{i}" for f, i in files], object),
      "caption": np.array([
          f"{base}/{f}/{key}.{img2dataset_listing.CAPTION}"
          for (f, _), key in zip(files, keys)
      ], object)
  }


class ShardReader:
  """Samples in tar shards by index (an int64 tf vector): `read` gives
  {"image": the image members' bytes, "caption": their captions}."""

  def __init__(self, shards, columns: dict[str, np.ndarray]):
    """`shards`: the shards' paths; `columns`: `_shard_columns`'."""
    self.size = len(columns["key"])
    self._shards = shards
    self._shard_of = columns["shard"]
    self._offsets, self._sizes = columns["offset"], columns["size"]
    self._captions = columns["caption"]

  parse = None  # `read` gives the records themselves.

  def _read(self, indices: np.ndarray) -> np.ndarray:
    """The image bytes at `indices`: each shard opened once, read forward."""
    data = np.empty(len(indices), object)
    shard_of = self._shard_of[indices]
    offsets, sizes = self._offsets[indices], self._sizes[indices]
    for shard in np.unique(shard_of):
      rows = np.flatnonzero(shard_of == shard)
      path = self._shards[shard]
      try:
        with path.open("rb") as f:
          for row in rows[np.argsort(offsets[rows])]:
            f.seek(int(offsets[row]))
            data[row] = f.read(int(sizes[row]))
            if len(data[row]) != sizes[row]:
              raise OSError(f"it ends before byte {offsets[row] + sizes[row]}")
      except OSError as e:
        raise unreadable.PipelineError(
            f"{path} cannot be read ({e}): the shard changed or went away "
            "since it was listed (img2dataset_index_*.json.gz in the "
            "workdir). Put it back as it was, or start a new run in a new "
            "workdir.") from None
    return data

  def read(self, indices) -> dict:
    data = tf.numpy_function(self._read, [indices], tf.string, stateful=False)
    return {
        "image": tf.ensure_shape(data, [None]),
        TEXT_KEY: _gather_strings(self._captions, indices)
    }


class FileReader:
  """Samples in numbered folders by index (an int64 tf vector): `read`
  gives their image and caption files' paths; the source's `fetch` reads
  them."""

  def __init__(self, columns: dict[str, np.ndarray]):
    """`columns`: `_folder_columns`'."""
    self.size = len(columns["key"])
    self._images, self._captions = columns["image"], columns["caption"]

  parse = None  # `read` gives the records themselves.

  def read(self, indices) -> dict:
    return {
        # Names it if unreadable.
        "path": _gather_strings(self._images, indices),
        "caption_path": _gather_strings(self._captions, indices)
    }


def _gather_strings(table: np.ndarray, indices):
  """The strings of `table` (an object array) at `indices` (an int64 tf
  vector), looked up in Python: a listing's millions of captions or paths
  stay one numpy array, not a constant of the tf.data graph (a fixed-width
  copy of every string, in a graph whose protos stop at 2 GB)."""

  def take(rows):
    return np.array([str(text).encode() for text in table[rows]], object)

  return tf.ensure_shape(
      tf.numpy_function(take, [indices], tf.string, stateful=False), [None])
