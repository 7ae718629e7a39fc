"""Test accuracy and loss over one exact pass of a (padded, masked) split.

The top-1 class is correct when it is one of the example's true labels
(one-hot, or multi-hot for several labels per image). With
`skip_unlabelled` an example without any label is left out of every sum
(the rule of ImageNet ReaL, whose relabelling left some images without a
label); otherwise each example counts once.
"""

from typing import Callable
from typing import Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import numpy as np

from vit_jax import objectives
from vit_jax import sharding
from vit_jax.data import input_pipeline
from vit_jax.data import unreadable
from vit_jax.errors import UserError
from vit_jax.evaluators import registry
from vit_jax.training import losses


def top1_correct(logits, labels, mask, skip_unlabelled: bool = False):
  """(correct, counted), f32[b] each: whether the example counts (its mask,
  and with `skip_unlabelled` at least one label) and whether it counts with
  its top-1 class among its labels."""
  counted = mask
  if skip_unlabelled:
    counted = mask * (jnp.max(labels, -1) > 0)
  top1 = jnp.argmax(logits, -1)[:, None]
  hit = jnp.take_along_axis(labels, top1, -1)[:, 0] > 0
  return hit * counted, counted


class ClassificationEvaluator:
  """Counts every example of the split exactly once (padding is masked)."""

  def __init__(self, model: nn.Module, batches: Callable[[], Iterable[dict]],
               mesh: Mesh, loss_fn, params_sharding, logical_axis_rules=(),
               skip_unlabelled: bool = False):
    """`batches()` returns a fresh iterable of process-local numpy batches;
    `skip_unlabelled`: see the module doc."""
    self._batches = batches
    self._mesh = mesh
    self._skip_unlabelled = skip_unlabelled

    def eval_step(params, batch):
      logits, _ = model.apply({"params": params}, batch["image"], train=False)
      correct, counted = top1_correct(logits, batch["labels"], batch["mask"],
                                      skip_unlabelled)
      return {
          "correct": jnp.sum(correct),
          "loss": jnp.sum(loss_fn(logits, batch["labels"]) * counted),
          "count": jnp.sum(counted),
          "images": jnp.sum(batch["mask"])
      }

    self._step = sharding.jit_on_mesh(
        eval_step, mesh, logical_axis_rules,
        in_shardings=(params_sharding, sharding.batch_sharding(mesh)),
        out_shardings=sharding.replicated(mesh))

  def run(self, params) -> dict[str, float]:
    totals = None
    for local_batch in self._batches():
      sums = self._step(params, sharding.to_global_batch(
          local_batch, self._mesh))
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    totals = jax.tree.map(lambda x: float(np.asarray(x)), totals)
    count = max(totals["count"], 1.0)  # No labelled example: 0, not NaN.
    metrics = {
        "accuracy": totals["correct"] / count,
        "loss": totals["loss"] / count,
        "num_examples": totals["count"],
        **unreadable.left_out(self._batches, totals["images"])
    }
    if self._skip_unlabelled:
      metrics["num_unlabelled"] = totals["images"] - totals["count"]
    return metrics

  def summary(self, metrics) -> str:
    line = (f"accuracy {metrics['accuracy']:.4f}, loss {metrics['loss']:.4f} "
            f"on {metrics['num_examples']:.0f} examples")
    if "num_unlabelled" in metrics:
      line += f" ({metrics['num_unlabelled']:.0f} without labels not counted)"
    return line + unreadable.summary(metrics)


def eval_loss(name: str, average_label_sets: bool):
  """The config's loss; with `average_label_sets` and softmax_xent, against
  the uniform distribution over each example's labels (a multi-hot set
  divided by its size, ReaL's), so it is on the scale of one label's."""
  loss_fn = losses.LOSSES[name]
  if not average_label_sets or name != "softmax_xent":
    return loss_fn

  def normalised(logits, labels):
    # An empty set stays all zeros (a loss of 0; see skip_unlabelled).
    sizes = jnp.maximum(jnp.sum(labels, -1, keepdims=True), 1.0)
    return loss_fn(logits, labels / sizes)

  return normalised


def check_same_classes(entry: registry.Entry, context: registry.Context,
                       source):
  """The entry's data has the classes of the training data (the head's)."""
  if source.num_classes != context.train_source.num_classes:
    raise UserError(
        f"config.evals.{entry.name} reads {entry.data.dataset}, which has "
        f"{source.num_classes} classes, but the model's head has "
        f"{context.train_source.num_classes} (those of "
        f"{context.config.dataset}); evaluate data with the training data's "
        "classes in their order.")


@registry.register(
    "classification",
    fields={
        # Leave out examples without a label (ImageNet ReaL's rule).
        "skip_unlabelled": False,
        # With softmax_xent, the loss against each example's labels as a
        # distribution (ReaL's label sets); else against the multi-hot set.
        "average_label_sets": False,
    },
    skip=lambda config, fields: objectives.evaluated_by(config, "classification"
                                                       ))
def make(entry: registry.Entry, context: registry.Context):
  """Top-1 accuracy and loss of the model's head on the entry's data (a
  supervised or distilled run's head; its classes must be the data's)."""
  config = context.config
  source = context.source(entry.data)
  check_same_classes(entry, context, source)
  return ClassificationEvaluator(
      context.model,
      input_pipeline.make_eval_batches(
          entry.data, source, collector=context.unreadable), context.mesh,
      eval_loss(config.loss, entry.fields["average_label_sets"]),
      context.params_sharding, config.sharding.logical_axis_rules,
      skip_unlabelled=entry.fields["skip_unlabelled"])
