"""The self-supervised objectives on the eval split: masked patch
prediction's loss and per-patch accuracy, MAE's reconstruction loss.

The evaluators of the masked_patch and mae objectives. Each
evaluation corrupts (or masks) the same patches of the same images (batch
i's draw comes from the config's seed and i), so evaluations at different
steps compare. Like the classification evaluator it counts every image once
(padding is masked); the loss (and accuracy) are over the corrupted or
dropped patches.
"""

import functools
from typing import Callable
from typing import Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import numpy as np

from vit_jax import models
from vit_jax import objectives
from vit_jax import sharding
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.data import unreadable
from vit_jax.evaluators import registry
from vit_jax.objectives import masked_autoencoding
from vit_jax.objectives import masked_patch_prediction


class PatchObjectiveEvaluator:
  """`run(params) -> {'loss', ['accuracy',] 'num_examples', 'num_patches'}`
  for `sums(apply, images, rng, weights_B)`, an objective's sums over its
  patches (`masked_patch_prediction.patch_sums`,
  `masked_autoencoding.reconstruction_sums`: `objectives.Sums`)."""

  def __init__(self, model: nn.Module, batches: Callable[[], Iterable[dict]],
               mesh: Mesh, sums: Callable, seed: int, params_sharding,
               logical_axis_rules=(), what: str = "corrupted"):
    """`batches()` returns a fresh iterable of process-local numpy batches;
    `what` names the patches the loss is over."""
    self._batches = batches
    self._mesh = mesh
    self._what = what

    def eval_step(params, batch, index):
      rng = jax.random.fold_in(jax.random.key(seed), index)
      apply = lambda images, **kw: model.apply({"params": params}, images, train
                                               =False, **kw)
      totals = sums(apply, batch["image"], rng, weights_B=batch["mask"])
      return {
          "loss": totals.loss,
          "count": totals.count,
          **totals.per_example, "images": jnp.sum(batch["mask"])
      }

    self._step = sharding.jit_on_mesh(
        eval_step, mesh, logical_axis_rules,
        in_shardings=(params_sharding, sharding.batch_sharding(mesh),
                      sharding.replicated(mesh)),
        out_shardings=sharding.replicated(mesh))

  def run(self, params) -> dict[str, float]:
    totals = None
    for index, local_batch in enumerate(self._batches()):
      sums = self._step(params, sharding.to_global_batch(
          local_batch, self._mesh), np.int32(index))
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    totals = jax.tree.map(lambda x: float(np.asarray(x)), totals)
    metrics = {"loss": totals["loss"] / totals["count"]}
    if "accuracy" in totals:  # The correct predictions' sum.
      metrics["accuracy"] = totals["accuracy"] / totals["count"]
    return {
        **metrics, "num_examples": totals["images"],
        "num_patches": totals["count"],
        **unreadable.left_out(self._batches, totals["images"])
    }

  def summary(self, metrics) -> str:
    accuracy = (f"accuracy {metrics['accuracy']:.4f}, "
                if "accuracy" in metrics else "")
    return (f"{accuracy}loss {metrics['loss']:.4f} on "
            f"{metrics['num_patches']:.0f} {self._what} patches of "
            f"{metrics['num_examples']:.0f} images" +
            unreadable.summary(metrics))


def _make(entry: registry.Entry, context: registry.Context, sums: Callable,
          what: str):
  config = context.config
  return PatchObjectiveEvaluator(
      context.model,
      input_pipeline.make_eval_batches(entry.data, context.source(
          entry.data), labels=False, collector=context.unreadable),
      context.mesh, sums, config.seed, context.params_sharding,
      config.sharding.logical_axis_rules, what)


def _runs_on(evaluator_type: str):
  return lambda config, fields: objectives.evaluated_by(config, evaluator_type)


_READS = tuple(f for f in specs.DATA_FIELDS if f != "label_key")


@registry.register("masked_patch", skip=_runs_on("masked_patch"), reads=_READS)
def make(entry: registry.Entry, context: registry.Context):
  """Masked patch prediction's loss and per-patch accuracy on the entry's
  data (labels are not read)."""
  config = context.config
  return _make(
      entry, context,
      functools.partial(masked_patch_prediction.patch_sums,
                        mp_config=config.masked_patch, stride=models.stride(
                            config.model)), "corrupted")


@registry.register("mae", skip=_runs_on("mae"), reads=_READS)
def make_mae(entry: registry.Entry, context: registry.Context):
  """MAE's reconstruction loss (the training loss: the squared error on the
  dropped patches, normalised pixels as config.mae says) on the entry's
  data (labels are not read)."""
  config = context.config
  return _make(
      entry, context,
      functools.partial(masked_autoencoding.reconstruction_sums,
                        mae_config=config.mae, stride=models.stride(
                            config.model)), "dropped")
