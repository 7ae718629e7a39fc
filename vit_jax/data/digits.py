"""The built-in dataset: scikit-learn's handwritten digits as a TFDS builder.

1,797 real 8x8 grayscale images of the digits 0-9 (UCI optdigits test set),
shipped inside scikit-learn, so it needs no download. The split is fixed: a
seeded permutation puts 1,437 images in `train` and 360 in `test`. Importing
this module registers the builder under the name `digits`, so it loads through
the same `tfds.builder("digits")` path as any TFDS dataset.
"""

import numpy as np
import tensorflow_datasets as tfds

NUM_TEST = 360
_SPLIT_SEED = 0


class Digits(tfds.core.GeneratorBasedBuilder):
  """Handwritten digits from scikit-learn (8x8, 10 classes, no download)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Fixed 1,437 / 360 train/test split."}

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(8, 8, 1)),
            "label": tfds.features.ClassLabel(num_classes=10),
        }),
        supervised_keys=("image", "label"),
        homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # The data ships with scikit-learn.
    return {
        "train": self._generate_examples("train"),
        "test": self._generate_examples("test")
    }

  def _generate_examples(self, split: str):
    import sklearn.datasets  # Only needed when the dataset is first prepared.
    digits = sklearn.datasets.load_digits()
    # Pixel values are 0..16; stretch them to the usual 0..255 range.
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    order = np.random.RandomState(_SPLIT_SEED).permutation(len(images))
    indices = order[NUM_TEST:] if split == "train" else order[:NUM_TEST]
    for index in sorted(indices):
      yield int(index), {
          "image": images[index][..., None],
          "label": int(digits.target[index])
      }
