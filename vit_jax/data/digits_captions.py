"""The built-in image-text dataset: the digits with captions.

The images and the fixed train/test split of `digits` (digits.py), each
with the captions `captions(label)`: one per template of `TEMPLATES`,
naming the digit by its word or its numeral, so that image-text training
(SigLIP, CLIP) and its zero-shot and retrieval evaluations run without a
download. `label` is a ClassLabel whose names are `CLASS_NAMES`.
Importing this module registers the builder under the name
`digits_captions`.
"""

import tensorflow_datasets as tfds

from vit_jax.data import digits

NAME = "digits_captions"
CLASS_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven",
               "eight", "nine")
# CLIP-style prompt templates: "{}" takes a class's name. The zero-shot
# evaluator fills them with CLASS_NAMES; the captions fill some with the
# numeral instead (`_BY_NUMERAL`), so the text tower learns both.
TEMPLATES = ("a handwritten digit {}", "the number {}", "a photo of a {}",
             "an image of the digit {}", "{}")
_BY_NUMERAL = (False, True, True, False, False)
NUM_CAPTIONS = len(TEMPLATES)


def captions(label: int) -> list[str]:
  """The captions of an image of digit `label`, in TEMPLATES' order."""
  return [
      template.format(str(label) if numeral else CLASS_NAMES[label])
      for template, numeral in zip(TEMPLATES, _BY_NUMERAL)
  ]


def all_captions() -> list[str]:
  """Every caption of every class (what the `digits` tokenizer learns)."""
  return [text for label in range(len(CLASS_NAMES)) for text in captions(label)]


class DigitsCaptions(digits.Digits):
  """The digits with captions written from their labels (no download)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": f"digits 1.0.0, {NUM_CAPTIONS} captions each."}

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(8, 8, 1)),
            "label": tfds.features.ClassLabel(names=CLASS_NAMES),
            "captions": tfds.features.Sequence(tfds.features.Text()),
        }),
        supervised_keys=("image", "label"),
        homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html",
    )

  def _generate_examples(self, split: str):
    for key, example in super()._generate_examples(split):
      yield key, {**example, "captions": captions(example["label"])}
