"""Where examples come from: a TFDS dataset or a folder of images.

Both sources read undecoded records of one process's disjoint share of a
split (cheap to skip when resuming) and `decode` them into
`{"image": uint8 HxWxC, "label": int64 or multi-hot f32[K]}`, and give the
metadata the trainer needs (classes, split sizes). `config.dataset` picks the source: a
TFDS name (`cifar10`, `imagenet2012`, the built-in `digits`) or
`folder:/path/to/root` for `ROOT/{train,test}/CLASS_NAME/*.{jpg,jpeg,png}`.
"""

import os
import random

import ml_collections
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax.data import digits  # Registers the built-in `digits` builder.

del digits
FOLDER_PREFIX = "folder:"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
_MAGIC = {b"\xff\xd8\xff": "JPEG", b"\x89PNG": "PNG"}


class TfdsSource:
  """A TFDS dataset, prepared on first use (manual downloads checked first)."""

  def __init__(self, name: str, data_dir, manual_dir):
    try:
      self._builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as e:
      raise ValueError(
          f"Unknown dataset {name!r}: TFDS has no builder of that name. Use a "
          "TFDS name (e.g. 'cifar10'), the built-in 'digits', or "
          "'folder:/path/to/images' for an image folder.") from e
    if not self._builder.is_prepared():
      self._prepare(manual_dir)
    features = self._builder.info.features
    if "label" in features:
      self.num_classes = features["label"].num_classes
      self.multi_label = False
    elif "labels" in features:  # A sequence of class labels per image.
      self.num_classes = features["labels"].feature.num_classes
      self.multi_label = True
    else:
      raise ValueError(f"Dataset {name!r} has neither a 'label' nor a "
                       f"'labels' feature (it has {list(features)}).")
    self.name = name

  def _prepare(self, manual_dir):
    instructions = getattr(self._builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None)
    if instructions:
      manual_dir = manual_dir or os.path.join(
          self._builder.data_dir_root, "downloads", "manual")
      if not tf.io.gfile.exists(manual_dir) or not tf.io.gfile.listdir(manual_dir):
        raise ValueError(
            f"Dataset {self._builder.name!r} needs a manual download, and "
            f"{manual_dir} is missing or empty. Download its files there (or "
            f"set config.manual_dir), as TFDS says:\n{instructions}")
    self._builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))

  def num_examples(self, split) -> int:
    try:
      return self._builder.info.splits[split].num_examples
    except (KeyError, ValueError, AssertionError) as e:
      raise ValueError(
          f"Dataset {self.name!r} has no split {split!r}; it has "
          f"{', '.join(self._builder.info.splits)} (slices like "
          "'train[:90%]' work too).") from e

  def process_split(self, split: str, index: int, count: int, drop_remainder):
    return tfds.even_splits(split, n=count, drop_remainder=drop_remainder)[index]

  def read(self, split, *, shuffle_files: bool, seed: int) -> tf.data.Dataset:
    """Undecoded records; `decode` turns one into an example."""
    return self._builder.as_dataset(
        split=split, shuffle_files=shuffle_files,
        read_config=tfds.ReadConfig(shuffle_seed=seed),
        decoders={"image": tfds.decode.SkipDecoding()})

  def decode(self, record):
    image = self._builder.info.features["image"].decode_example(record["image"])
    if self.multi_label:
      label = tf.reduce_max(tf.one_hot(record["labels"], self.num_classes), 0)
    else:
      label = record["label"]
    return {"image": image, "label": label}


class ImageFolderSource:
  """`ROOT/SPLIT/CLASS_NAME/*.{jpg,jpeg,png}`; classes are the sorted names."""

  def __init__(self, root: str):
    self.name = root
    if not tf.io.gfile.isdir(root):
      raise ValueError(f"Image folder {root} does not exist. Expected "
                       "ROOT/{train,test}/CLASS_NAME/*.jpg (or .jpeg/.png).")
    self._files = {}  # split -> [(path, class name)], shuffled once.
    for split in sorted(tf.io.gfile.listdir(root)):
      split_dir = os.path.join(root, split.rstrip("/"))
      if tf.io.gfile.isdir(split_dir):
        self._files[split.rstrip("/")] = _list_split(split_dir)
    if not self._files:
      raise ValueError(f"Image folder {root} has no split folders; expected "
                       "ROOT/train/CLASS_NAME/*.jpg and ROOT/test/...")
    self.class_names = sorted({c for files in self._files.values()
                               for _, c in files})
    self.num_classes = len(self.class_names)
    self.multi_label = False

  def _absolute(self, split: str) -> tuple[str, int, int]:
    """Resolves 'train', 'train[:90%]', 'test[10:]' to (name, from, to)."""
    try:
      instructions = tfds.core.ReadInstruction.from_spec(split).to_absolute({
          name: tfds.core.SplitInfo(name=name, shard_lengths=[len(files)],
                                    num_bytes=0)
          for name, files in self._files.items()})
    except (AssertionError, ValueError, KeyError) as e:
      raise ValueError(f"Image folder {self.name} has no split {split!r}; it "
                       f"has {', '.join(self._files)}.") from e
    if len(instructions) != 1:
      raise ValueError(f"Split {split!r}: combine at most one folder split.")
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
    name, start, stop = split if isinstance(split, tuple) else self._absolute(split)
    return self._files[name][start:stop]

  def read(self, split, *, shuffle_files: bool, seed: int) -> tf.data.Dataset:
    """(path, label) records; `decode` reads and decodes the image."""
    files = self._slice(split)
    ds = tf.data.Dataset.from_tensor_slices({
        "path": [path for path, _ in files],
        "label": [self.class_names.index(c) for _, c in files]})
    return ds.shuffle(len(files), seed=seed) if shuffle_files else ds

  def decode(self, record):
    return {"image": _decode(record["path"]),
            "label": tf.cast(record["label"], tf.int64)}


def _list_split(split_dir: str) -> list[tuple[str, str]]:
  classes = sorted(c.rstrip("/") for c in tf.io.gfile.listdir(split_dir)
                   if tf.io.gfile.isdir(os.path.join(split_dir, c)))
  if not classes:
    raise ValueError(f"{split_dir} has no class folders; put each class's "
                     "images in its own sub-folder (CLASS_NAME/*.jpg).")
  files = []
  for name in classes:
    class_dir = os.path.join(split_dir, name)
    images = sorted(f for f in tf.io.gfile.listdir(class_dir)
                    if f.lower().endswith(IMAGE_EXTENSIONS))
    if not images:
      raise ValueError(f"Class folder {class_dir} holds no .jpg/.jpeg/.png "
                       "images; add some or remove the folder.")
    files += [(os.path.join(class_dir, f), name) for f in images]
  random.Random(0).shuffle(files)  # Fixed order: slices are random subsets.
  return files


def _decode(path):
  """Decodes a JPEG/PNG file to uint8 RGB; a bad file fails naming its path."""
  data = tf.io.read_file(path)
  known = tf.reduce_any([tf.strings.substr(data, 0, len(m)) == m
                         for m in _MAGIC])
  with tf.control_dependencies([tf.debugging.Assert(
      known, ["Unreadable image (not a JPEG or PNG file):", path])]):
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
  return tf.ensure_shape(image, (None, None, 3))


def make_source(config: ml_collections.ConfigDict):
  if config.dataset.startswith(FOLDER_PREFIX):
    return ImageFolderSource(config.dataset[len(FOLDER_PREFIX):])
  return TfdsSource(config.dataset, config.data_dir, config.manual_dir)
