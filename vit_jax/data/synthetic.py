"""A synthetic TFDS dataset for timing the input pipeline at scale.

`synthetic_images/100k`: 100,000 training and 1,000 test images, 256x256
RGB JPEGs of 1,000 classes, drawn from seeded sine patterns (about 1.4 GB
prepared). `synthetic_images/tiny`: 64 and 16 of them, for the suite. The
images are computed, not downloaded, so `vit-jax benchmark-input
--synthetic=100k` makes the dataset of the input measurements in
docs/training.md on any machine (about 12 minutes per file format on 2
cores). Importing this module registers the builder.
"""

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

NAME = "synthetic_images"
SIZE = 256
NUM_CLASSES = 1000


@dataclasses.dataclass
class SyntheticConfig(tfds.core.BuilderConfig):
  num_train: int = 0
  num_test: int = 0


class SyntheticImages(tfds.core.GeneratorBasedBuilder):
  """Seeded sine-pattern JPEGs, 1,000 classes (labels cycle)."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [
      SyntheticConfig(name="100k", num_train=100_000, num_test=1_000),
      SyntheticConfig(name="tiny", num_train=64, num_test=16),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=__doc__, features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(SIZE, SIZE, 3),
                                         encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
        }))

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {
        "train": self._generate_examples(self.builder_config.num_train, 0),
        "test": self._generate_examples(self.builder_config.num_test, 1)
    }

  def _generate_examples(self, count: int, seed: int):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    for i in range(count):
      a, b, c = rng.uniform(0.01, 0.1, 3)
      image = np.stack([
          127 + 120 * np.sin(a * x + i), 127 + 120 * np.cos(b * y),
          127 + 120 * np.sin(c * (x + y))
      ], -1).astype(np.uint8)
      yield i, {"image": image, "label": i % NUM_CLASSES}


def prepare(config_name: str, data_dir: str, file_format: str) -> str:
  """Prepares `synthetic_images/CONFIG` in `data_dir` (if not yet) in
  `file_format` ('array_record' or 'tfrecord'); returns its TFDS name."""
  name = f"{NAME}/{config_name}"
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    builder = tfds.builder(name, data_dir=data_dir, file_format=file_format)
    builder.download_and_prepare()
  return name
