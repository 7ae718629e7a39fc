"""FlexiViT training (Beyer et al., 2023): one model for every patch size.

Each step runs the model at a patch size drawn uniformly from
`config.flexi.patch_sizes`; the parameters keep the variant's shapes, the
patch embedding is PI-resized and learned position embeddings resized to
the grid inside the step (`models/vit.py`: its form's `patch_size`). Each size
compiles its own step once. The size of step s is a function of
(config.seed, s) only, so a resumed run draws the same sizes as an
uninterrupted one. Imports no TensorFlow.
"""

import dataclasses
from typing import Callable

import ml_collections
import numpy as np

from vit_jax import models
from vit_jax.errors import UserError


def enabled(config: ml_collections.ConfigDict) -> bool:
  return bool(config.flexi.patch_sizes)


def eval_patch_sizes(config: ml_collections.ConfigDict) -> tuple[int, ...]:
  return tuple(config.flexi.eval_patch_sizes or config.flexi.patch_sizes)


def check_config(config: ml_collections.ConfigDict):
  """Before compiling: sizes that tile the image, a model that can run
  at them (that its objective trains a classifier, the objective's checks
  say)."""
  if config.flexi.eval_patch_sizes and not enabled(config):
    raise UserError("config.flexi.eval_patch_sizes is set but "
                    "config.flexi.patch_sizes is empty: set both, or neither.")
  if not enabled(config):
    return
  variant = models.get_variant(config.model.variant)
  if variant.resnet is not None or variant.num_heads == 0:
    raise UserError(f"config.flexi trains a plain ViT at many patch sizes; "
                    f"{config.model.variant} is not one.")
  if (config.model.patch_size is None and
      config.image_size % variant.patch_size):
    raise UserError(
        f"config.image_size={config.image_size} is not a multiple of "
        f"{config.model.variant}'s {variant.patch_size}-pixel patches, where "
        "the model is initialised and evaluated by default: set "
        "config.model.patch_size to one of config.flexi.patch_sizes.")
  for field in ("patch_sizes", "eval_patch_sizes"):
    for size in config.flexi[field]:
      if size < 1 or config.image_size % size:
        raise UserError(
            f"config.flexi.{field} has {size}, which does not tile "
            f"config.image_size={config.image_size}; use sizes dividing it.")


def patch_size_of_step(config: ml_collections.ConfigDict, step: int) -> int:
  """The patch size step `step` (the state's step before it) runs at."""
  sizes = config.flexi.patch_sizes
  return int(np.random.default_rng([config.seed, step]).choice(sizes))


def at_patch_size(model, patch_size: int):
  """The model run at `patch_size` (the same parameters)."""
  return model.clone(
      form=dataclasses.replace(model.form, patch_size=patch_size))


class FlexiTrainStep:
  """`train_step(state, batch)` at the drawn patch size of each step, from
  one jitted step per size (`make_step(model) -> jitted step`)."""

  def __init__(self, config: ml_collections.ConfigDict, model,
               make_step: Callable, start_step: int):
    self.config = config
    self.steps = {
        size: make_step(at_patch_size(model, size))
        for size in sorted(set(config.flexi.patch_sizes))
    }
    self.next_step = start_step

  def __call__(self, state, batch):
    size = patch_size_of_step(self.config, self.next_step)
    self.next_step += 1
    return self.steps[size](state, batch)

  def compile(self, state, batch):
    """The step of the smallest patches (the most tokens: the most
    memory), compiled, for the pre-flight memory check."""
    return self.steps[min(self.steps)].compile(state, batch)
