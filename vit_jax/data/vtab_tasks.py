"""The 19 tasks of VTAB-1k (Zhai et al. 2019) as TFDS datasets, splits, labels.

`config.dataset = "vtab:TASK"` reads a task through `sources.VtabSource`,
which resolves the benchmark's split names (`SPLITS`) to TFDS split strings
and computes each example's label with the task's `label` function. The
facts follow google-research/task_adaptation (`task_adaptation/data/*.py`):

- train800 is always `train[:800]`; val200 is the first 200 examples of
  the dataset's own validation split, of smallNORB's `test`, or, where
  the benchmark carves validation out of `train`, the 200 examples right
  after its train part (the first `N * p // 100` of the N train examples,
  p = 90, 80 for pets, 60 for EuroSAT and RESISC45, 80 for dSprites);
  train800val200 is their union.
- test is the TFDS test split, except CLEVR (`validation`), smallNORB (the
  second half of `test`), EuroSAT and RESISC45 (train after 60% + 20%) and
  dSprites (train after 80% + 10%).
- Structured labels: CLEVR counts objects (3-10, less 3) or bins the
  distance of the closest object; KITTI bins the distance of the closest
  car, van or truck (or "none"); dSprites bins x position (32 values) and
  orientation (40 values) to 16 classes; smallNORB predicts azimuth (18) or
  elevation (9); DMLab, Retinopathy and the others read the `label` feature.

The reported protocol fine-tunes on train800val200 and evaluates on test;
train800 / val200 are for choosing hyper-parameters. TensorFlow is imported
only where labels are computed (in tf.data), so configs/vtab.py loads on
hosts without it.
"""

import dataclasses
from typing import Any
from typing import Callable

from vit_jax.errors import UserError

GROUPS = ("natural", "specialized", "structured")
SPLITS = ("train800", "val200", "train800val200", "test")
TRAIN_SIZE, VAL_SIZE = 800, 200
# (train split, evaluation split) of the reported protocol (test) and of the
# one for choosing settings (val).
PROTOCOLS = {"test": ("train800val200", "test"), "val": ("train800", "val200")}

Label = Callable[[dict], Any]  # A record's features -> int64 tf.Tensor.


@dataclasses.dataclass(frozen=True)
class Task:
  """One VTAB-1k task: where its examples come from and what is predicted."""
  name: str
  group: str  # One of GROUPS.
  tfds_name: str  # With task_adaptation's version pin where TFDS has it.
  num_classes: int
  label: Label
  val_split: str = "validation"  # TFDS split whose start is val200, or train.
  val_after: tuple[int, ...] = ()  # val_split=train: percents of N before it.
  test_split: str = "test"  # A TFDS split, or train (after test_after).
  test_after: tuple[int, ...] = ()  # test_split=train: percents of N before it.
  pixel_scale: int = 1  # dSprites stores pixels as 0/1.

  @property
  def needs_train_size(self) -> bool:
    return self.val_split == "train" or self.test_split == "train"

  def tfds_split(self, split: str, num_train: int = 0) -> str:
    """The TFDS split string of the benchmark split `split` (one of
    SPLITS); `num_train` is the size N of the dataset's `train` split."""
    start = lambda percents: sum(num_train * p // 100 for p in percents)
    if self.val_split == "train":
      begin = start(self.val_after)
      val = f"train[{begin}:{begin + VAL_SIZE}]"
    else:
      val = f"{self.val_split}[:{VAL_SIZE}]"
    test = (f"train[{start(self.test_after)}:]"
            if self.test_split == "train" else self.test_split)
    train = f"train[:{TRAIN_SIZE}]"
    return {
        "train800": train,
        "val200": val,
        "train800val200": f"{train}+{val}",
        "test": test
    }[split]


def feature(name: str) -> Label:
  """The label is the class feature `name` as it is."""

  def label(record):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.cast(record[name], tf.int64)

  return label


def binned(name: str, values: int, classes: int) -> Label:
  """`values` consecutive values of an integer feature grouped into
  `classes` bins: floor(v / (values / classes)), in integers."""

  def label(record):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.cast(record[name], tf.int64) * classes // values

  return label


def _bin_index(value, thresholds):
  """The index of the last of the increasing `thresholds` below `value`
  (-1 where none is, which the pipeline's range check rejects)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  below = tf.constant(thresholds, tf.float32) < value
  return tf.reduce_sum(tf.cast(below, tf.int64)) - 1


def clevr_count(record):
  """CLEVR scenes hold 3 to 10 objects: classes 0..7."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.cast(tf.size(record["objects"]["size"]), tf.int64) - 3


def clevr_distance(record):
  """The depth of the closest object (pixel_coords z) in 6 bins."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  depth = tf.reduce_min(record["objects"]["pixel_coords"][:, 2])
  return _bin_index(depth, [0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0])


def kitti_vehicle_distance(record):
  """The distance (location z, metres) of the closest car, van or truck
  (types 0-2) in 3 bins, or class 3 where there is none."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  objects = record["objects"]
  depths = tf.boolean_mask(objects["location"][:, 2], objects["type"] < 3)
  closest = tf.reduce_min(tf.concat([depths, [1000.0]], 0))
  return _bin_index(closest, [-100.0, 8.0, 20.0, 999.0])


_TASKS = (
    Task("caltech101", "natural", "caltech101:3.*.*", 102, feature("label"),
         val_split="train", val_after=(90,)),
    Task("cifar100", "natural", "cifar100:3.*.*", 100, feature("label"),
         val_split="train", val_after=(90,)),
    Task("dtd", "natural", "dtd:3.*.*", 47, feature("label")),
    Task("oxford_flowers102", "natural", "oxford_flowers102:2.*.*", 102,
         feature("label")),
    # task_adaptation pins 3.*.*; TFDS now has 4.0.0 only (fixed corrupt
    # images, added head boxes; same train/test splits).
    Task("oxford_iiit_pet", "natural", "oxford_iiit_pet:4.*.*", 37,
         feature("label"), val_split="train", val_after=(80,)),
    Task("sun397", "natural", "sun397/tfds:4.*.*", 397, feature("label")),
    Task("svhn", "natural", "svhn_cropped:3.*.*", 10, feature("label"),
         val_split="train", val_after=(90,)),
    Task("patch_camelyon", "specialized", "patch_camelyon:2.*.*", 2,
         feature("label")),
    Task("eurosat", "specialized", "eurosat/rgb:2.*.*", 10, feature("label"),
         val_split="train", val_after=(60,), test_split="train",
         test_after=(60, 20)),
    Task("resisc45", "specialized", "resisc45:3.*.*", 45, feature("label"),
         val_split="train", val_after=(60,), test_split="train",
         test_after=(60, 20)),
    Task("diabetic_retinopathy",
         "specialized", "diabetic_retinopathy_detection/btgraham-300:3.*.*", 5,
         feature("label")),
    Task("clevr_count", "structured", "clevr:3.*.*", 8, clevr_count,
         val_split="train", val_after=(90,), test_split="validation"),
    Task("clevr_distance", "structured", "clevr:3.*.*", 6, clevr_distance,
         val_split="train", val_after=(90,), test_split="validation"),
    Task("dmlab", "structured", "dmlab:2.0.1", 6, feature("label")),
    # task_adaptation pins 3.1.0; 3.2.0 updated the devkit download and 3.3.0
    # added occlusion labels; neither changes what the task reads.
    Task("kitti_distance", "structured", "kitti:3.*.*", 4,
         kitti_vehicle_distance),
    Task("dsprites_location", "structured", "dsprites:2.*.*", 16,
         binned("label_x_position", 32, 16), val_split="train", val_after=(80,),
         test_split="train", test_after=(80, 10), pixel_scale=255),
    Task("dsprites_orientation", "structured", "dsprites:2.*.*", 16,
         binned("label_orientation", 40,
                16), val_split="train", val_after=(80,), test_split="train",
         test_after=(80, 10), pixel_scale=255),
    Task("smallnorb_azimuth", "structured", "smallnorb:2.*.*", 18,
         feature("label_azimuth"), val_split="test", test_split="test[50%:]"),
    Task("smallnorb_elevation", "structured", "smallnorb:2.*.*", 9,
         feature("label_elevation"), val_split="test", test_split="test[50%:]"),
)
TASKS: dict[str, Task] = {task.name: task for task in _TASKS}


def get(name: str) -> Task:
  if name not in TASKS:
    raise UserError(f"Unknown VTAB task {name!r}; the 19 tasks are: "
                    f"{', '.join(TASKS)}.")
  return TASKS[name]


def check_split(task: Task, split) -> None:
  if split not in SPLITS:
    raise UserError(
        f"vtab:{task.name} is read through the benchmark's splits "
        f"{', '.join(SPLITS)}, not {split!r}: train on train800val200 and "
        "evaluate on test (or train800 and val200 to choose settings).")
