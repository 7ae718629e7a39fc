"""Named sets of few-shot datasets, for config.fewshot.datasets (what `vit-jax
fewshot` sweeps) and the `datasets` of a fewshot entry of config.evals.

`STANDARD` is big_vision's standard few-shot set (its
configs/common_fewshot.py): six TFDS datasets with their own splits, plus
ImageNet's first 65,000 training images (at least 30 per class) against
its validation set, which big_vision leaves commented out because ImageNet
is a manual download. Features come from a resize to 256 and a central
crop of 224 (`standard_pp`), at 1, 5, 10 and 25 shots, 3 seeds, L2 2^10.
"""

IMAGENET = ("imagenet2012", "train[:65000]", "validation")
STANDARD = (
    ("caltech101", "train", "test"),
    ("cars196:2.1.0", "train", "test"),
    ("cifar100", "train", "test"),
    ("dtd", "train", "test"),
    ("oxford_iiit_pet", "train", "test"),
    ("uc_merced", "train[:1000]", "train[1000:]"),
    IMAGENET,
)
SHOTS = (1, 5, 10, 25)


def standard_pp(image_size: int = 224) -> str:
  """big_vision's few-shot preprocessing: a square resize to
  image_size/0.875 (256 for 224) and the central crop."""
  return f"resize({round(image_size / 0.875)})|central_crop|value_range"


def use_standard(config, imagenet: bool = True, every_steps: int = 0):
  """Sets `config.fewshot` to the standard set and its protocol (without
  ImageNet where `imagenet` is False); `every_steps` > 0 also runs it
  during training, as config.evals.fewshot."""
  fewshot = config.fewshot
  fewshot.datasets = STANDARD if imagenet else STANDARD[:-1]
  fewshot.train_split, fewshot.eval_split = "train", "test"
  fewshot.pp_eval = standard_pp(config.image_size)
  fewshot.shots, fewshot.seeds = SHOTS, 3
  fewshot.l2_selection, fewshot.l2_reg = "fixed", 2.0**10
  fewshot.layer = "pre_logits"
  if every_steps:
    config.evals.fewshot.datasets = fewshot.datasets
    config.evals.fewshot.data.pp = fewshot.pp_eval
    config.evals.fewshot.every_steps = every_steps
