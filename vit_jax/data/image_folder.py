"""Images in folders, no builder to write: ROOT/SPLIT/CLASS_NAME/*.jpg.

Classes are the sorted union of the class-folder names of all splits;
`.jpg`, `.jpeg` and `.png` files count. Unlabelled images (for
self-supervised training) lie directly in the split folders,
ROOT/SPLIT/*.jpg, with no class folders. Each split's file list is shuffled
once with a fixed seed, so slices like `train[:90%]` are random subsets.
ROOT may be local or on object storage (`vit_jax.paths`).

Listing scales to ImageNet-21k (21,841 classes, about 13M files): one
listing request per class folder, many in flight, and a dict from class
name to label. Given an index directory (the training workdir), the
listing is written there once as `folder_index_*.json.gz`: in a
multi-process run process 0 lists and the others wait and read it, and a
resumed run reads it instead of listing again, so it trains on exactly the
files it started with. Records are read by their index in that listing
(`FolderIndexReader`, ordered by `global_order.py`).
"""

from __future__ import annotations

import concurrent.futures
import gzip
import hashlib
import json
import random

import jax
from jax.experimental import multihost_utils

from vit_jax import console
from vit_jax import paths
from vit_jax.config import imports
from vit_jax.data import preprocess
from vit_jax.errors import UserError

# Loaded where data is first read.
tf = imports.lazy("tensorflow")
tfds = imports.lazy("tensorflow_datasets")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
LISTING_THREADS = 32
MAGIC = {b"\xff\xd8\xff": "JPEG", b"\x89PNG": "PNG"}  # First bytes.

Listing = dict[str, dict[str, list[str]]]  # split -> class -> file names.
UNLABELLED = ""  # The class of images directly in a split folder.


def list_folder(root: str) -> Listing:
  """{split: {class name: sorted image file names}} of an image folder."""
  if not paths.resolve(root).is_dir():
    raise UserError(f"Image folder {root} does not exist. Expected "
                    "ROOT/{train,test}/CLASS_NAME/*.jpg (or .jpeg/.png).")
  splits, _ = paths.list_dir(root)
  if not splits:
    raise UserError(f"Image folder {root} has no split folders; expected "
                    "ROOT/train/CLASS_NAME/*.jpg and ROOT/test/...")
  listing = {}
  with concurrent.futures.ThreadPoolExecutor(LISTING_THREADS) as pool:
    for split in sorted(splits):
      split_dir = f"{root.rstrip('/')}/{split}"
      classes, files = paths.list_dir(split_dir)
      loose = sorted(f for f in files if f.lower().endswith(IMAGE_EXTENSIONS))
      if loose and classes:
        raise UserError(
            f"{split_dir} holds both class folders and images; put every "
            "image in its class's folder (CLASS_NAME/*.jpg), or, for "
            "unlabelled data, all images directly in the split folder.")
      if loose:
        listing[split] = {UNLABELLED: loose}
        console.say("Listed %s: %d images, unlabelled (no class folders).",
                    split_dir, len(loose))
        continue
      if not classes:
        raise UserError(f"{split_dir} has no class folders and no images; "
                        "put each class's images in its own sub-folder "
                        "(CLASS_NAME/*.jpg), or unlabelled images directly "
                        "in it.")
      classes = sorted(classes)
      listed = pool.map(lambda c, d=split_dir: paths.list_dir(f"{d}/{c}")[1],
                        classes)
      listing[split] = {}
      for name, files in console.progress(zip(classes, listed), len(classes),
                                          f"Listing {split_dir}"):
        images = sorted(
            f for f in files if f.lower().endswith(IMAGE_EXTENSIONS))
        if not images:
          raise UserError(f"Class folder {split_dir}/{name} holds no "
                          ".jpg/.jpeg/.png images; add some or remove the "
                          "folder.")
        listing[split][name] = images
      console.say("Listed %s: %d classes, %d images.", split_dir, len(classes),
                  sum(map(len, listing[split].values())))
  return listing


def _index_path(index_dir: str, root: str):
  digest = hashlib.sha1(root.encode()).hexdigest()[:12]
  return paths.resolve(index_dir) / f"folder_index_{digest}.json.gz"


def _write_index(path, root: str, listing: Listing):
  path.parent.mkdir(parents=True, exist_ok=True)  # A new run's workdir.
  path.write_bytes(
      gzip.compress(json.dumps({
          "root": root,
          "splits": listing
      }).encode()))


def _read_index(path, root: str) -> Listing:
  index = json.loads(gzip.decompress(path.read_bytes()))
  if index["root"] != root:
    raise UserError(f"{path} indexes {index['root']}, not {root}; delete it.")
  return index["splits"]


def load_listing(root: str, index_dir=None) -> Listing:
  """The listing, from the index in `index_dir` if any (see module doc)."""
  if index_dir is None:
    return list_folder(root)
  index = _index_path(index_dir, root)
  if jax.process_count() == 1:
    if index.exists():
      return _read_index(index, root)
    listing = list_folder(root)
    _write_index(index, root, listing)
    return listing
  listing = None
  if jax.process_index() == 0:  # Decides alone, so every process syncs once.
    if index.exists():
      listing = _read_index(index, root)
    else:
      listing = list_folder(root)
      _write_index(index, root, listing)
  multihost_utils.sync_global_devices(f"image folder index of {root}")
  return listing if listing is not None else _read_index(index, root)


def class_names(root: str, index_dir=None) -> list[str]:
  """The folder's class names, from the index in `index_dir` if one was
  kept there, else from the class folders (their files are not listed)."""
  index = None if index_dir is None else _index_path(index_dir, root)
  if index is not None and index.exists():
    listing = _read_index(index, root)
  else:
    splits, _ = paths.list_dir(root)
    listing = {
        s: dict.fromkeys(paths.list_dir(f"{root.rstrip('/')}/{s}")[0])
        for s in splits
    }
  return sorted({c for by_class in listing.values() for c in by_class} -
                {UNLABELLED})


class ImageFolderSource:
  """`ROOT/SPLIT/CLASS_NAME/*.{jpg,jpeg,png}`; classes are the sorted names."""

  def __init__(self, root: str, index_dir=None):
    self.name = root
    listing = load_listing(root, index_dir)
    unlabelled = sorted(
        s for s, by_class in listing.items() if UNLABELLED in by_class)
    if unlabelled and len(unlabelled) < len(listing):
      raise UserError(
          f"Image folder {root} mixes unlabelled splits "
          f"({', '.join(unlabelled)}: images without class folders) with "
          "labelled ones; give every split class folders, or none.")
    self.class_names = [] if unlabelled else sorted(
        {c for by_class in listing.values() for c in by_class})
    label_of = {c: i for i, c in enumerate(self.class_names)}
    label_of[UNLABELLED] = -1
    self._files = {}  # split -> [(path, label)], shuffled once.
    for split, by_class in listing.items():
      folder = lambda c, s=split: (f"{root.rstrip('/')}/{s}" + (f"/{c}"
                                                                if c else ""))
      files = [(f"{folder(c)}/{f}", label_of[c])
               for c in sorted(by_class)
               for f in by_class[c]]
      random.Random(0).shuffle(files)  # Fixed: slices are random subsets.
      self._files[split] = files
    self.num_classes = len(self.class_names)
    self.multi_label = False
    self._tensorflow_reads = paths.tensorflow_can_read(root)

  def _absolute(self, split: str) -> tuple[str, int, int]:
    """Resolves 'train', 'train[:90%]', 'test[10:]' to (name, from, to)."""
    try:
      instructions = tfds.core.ReadInstruction.from_spec(split).to_absolute({
          name: tfds.core.SplitInfo(
              name=name, shard_lengths=[len(files)],
              num_bytes=0) for name, files in self._files.items()
      })
    except (AssertionError, ValueError, KeyError) as e:
      raise UserError(f"Image folder {self.name} has no split {split!r}; it "
                      f"has {', '.join(self._files)}.") from e
    if len(instructions) != 1:
      raise UserError(f"Split {split!r}: combine at most one folder split.")
    ins = instructions[0]
    stop = len(self._files[ins.splitname]) if ins.to is None else ins.to
    return ins.splitname, ins.from_ or 0, stop

  def num_examples(self, split) -> int:
    if isinstance(split, tuple):
      return len(self._slice(split))
    _, start, stop = self._absolute(split)
    return stop - start

  def process_split(self, split: str, index: int, count: int, drop_remainder):
    name, start, stop = self._absolute(split)
    size = stop - start
    per = size // count if drop_remainder else None
    if per is not None:
      return (name, start + index * per, start + (index + 1) * per)
    bounds = [start + (size * i) // count for i in range(count + 1)]
    return (name, bounds[index], bounds[index + 1])

  def _slice(self, split):
    name, start, stop = (split
                         if isinstance(split, tuple) else self._absolute(split))
    return self._files[name][start:stop]

  reads_by_index = True  # Its listing is the index.

  def index_reader(self, split) -> "FolderIndexReader":
    return FolderIndexReader(self._slice(split))

  def read(self, split, *, shuffle_files: bool, seed: int) -> tf.data.Dataset:
    """(path, label) records; `decode` reads and decodes the image."""
    files = self._slice(split)
    ds = tf.data.Dataset.from_tensor_slices({
        "path": [path for path, _ in files],
        "label": [label for _, label in files]
    })
    return ds.shuffle(len(files), seed=seed) if shuffle_files else ds

  def fetch(self, record):
    """The record with its file's bytes. Read before the pipeline leaves
    out unreadable images (`unreadable.py`): a storage error is not a
    broken image, and stops the run."""
    return {
        **record, "data": read_bytes(record["path"], self._tensorflow_reads)
    }

  def decode(self, record):
    """The image still encoded (`preprocess.Encoded`), and its label."""
    data = (record["data"] if "data" in record else read_bytes(
        record["path"], self._tensorflow_reads))
    image = preprocess.Encoded(data, lambda d: _decode(d, record["path"]))
    if not self.num_classes:
      return {"image": image}
    return {"image": image, "label": tf.cast(record["label"], tf.int64)}


class FolderIndexReader:
  """The (path, label) records of one split's files, by index (int64 tf
  vector) into the listing's fixed order; `fetch` then reads the files."""

  def __init__(self, files: list[tuple[str, int]]):
    self.size = len(files)
    self._paths = tf.constant([path for path, _ in files], tf.string)
    self._labels = tf.constant([label for _, label in files], tf.int64)

  parse = None  # `read` gives the records themselves.

  def read(self, indices) -> dict:
    return {
        "path": tf.gather(self._paths, indices),
        "label": tf.gather(self._labels, indices)
    }


def read_bytes(path, tensorflow_reads: bool):
  """The bytes of the file at `path` (a string tensor), read by TensorFlow
  or, where it cannot (`paths.tensorflow_can_read`), through the path
  layer."""
  return (tf.io.read_file(path)
          if tensorflow_reads else _read_with_path_layer(path))


def read_encoded(path, tensorflow_reads: bool) -> preprocess.Encoded:
  """The image file at `path`, read (`read_bytes`) and still encoded, with
  a decoder that names `path` when it fails."""
  return preprocess.Encoded(read_bytes(path, tensorflow_reads),
                            lambda d: _decode(d, path))


def read_image(path, tensorflow_reads: bool):
  """The image file at `path` as uint8 RGB (see `read_encoded`); a file
  that is no JPEG or PNG fails naming its path."""
  encoded = read_encoded(path, tensorflow_reads)
  return encoded.decode(encoded.data)


def _read_with_path_layer(path):
  """The file's bytes through epath, for storage TensorFlow cannot read."""
  data = tf.py_function(
      lambda p: paths.resolve(p.numpy().decode()).read_bytes(), [path],
      tf.string)
  return tf.ensure_shape(data, ())


def _decode(data, path):
  """Decodes JPEG/PNG bytes to uint8 RGB; a bad file fails naming its path."""
  known = tf.reduce_any(
      [tf.strings.substr(data, 0, len(m)) == m for m in MAGIC])
  with tf.control_dependencies([
      tf.debugging.Assert(known,
                          ["Unreadable image (not a JPEG or PNG file):", path])
  ]):
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
  return tf.ensure_shape(image, (None, None, 3))
