"""Masked patch prediction on the eval split: loss and per-patch accuracy.

The evaluator of `config.objective=masked_patch`. Each evaluation corrupts
the same patches of the same images (the corruption of batch i is drawn from
the config's seed and i), so evaluations at different steps compare. Like
the classification evaluator it counts every image once (padding is masked);
loss and accuracy are over the corrupted patches.
"""

from typing import Callable
from typing import Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import ml_collections
import numpy as np

from vit_jax import models
from vit_jax import sharding
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.data import unreadable
from vit_jax.evaluators import registry
from vit_jax.training import objectives


class MaskedPatchEvaluator:
  """`run(params) -> {'loss', 'accuracy', 'num_examples', 'num_patches'}`."""

  def __init__(self, model: nn.Module, batches: Callable[[], Iterable[dict]],
               mesh: Mesh, mp_config: ml_collections.ConfigDict, stride: int,
               seed: int, params_sharding, logical_axis_rules=()):
    """`batches()` returns a fresh iterable of process-local numpy batches."""
    self._batches = batches
    self._mesh = mesh

    def eval_step(params, batch, index):
      rng = jax.random.fold_in(jax.random.key(seed), index)
      apply = lambda images, **kw: model.apply({"params": params}, images, train
                                               =False, **kw)
      sums = objectives.masked_patch_sums(apply, batch["image"], rng, mp_config,
                                          stride, batch["mask"])
      return {**sums, "images": jnp.sum(batch["mask"])}

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
    return {
        "loss": totals["loss"] / totals["count"],
        "accuracy": totals["correct"] / totals["count"],
        "num_examples": totals["images"],
        "num_patches": totals["count"],
        **unreadable.left_out(self._batches, totals["images"])
    }

  def summary(self, metrics) -> str:
    return (f"accuracy {metrics['accuracy']:.4f}, loss {metrics['loss']:.4f} "
            f"on {metrics['num_patches']:.0f} corrupted patches of "
            f"{metrics['num_examples']:.0f} images" +
            unreadable.summary(metrics))


@registry.register(
    "masked_patch", skip=lambda config, fields: None
    if config.objective == "masked_patch" else
    (f"config.objective={config.objective!r} trains no masked-patch head"),
    reads=tuple(f for f in specs.DATA_FIELDS if f != "label_key"))
def make(entry: registry.Entry, context: registry.Context):
  """Masked patch prediction's loss and per-patch accuracy on the entry's
  data (labels are not read)."""
  config = context.config
  return MaskedPatchEvaluator(
      context.model,
      input_pipeline.make_eval_batches(
          entry.data, context.source(entry.data), labels=False,
          collector=context.unreadable), context.mesh, config.masked_patch,
      models.stride(config.model), config.seed, context.params_sharding,
      config.sharding.logical_axis_rules)
