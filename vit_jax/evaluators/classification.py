"""Test accuracy and loss over one exact pass of a (padded, masked) split."""

from typing import Callable, Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vit_jax import sharding, steps
from vit_jax.data import input_pipeline


class ClassificationEvaluator:
  """Counts every example of the split exactly once (padding is masked)."""

  def __init__(self, model: nn.Module, batches: Callable[[], Iterable[dict]],
               mesh: Mesh, loss_fn, params_sharding, logical_axis_rules=()):
    """`batches()` returns a fresh iterable of process-local numpy batches."""
    self._batches = batches
    self._mesh = mesh

    def eval_step(params, batch):
      logits, _ = model.apply({"params": params}, batch["image"], train=False)
      mask = batch["mask"]
      # Top-1 is correct when it is one of the true labels (also multi-label).
      top1 = jnp.argmax(logits, -1)[:, None]
      correct = jnp.take_along_axis(batch["labels"], top1, -1)[:, 0] > 0
      return {"correct": jnp.sum(correct * mask),
              "loss": jnp.sum(loss_fn(logits, batch["labels"]) * mask),
              "count": jnp.sum(mask)}

    self._step = sharding.jit_on_mesh(
        eval_step, mesh, logical_axis_rules,
        in_shardings=(params_sharding, sharding.batch_sharding(mesh)),
        out_shardings=sharding.replicated(mesh))

  def run(self, params) -> dict[str, float]:
    totals = None
    for local_batch in self._batches():
      sums = self._step(params, sharding.to_global_batch(local_batch, self._mesh))
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    totals = jax.tree.map(lambda x: float(np.asarray(x)), totals)
    return {"accuracy": totals["correct"] / totals["count"],
            "loss": totals["loss"] / totals["count"],
            "num_examples": totals["count"]}

  def summary(self, metrics) -> str:
    return (f"accuracy {metrics['accuracy']:.4f}, loss {metrics['loss']:.4f} "
            f"on {metrics['num_examples']:.0f} examples")


def from_config(config, model, mesh, params_sharding, source):
  """On for supervised training: every config.eval_every_steps steps (0: at
  the end only)."""
  if config.objective != "supervised":
    return None

  return config.eval_every_steps, ClassificationEvaluator(
      model, input_pipeline.make_eval_batches(config, source), mesh,
      steps.LOSSES[config.loss], params_sharding,
      config.sharding.logical_axis_rules)
