"""The `loss` type of config.evals: the run's own objective's loss (and
its other per-example sums, e.g. an accuracy) on held-out data, in
inference mode, for any objective that lists it among its evaluators (a
user's new objective gets its evaluation so). Each evaluation draws the
same randomness (batch i's from the config's seed and i), so evaluations
at different steps compare; every example counts once (padding masked).
"""

import dataclasses
from typing import Callable
from typing import Iterable
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import numpy as np

from vit_jax import objectives
from vit_jax import sharding
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.data import unreadable
from vit_jax.evaluators import registry


class ObjectiveLossEvaluator:
  """`run(params) -> {'loss', <its per-example metrics>, 'num_examples'}`
  for an objective's `loss` (`objectives.Loss`) on `batches`; with
  `counted` (what the loss's count counts, e.g. "corrupted patches") also
  `num_patches`, that count."""

  def __init__(self, model: nn.Module, batches: Callable[[], Iterable[dict]],
               mesh: Mesh, loss: objectives.Loss, seed: int, params_sharding,
               logical_axis_rules=(), counted: Optional[str] = None):
    """`batches()` returns a fresh iterable of process-local numpy batches."""
    self._batches = batches
    self._mesh = mesh
    self._counted = counted

    def eval_step(params, batch, index):
      rng = jax.random.fold_in(jax.random.key(seed), index)
      if loss.draw is not None:
        batch = {**batch, **loss.draw(batch, rng)}

      def forward(images, **kwargs):  # The model in inference mode.
        return model.apply({"params": params}, images, train=False, **kwargs)

      sums = loss.sums(forward, batch, rng, None)
      return {
          "loss": sums.loss,
          "count": sums.count,
          **sums.per_example, "images": jnp.sum(batch["mask"])
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
    count, images = totals.pop("count"), totals.pop("images")
    metrics = {k: v / max(count, 1.0) for k, v in totals.items()}
    if self._counted:
      metrics["num_patches"] = count
    return {
        **metrics, "num_examples": images,
        **unreadable.left_out(self._batches, images)
    }

  def summary(self, metrics) -> str:
    """'accuracy A, loss L, ... on N examples' (on C corrupted patches of
    N images, where the count counts patches)."""
    first = [k for k in ("accuracy", "loss") if k in metrics]
    shown = first + sorted(
        k for k in metrics if k not in first and not k.startswith("num_"))
    values = ", ".join(f"{k} {metrics[k]:.4f}" for k in shown)
    where = f"{metrics['num_examples']:.0f} examples"
    if self._counted:
      where = (f"{metrics['num_patches']:.0f} {self._counted} of "
               f"{metrics['num_examples']:.0f} images")
    return f"{values} on {where}" + unreadable.summary(metrics)


@registry.register(
    "loss", skip=lambda config, fields: objectives.evaluated_by(config, "loss"))
def make(entry: registry.Entry, context: registry.Context):
  """The objective's loss on the entry's data, with the labels and texts
  it reads (no teachers: a distillation has its own evaluator)."""
  config = context.config
  objective = objectives.of(config)
  carries = objective.carries(config)
  data = entry.data
  if carries.text:
    data = dataclasses.replace(data, text=specs.text_spec(config))
  return ObjectiveLossEvaluator(
      context.model,
      input_pipeline.make_eval_batches(
          data, context.source(data), labels=carries.labels,
          collector=context.unreadable), context.mesh,
      objective.loss(config, context.mesh), config.seed,
      context.params_sharding, config.sharding.logical_axis_rules)
