"""Every mistake in a training config that can be seen before compiling.

`check_config` gathers the checks each layer keeps for its own fields
(config/fields.py, models, data/preprocess.py, training/optim.py,
weights/posemb.py, the config's objective (vit_jax/objectives/), fewshot,
evaluators, sharding). Each
raises a `UserError` that names the field, its value and what to use
instead, so a bad override costs seconds, not a compiled run.
"""

from typing import Optional

from absl import logging
from jax.sharding import Mesh
import ml_collections

from vit_jax import evaluators
from vit_jax import models
from vit_jax import objectives
from vit_jax import sharding
from vit_jax import weights
from vit_jax.config import fields
from vit_jax.config import imports
from vit_jax.data import input_pipeline
from vit_jax.data import length_schedule
from vit_jax.data import packing
from vit_jax.data import preprocess
from vit_jax.errors import UserError
from vit_jax.fewshot import evaluator as fewshot_evaluator
from vit_jax.fewshot import solver as fewshot_solver
from vit_jax.training import flexi
from vit_jax.training import optim


def check_config(config: ml_collections.ConfigDict, mesh: Mesh,
                 process_count: Optional[int] = None):
  """Every user mistake we can see before compiling, with its fix
  (`process_count`: the processes that will run it, if not these)."""
  check_fields(config)
  check_batches(config, mesh, process_count)


def check_fields(config: ml_collections.ConfigDict):
  """The mistakes the config shows by itself, without the devices (`plan`
  says them before it loads libtpu to describe a TPU topology)."""
  imports.load(config)  # What they register is checked below.
  fields.check_numbers(config)
  models.check_model_config(config.model)
  preprocess.check_pipelines(config)
  optim.check_config(config)
  weights.check_config(config)
  flexi.check_config(config)
  packing.check_config(config)
  if flexi.enabled(config) and config.pp_train.rstrip().endswith("patchify"):
    raise UserError("config.flexi trains square images at many patch sizes; "
                    "it does not take images at their own shape (pp_train "
                    "ending with patchify).")
  models.check_image_size(config.model, config.image_size, "config.image_size")
  objectives.check_config(config)
  fewshot_solver.check_config(config.fewshot)
  fewshot_evaluator.dataset_splits(
      config.fewshot.datasets, config.fewshot.train_split,
      config.fewshot.eval_split, "config.fewshot.datasets")
  evaluators.check(config)
  sharding.check_strategy_rules(config.sharding.params)


def check_batches(config: ml_collections.ConfigDict, mesh: Mesh,
                  process_count: Optional[int] = None):
  """The batch sizes split over `mesh`'s devices and the processes."""
  sharding.local_batch_size(config.batch_size, mesh, what="batch_size",
                            accumulation=config.accum_steps,
                            process_count=process_count, log=True)
  sharding.local_batch_size(config.eval_batch_size, mesh,
                            what="eval_batch_size", process_count=process_count)
  length_schedule.check_config(config, mesh.devices.size)
  if packing.enabled(config):
    sharding.local_batch_size(
        packing.sequences_per_batch(
            config, sharding.data_shards(mesh)), mesh, what="packing.sequences",
        accumulation=config.accum_steps, process_count=process_count)


def check_labels(config: ml_collections.ConfigDict,
                 info: input_pipeline.DatasetInfo):
  """A classifier's objective needs the data's classes; unlabelled data is
  for the objectives that read no labels."""
  objectives.check_labels(config, info.num_classes)


def warn_if_loss_mismatches_labels(config: ml_collections.ConfigDict,
                                   info: input_pipeline.DatasetInfo):
  if info.multi_label and config.loss == "softmax_xent":
    logging.warning(
        "%s has several labels per image but config.loss=softmax_xent "
        "spreads one probability over them; use "
        "--config.loss=sigmoid_xent to score each label on its own.",
        config.dataset)
