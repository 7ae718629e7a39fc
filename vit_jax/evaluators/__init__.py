"""Evaluators: entries of `config.evals`, each run by the registered type it
names (`registry.py` says how). The built-in types:

  classification  top-1 accuracy and loss of the head on a split (also
                  ImageNet ReaL and v2: configs/finetune.py:imagenet2012)
  masked_patch    masked patch prediction's loss and per-patch accuracy
  mae             MAE's reconstruction loss
  loss            the run's objective's own loss (and its other sums) on
                  held-out data: what an objective without a type of its
                  own lists (docs/extending.md, "An objective")
  fewshot         few-shot linear accuracy (config.fewshot's protocol)
  distill         a distilled student against its teachers: agreement,
                  distillation loss, both accuracies
  zeroshot        an image-text model's zero-shot accuracy (class names in
  retrieval       prompts) and image<->text recall at 1, 5, 10

A type of one's own is a module with one `@register` function, named in
config.imports.
"""

from vit_jax.evaluators import classification
from vit_jax.evaluators import distillation
from vit_jax.evaluators import fewshot_linear
from vit_jax.evaluators import image_text
from vit_jax.evaluators import objective_loss
from vit_jax.evaluators import patch_prediction
from vit_jax.evaluators.registry import TYPES
from vit_jax.evaluators.registry import Context
from vit_jax.evaluators.registry import Entry
from vit_jax.evaluators.registry import Scheduled
from vit_jax.evaluators.registry import check
from vit_jax.evaluators.registry import from_config
from vit_jax.evaluators.registry import register

# Registered now.
del (classification, distillation, fewshot_linear, image_text, objective_loss,
     patch_prediction)
__all__ = [
    "Context", "Entry", "Scheduled", "TYPES", "check", "from_config", "register"
]
