"""Where examples come from: a TFDS dataset, a folder of images or an
img2dataset output.

Both sources read undecoded records by their index in a split
(`index_reader`: TFDS datasets in ArrayRecord files, image folders through
their listing), or, for TFDS datasets stored as TFRecord files, in
sequence (`read`: one process's disjoint share), and `decode` them into
`{"image": uint8 HxWxC, "label": int64 or multi-hot f32[K]}` (no "label"
for unlabelled data: `num_classes` is then 0; a TFDS record's text
features stay in the record, read by `check_text`'s key), and give the
metadata the trainer needs (classes, split sizes). A data spec's dataset
picks the source (`vit_jax/data/specs.py`): a TFDS name (`cifar10`,
`imagenet2012`, the built-in `digits` and `digits_captions`),
`folder:/path/to/root` for `ROOT/{train,test}/CLASS_NAME/*.{jpg,jpeg,png}`
(see `image_folder.py`), `img2dataset:/path/to/ROOT` for image-text pairs
as img2dataset writes them (tar shards or numbered folders; captions as
the text feature `caption`, see `img2dataset_source.py`) or `vtab:TASK`
for a VTAB-1k task (see `vtab_tasks.py`). In a multi-process run only
process 0 prepares a TFDS dataset; the others wait for it. TFDS datasets
are prepared in ArrayRecord files (read by index, `global_order.py`).
"""

from __future__ import annotations

import re

import jax
from jax.experimental import multihost_utils
import numpy as np

from vit_jax import console
from vit_jax import paths
from vit_jax.config import imports
from vit_jax.data import image_folder
from vit_jax.data import img2dataset_source
from vit_jax.data import preprocess
from vit_jax.data import specs
from vit_jax.data import unreadable
from vit_jax.data import vtab_tasks
from vit_jax.errors import UserError

# Loaded where data is first read.
tf = imports.lazy("tensorflow")
tfds = imports.lazy("tensorflow_datasets")

FOLDER_PREFIX = "folder:"
VTAB_PREFIX = "vtab:"
IMG2DATASET_PREFIX = img2dataset_source.PREFIX
FILE_FORMAT = "array_record"  # Of the datasets TFDS prepares for us.


def _builder(name: str, data_dir, **kwargs):
  """TFDS's builder of dataset `name`, the built-in `digits`,
  `digits_captions` and the benchmarks' `synthetic_images` among them."""
  # TFDS alone, before TensorFlow loads (TFDS loads it only to build a
  # dataset; `tfds` loads it first, quietly): an unknown name is said at once.
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds_alone  # pylint: disable=g-import-not-at-top

  # Each registers its builder.
  from vit_jax.data import digits  # noqa: F401
  from vit_jax.data import digits_captions  # noqa: F401
  from vit_jax.data import synthetic  # noqa: F401
  not_found = tfds_alone.core.registered.DatasetNotFoundError
  try:
    parsed, _ = tfds_alone.core.naming.parse_builder_name_kwargs(name)
    if parsed.namespace is None:  # Community datasets: TFDS looks them up.
      tfds_alone.builder_cls(parsed.name)
  except (not_found, ValueError) as e:
    raise _unknown(name) from e
  try:
    return tfds.builder(name, data_dir=data_dir, **kwargs)
  except not_found as e:
    raise _unknown(name) from e
  except json_format.ParseError as e:  # TFDS's metadata.
    raise UserError(_damaged_info(parsed.name, data_dir, e)) from None


def _unknown(name: str) -> UserError:
  return UserError(
      f"Unknown dataset {name!r}: TFDS has no builder of that name. Use a "
      "TFDS name (e.g. 'cifar10'), the built-in 'digits', or "
      "'folder:/path/to/images' for an image folder.")


def _damaged_info(name: str, data_dir, error) -> str:
  """Which dataset_info.json of dataset `name` (less its config and
  version) cannot be read, and the fix."""
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top
  root = paths.resolve(data_dir or tfds.core.constants.get_default_data_dir())
  root = root / name

  def parses(info) -> bool:
    try:
      tfds.core.dataset_info.read_from_json(info)
    except json_format.ParseError:
      return False
    return True

  infos = [
      *root.glob("*/dataset_info.json"),  # VERSION/, CONFIG/VERSION/
      *root.glob("*/*/dataset_info.json")
  ]
  broken = [info for info in sorted(infos) if not parses(info)]
  where = broken[0] if broken else root / "*" / "dataset_info.json"
  # TFDS puts the dataset's name before the parser's words.
  why = re.sub(r"^Failed to construct dataset .*?builder_kwargs \".*?\": ", "",
               str(error).strip().splitlines()[0]).rstrip(".")
  return (f"{where} cannot be read ({why}): the dataset's metadata is "
          f"damaged. Delete the dataset's folder {where.parent} and run "
          "again: the dataset is prepared anew.")


def _writes_array_record() -> bool:
  try:
    from array_record.python import array_record_module  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


def convert_command(builder) -> str:
  """The one command that rewrites a TFRecord dataset as ArrayRecord."""
  name = builder.info.full_name.rsplit("/", 1)[0]  # Less the version.
  return (f"vit-jax convert-data --dataset={name} "
          f"--data_dir={builder.data_dir_root}")


def repair(builder) -> str:
  """How to write a prepared dataset's damaged files again."""
  formats = builder.info.as_proto.alternative_file_formats
  if tfds.core.FileFormat.TFRECORD.value in formats:  # Converted.
    return ("Its TFRecord files are kept beside it: delete the file and run "
            f"`{convert_command(builder)}`, which writes it again.")
  return (f"Delete the dataset's folder {builder.data_dir} and run again: "
          "the dataset is prepared anew.")


class TfdsIndexReader:
  """Records of one split of a TFDS dataset in ArrayRecord files, by index.

  `read` takes int64 indices into the split (a tf vector) and gives the
  serialized records, read in one call through TFDS's data source (which
  reads each file's records in parallel); `parse` turns one into the
  record `TfdsSource.decode` takes, its image still encoded."""

  def __init__(self, builder, split):
    if paths.is_remote(builder.data_dir):
      raise UserError(
          f"{builder.data_dir} holds ArrayRecord files, which are read by "
          "index from a local path only: mount the bucket (gcsfuse, see "
          "docs/training.md) and set config.data_dir to the mount point.")
    self._source = builder.as_data_source(
        split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
    self._builder, self._split = builder, split
    self._features = builder.info.features
    self.size = len(self._source)

  def _read(self, indices: np.ndarray) -> np.ndarray:
    try:
      return np.array(self._source.__getitems__(indices.tolist()), dtype=object)
    except RuntimeError as e:  # ArrayRecord's: a file damaged or gone.
      raise unreadable.PipelineError(self._damaged(indices, e)) from None

  def _damaged(self, indices: np.ndarray, error: RuntimeError) -> str:
    """Which file of the records at `indices` cannot be read (each file's
    records read again on their own), and the fix."""
    files = self._builder.info.splits[self._split].file_instructions
    of_file = np.searchsorted(np.cumsum([f.take for f in files]), indices,
                              side="right")
    touched = np.unique(of_file)
    name = ", ".join(files[i].filename for i in touched)
    for i in touched:
      try:
        self._source.__getitems__(indices[of_file == i].tolist())
      except RuntimeError as e:
        name, error = files[i].filename, e
        break
    return (f"{name} cannot be read ({str(error).splitlines()[0]}): the "
            f"file is damaged or gone. {repair(self._builder)}")

  def read(self, indices) -> dict:
    data = tf.numpy_function(self._read, [indices], tf.string, stateful=False)
    return {"serialized": tf.ensure_shape(data, [None])}

  def parse(self, record) -> dict:
    return self._features.deserialize_example(
        record["serialized"], decoders={"image": tfds.decode.SkipDecoding()})


def multi_hot(labels, num_classes: int) -> tf.Tensor:
  """f32[num_classes]: 1 at each class of `labels` (all 0 for none)."""
  return tf.minimum(tf.reduce_sum(tf.one_hot(labels, num_classes), 0), 1.0)


class TfdsSource:
  """A TFDS dataset, prepared on first use (manual downloads checked first).

  Its label is the `label` feature, else a `labels` sequence (multi-hot),
  else none; `label_key` names another feature: a class label, or a
  sequence of them (multi-hot, e.g. imagenet2012_real's `real_label`).
  """

  def __init__(self, name: str, data_dir, manual_dir, label_key=None):
    self._builder = _builder(name, data_dir)
    self._tfds_name, self._data_dir = name, data_dir
    if jax.process_count() > 1:
      # Process 0 downloads and prepares; the others wait for it rather
      # than race on the shared data_dir.
      if jax.process_index() == 0 and not self._builder.is_prepared():
        self._prepare(manual_dir)
      multihost_utils.sync_global_devices(f"TFDS {name} prepared")
      self._builder = _builder(name, data_dir)
    elif not self._builder.is_prepared():
      self._prepare(manual_dir)
    features = self._builder.info.features
    if label_key is not None and label_key not in features:
      raise UserError(f"Dataset {name!r} has no feature {label_key!r} to "
                      f"read labels from; it has {list(features)}.")
    self._label_key = label_key or next(
        (k for k in ("label", "labels") if k in features), None)
    label = features[self._label_key] if self._label_key else None
    if label is None:  # Unlabelled: for self-supervised training only.
      self.num_classes = 0
      self.multi_label = False
    elif isinstance(label, tfds.features.Sequence):  # Classes per image.
      self.num_classes = label.feature.num_classes
      self.multi_label = True
    else:
      self.num_classes = label.num_classes
      self.multi_label = False
    if "image" not in features:
      raise UserError(f"Dataset {name!r} has no 'image' feature (it has "
                      f"{list(features)}).")
    self.name = name

  def _prepare(self, manual_dir):
    instructions = getattr(self._builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None)
    if instructions:
      manual_dir = manual_dir or str(
          paths.resolve(self._builder.data_dir_root) / "downloads" / "manual")
      manual = paths.resolve(manual_dir)
      if not manual.is_dir() or not any(manual.iterdir()):
        raise UserError(
            f"Dataset {self._builder.name!r} needs a manual download, and "
            f"{manual_dir} is missing or empty. Download its files there (or "
            f"set config.manual_dir), as TFDS says:\n{instructions}")
    # Prepared in ArrayRecord files, so that they are read by index (a
    # builder opened without a format reads whichever it finds); those are
    # written to local paths only, so on object storage TFRecord files (and
    # where array_record has no build: TFDS needs it on Linux only).
    if not paths.is_remote(self._builder.data_dir) and _writes_array_record():
      self._builder = _builder(self._tfds_name, self._data_dir,
                               file_format=FILE_FORMAT)
    console.say(
        "Preparing TFDS dataset %s in %s (first use; TFDS shows its "
        "progress on a terminal).", self._builder.name, self._builder.data_dir)
    self._builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))

  @property
  def features(self):
    """The dataset's TFDS features (a FeaturesDict)."""
    return self._builder.info.features

  def num_examples(self, split) -> int:
    try:
      return self._builder.info.splits[split].num_examples
    except (KeyError, ValueError, AssertionError) as e:
      raise UserError(f"Dataset {self.name!r} has no split {split!r}; it has "
                      f"{', '.join(self._builder.info.splits)} (slices like "
                      "'train[:90%]' work too).") from e

  @property
  def reads_by_index(self) -> bool:
    """Whether its files are ArrayRecord (else TFRecord: read in sequence)."""
    return self._builder.info.file_format == tfds.core.FileFormat.ARRAY_RECORD

  def index_reader(self, split) -> TfdsIndexReader:
    return TfdsIndexReader(self._builder, split)

  def in_sequence_cost(self) -> str:
    """What reading its TFRecord files in sequence costs, and the fix."""
    return (f"{self.name} is stored as TFRecord files in "
            f"{self._builder.data_dir}, read in sequence: a resumed run skips "
            "through up to an epoch of records before its first batch, the "
            "shuffle is a window (config.shuffle_buffer) and another process "
            "count reads another order. Rewrite it once as ArrayRecord (read "
            f"by index: a resume is a seek): {convert_command(self._builder)}")

  def process_split(self, split: str, index: int, count: int, drop_remainder):
    return tfds.even_splits(split, n=count,
                            drop_remainder=drop_remainder)[index]

  def read(self, split, *, shuffle_files: bool, seed: int) -> tf.data.Dataset:
    """Undecoded records of TFRecord files; `decode` turns one into an
    example."""
    return self._builder.as_dataset(
        split=split, shuffle_files=shuffle_files,
        read_config=tfds.ReadConfig(shuffle_seed=seed),
        decoders={"image": tfds.decode.SkipDecoding()})

  def fetch(self, record):
    """The record (its image's bytes are in it already)."""
    return record

  def decode(self, record):
    """The image still encoded (`preprocess.Encoded`) where it is a uint8
    image, decoded otherwise; the label (multi-hot for a list of them)."""
    feature = self._builder.info.features["image"]
    image = (preprocess.Encoded(record["image"], feature.decode_example)
             if feature.tf_dtype == tf.uint8 else feature.decode_example(
                 record["image"]))
    if not self.num_classes:
      return {"image": image}
    label = record[self._label_key]
    if self.multi_label:
      label = multi_hot(label, self.num_classes)
    return {"image": image, "label": label}


class VtabSource(TfdsSource):
  """A VTAB-1k task (`vtab_tasks.TASKS`): its dataset read through the
  benchmark's split names (`vtab_tasks.SPLITS`), with the task's label."""

  def __init__(self, task_name: str, data_dir, manual_dir):
    self.task = vtab_tasks.get(task_name)
    super().__init__(self.task.tfds_name, data_dir, manual_dir)
    self.name = VTAB_PREFIX + self.task.name
    self.num_classes = self.task.num_classes
    self.multi_label = False

  def _tfds_split(self, split):
    """A benchmark split name as a TFDS split string; a per-process share
    (from `process_split`) is already one."""
    if not isinstance(split, str):
      return split
    vtab_tasks.check_split(self.task, split)
    num_train = (self._builder.info.splits["train"].num_examples
                 if self.task.needs_train_size else 0)
    return self.task.tfds_split(split, num_train)

  def num_examples(self, split) -> int:
    return super().num_examples(self._tfds_split(split))

  def process_split(self, split, index: int, count: int, drop_remainder):
    return super().process_split(self._tfds_split(split), index, count,
                                 drop_remainder)

  def read(self, split, *, shuffle_files: bool, seed: int) -> tf.data.Dataset:
    return super().read(self._tfds_split(split), shuffle_files=shuffle_files,
                        seed=seed)

  def index_reader(self, split) -> TfdsIndexReader:
    return super().index_reader(self._tfds_split(split))

  def decode(self, record):
    """The image (dSprites' 0/1 pixels scaled to 0/255) and the task's
    label, computed from the record's features."""
    feature = self._builder.info.features["image"]
    if self.task.pixel_scale == 1:
      image = preprocess.Encoded(record["image"], feature.decode_example)
    else:
      image = feature.decode_example(record["image"]) * self.task.pixel_scale
    return {"image": image, "label": self.task.label(record)}


def _text_feature(features, key: str):
  """The feature at `key`, '/' going into nested features and through
  sequences (coco_captions' `captions/text`); None where there is none."""
  feature = features
  for part in key.split("/"):
    if isinstance(feature, tfds.features.Sequence):
      feature = feature.feature
    if not hasattr(feature, "keys") or part not in feature.keys():
      return None
    feature = feature[part]
  if isinstance(feature, tfds.features.Sequence):
    feature = feature.feature
  return feature


def text_of(record, key: str):
  """The record's text at `key` (see `_text_feature`)."""
  for part in key.split("/"):
    record = record[part]
  return record


def has_text(source, key: str) -> bool:
  """Whether `source` has a text feature at `key`."""
  features = getattr(source, "features", None)
  return features is not None and isinstance(_text_feature(features, key),
                                             tfds.features.Text)


def check_text(source, text: specs.TextSpec):
  """A UserError unless `source` has a text feature `text.key` (a Text, or
  a Sequence of Text; '/' names one inside a nested feature)."""
  features = getattr(source, "features", None)
  if features is None:
    raise UserError(f"{source.name} has no text (config.text.key="
                    f"{text.key!r}): image-text training reads a TFDS "
                    "dataset with captions, e.g. digits_captions.")
  feature = _text_feature(features, text.key)
  if not isinstance(feature, tfds.features.Text):
    raise UserError(f"Dataset {source.name!r} has no text feature "
                    f"{text.key!r} (config.text.key); its features: "
                    f"{', '.join(features.keys())}.")


def make_source(spec: specs.DataSpec, index_dir=None):
  """The spec's dataset (with `spec.text`, checked to have that text).
  `index_dir` (the training workdir) keeps an image folder's or an
  img2dataset output's listing, so other processes and resumed runs read
  it."""
  if spec.dataset.startswith((FOLDER_PREFIX, VTAB_PREFIX)) and spec.label_key:
    raise UserError(f"data.label_key={spec.label_key!r} names a TFDS "
                    f"feature; {spec.dataset} has its own labels.")
  if spec.dataset.startswith(IMG2DATASET_PREFIX) and spec.label_key:
    raise UserError(f"data.label_key={spec.label_key!r} names a TFDS "
                    f"feature; {spec.dataset} has no labels.")
  if spec.dataset.startswith(FOLDER_PREFIX):
    source = image_folder.ImageFolderSource(spec.dataset[len(FOLDER_PREFIX):],
                                            index_dir)
  elif spec.dataset.startswith(IMG2DATASET_PREFIX):
    source = img2dataset_source.Img2DatasetSource(
        spec.dataset[len(IMG2DATASET_PREFIX):], index_dir)
  elif spec.dataset.startswith(VTAB_PREFIX):
    source = VtabSource(spec.dataset[len(VTAB_PREFIX):], spec.data_dir,
                        spec.manual_dir)
  else:
    source = TfdsSource(spec.dataset, spec.data_dir, spec.manual_dir,
                        label_key=spec.label_key)
  if spec.text is not None:
    check_text(source, spec.text)
  return source


def label_names(spec: specs.DataSpec, index_dir=None):
  """The class names of the spec's dataset from its metadata alone
  (nothing is downloaded or prepared); None where they cannot be read."""
  if spec.dataset.startswith(IMG2DATASET_PREFIX):
    return None  # Image-text pairs: no classes.
  try:
    if spec.dataset.startswith(FOLDER_PREFIX):
      return image_folder.class_names(spec.dataset[len(FOLDER_PREFIX):],
                                      index_dir) or None
    features = _builder(spec.dataset, spec.data_dir).info.features
    label = (features["label"]
             if "label" in features else features["labels"].feature)
    return list(label.names)
  except Exception:  # pylint: disable=broad-except  # Names are optional.
    return None


def imagenet_names() -> list[str]:
  """The 1,000 ImageNet-1k class names that ship inside tensorflow-datasets
  (in class-index order): the first of each entry's synonyms, or the whole
  entry where two classes share that first synonym (the two 'maillot's)."""
  from tensorflow_datasets.datasets.siscore import labels  # pylint: disable=g-import-not-at-top
  entries = labels.IMAGENET_LABELS_LIST
  first = [entry.split(",")[0].strip() for entry in entries]
  return [
      name if first.count(name) == 1 else entry
      for name, entry in zip(first, entries)
  ]
