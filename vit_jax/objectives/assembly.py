"""A config's objective put to work: its checks with the rest of the
config, the decided config, its training data, and the train step that
training runs and the plan and the benchmark compile (one assembly, so the
plan measures the real step). Imports no TensorFlow.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import ml_collections

from vit_jax import sharding
from vit_jax import weights
from vit_jax.config import defaults
from vit_jax.config import fields
from vit_jax.data import preprocess
from vit_jax.data import specs
from vit_jax.errors import UserError
from vit_jax.objectives import interface
from vit_jax.training import losses
from vit_jax.training import steps


def check_config(config: ml_collections.ConfigDict):
  """The objective's name, what the rest of the config asks of it (labels
  to mix, a classifier for FlexiViT, images at their own shape), no field
  of another objective's set, then its own checks."""
  objective = interface.of(config)
  fields.check_choice(config, "loss", losses.LOSSES)
  _check_other_objectives_fields(config, objective)
  if config.mixup.alpha > 0 and not objective.classifies:
    raise UserError(f"config.mixup.alpha={config.mixup.alpha} mixes labels, "
                    f"which config.objective={objective.name!r} does not "
                    "read; set config.mixup.alpha=0.")
  if config.flexi.patch_sizes and not objective.classifies:
    raise UserError("config.flexi trains a classifier (objective "
                    f"{interface.names_where(lambda o: o.classifies)}); "
                    f"config.objective is {objective.name}.")
  if not objective.takes_sequences(config):
    for field, spec in preprocess.sequence_pipelines(config):
      raise UserError(
          f"config.{field}={spec!r}: config.objective={objective.name} "
          "reads square images; patch sequences train "
          f"{interface.names_where(lambda o: o.takes_sequences(config))} "
          "only.")
  objective.check(config)


def _check_other_objectives_fields(config, objective):
  """A field only another objective reads, set: the user meant that one."""
  untouched = defaults.get_config()
  for other in interface.OBJECTIVES.values():
    if other is objective:
      continue
    for field in other.own_fields:
      value = _dotted(config, field)
      if value != _dotted(untouched, field):
        raise UserError(
            f"config.{field} is set but config.objective="
            f"{objective.name!r}, which does not read it; set "
            f"--config.objective={other.name} to use it, or unset it.")


def _dotted(config, field: str):
  for part in field.split("."):
    config = config[part]
  return config


def check_labels(config: ml_collections.ConfigDict, num_classes: int):
  """A classifier's objective needs the data's classes."""
  objective = interface.of(config)
  if objective.classifies and not num_classes:
    without = interface.names_where(
        lambda o: not o.classifies and not o.carries(config).labels)
    raise UserError(
        f"{config.dataset} has no labels, and config.objective="
        f"{objective.name} trains a head of its classes. Use an objective "
        f"that reads no labels ({without}: --config.objective=mae, "
        "configs/mae.py), or a labelled dataset.")


def decide(config: ml_collections.ConfigDict, resumed_workdir=None,
           checkpoint: Optional[str] = None) -> ml_collections.ConfigDict:
  """The config decided before anything is built: its model's open fields
  (`weights.decide`), then what its objective settles (a text tower's
  vocabulary)."""
  config = weights.decide(config, resumed_workdir, checkpoint)
  return interface.of(config).decide(config, resumed_workdir)


def model(config: ml_collections.ConfigDict, num_classes: Optional[int]):
  """The model a decided training config trains (its objective's)."""
  return interface.of(config).model(config, num_classes)


def training_data(config: ml_collections.ConfigDict) -> specs.DataSpec:
  """The training data, with the texts where the objective reads them."""
  return specs.training(config, text=interface.of(config).carries(config).text)


def train_step(config: ml_collections.ConfigDict, model, tx, schedule,
               mesh: Mesh, state_sharding, teachers=()) -> steps.BoundStep:
  """The config's jitted train step, `step(state, batch)`, for its model
  (its objective's, `Objective.model`) and teachers (`Objective.teachers`,
  their parameters bound)."""
  loss = interface.of(config).loss(config, mesh)
  step = steps.make_train_step(
      model, tx, loss, schedule, mesh, config.accum_steps, config.ema_decay,
      state_sharding.params, tuple(config.frozen), state_sharding.fp8, teachers)
  return steps.jit_train_step(step, state_sharding, mesh,
                              config.sharding.logical_axis_rules, teachers)


def abstract_batch(config: ml_collections.ConfigDict, mesh: Mesh,
                   num_classes: int, image_dtype=jnp.float32) -> dict:
  """A training batch as ShapeDtypeStructs on `mesh`, as the input
  pipeline gives it (mask 0: an unreadable file) with what the objective
  reads."""
  on_batch = sharding.batch_sharding(mesh)
  batch, size = config.batch_size, config.image_size
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=
                                                   on_batch)
  out = {
      "image": spec((batch, size, size, 3), image_dtype),
      "mask": spec((batch,), jnp.float32)
  }
  carries = interface.of(config).carries(config)
  if carries.labels:
    out["labels"] = spec((batch, num_classes), jnp.float32)
  if carries.text:  # One text each.
    out["text"] = spec((batch, config.text.length), jnp.int32)
  return out
