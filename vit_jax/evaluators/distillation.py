"""The `distill` type of config.evals: how close the student is to its
teachers on the evaluation data (the distill objective).

Both models see the same evaluation images (each teacher resized to its
resolution, as in training). Metrics, over every example of the split
once: `agreement` (the student's top-1 class is the teachers'), `loss`
(the training's distillation loss: config.distill's target and
temperature), `student_accuracy`, and at the entry's first evaluation
`teacher_accuracy` (the teachers are frozen: it does not change). With
`cache_teacher` the teachers' logits of the split are computed once and
kept on the devices (examples x classes x 4 bytes, split over them), so
later evaluations run the student only.
"""

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import numpy as np

from vit_jax import objectives
from vit_jax import sharding
from vit_jax.data import input_pipeline
from vit_jax.data import unreadable
from vit_jax.evaluators import classification
from vit_jax.evaluators import registry
from vit_jax.training import distill
from vit_jax.training import teachers as teachers_lib


class DistillationEvaluator:
  """Compares the student with its teachers over one exact pass."""

  def __init__(self, model, teachers, batches, mesh: Mesh, params_sharding,
               logical_axis_rules=(), target: str = "probabilities",
               temperature: float = 1.0, cache_teacher: bool = True):
    self._batches, self._mesh = batches, mesh
    self._teacher_params = teachers_lib.params_of(teachers)
    self._cache = cache_teacher
    self._cached = None  # The teachers' logits of each batch, once run.
    self._runs = 0
    run_teachers = teachers_lib.make_apply(teachers)
    batch_sharding = sharding.batch_sharding(mesh)
    self._teacher_step = sharding.jit_on_mesh(
        lambda params, batch: run_teachers(params, batch["image"]), mesh,
        logical_axis_rules,
        in_shardings=(teachers_lib.shardings_of(teachers), batch_sharding),
        out_shardings=batch_sharding)

    def compare(params, batch, teacher_logits):
      logits, _ = model.apply({"params": params}, batch["image"], train=False)
      labels, mask = batch["labels"], batch["mask"]
      matched = distill.teachers_target(teacher_logits, target, temperature)
      top1 = jnp.argmax(matched, -1)
      correct, counted = classification.top1_correct(logits, labels, mask)
      teacher_hit = jnp.take_along_axis(labels, top1[:, None], -1)[:, 0] > 0
      loss = distill.distance(logits, matched, target, temperature)
      return {
          "student_correct": jnp.sum(correct),
          "teacher_correct": jnp.sum(teacher_hit * counted),
          "agree": jnp.sum((jnp.argmax(logits, -1) == top1) * mask),
          "loss": jnp.sum(loss * mask),
          "count": jnp.sum(counted),
          "images": jnp.sum(mask)
      }

    self._compare = sharding.jit_on_mesh(
        compare, mesh, logical_axis_rules,
        in_shardings=(params_sharding, batch_sharding, batch_sharding),
        out_shardings=sharding.replicated(mesh))

  def _teacher_logits(self, index: int, batch):
    if self._cached is not None and index < len(self._cached):
      return self._cached[index]
    return self._teacher_step(self._teacher_params, batch)

  def run(self, params) -> dict[str, float]:
    totals, computed = None, []
    for index, local_batch in enumerate(self._batches()):
      batch = sharding.to_global_batch(local_batch, self._mesh)
      teacher_logits = self._teacher_logits(index, batch)
      if self._cache:
        computed.append(teacher_logits)
      sums = self._compare(params, batch, teacher_logits)
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    if self._cache:
      self._cached = computed
    totals = jax.tree.map(lambda x: float(np.asarray(x)), totals)
    images, count = max(totals["images"], 1.0), max(totals["count"], 1.0)
    metrics = {
        "agreement": totals["agree"] / images,
        "loss": totals["loss"] / images,
        "student_accuracy": totals["student_correct"] / count,
        "num_examples": totals["images"],
        **unreadable.left_out(self._batches, totals["images"])
    }
    if not self._runs:  # Frozen teachers: their accuracy once.
      metrics["teacher_accuracy"] = totals["teacher_correct"] / count
    self._runs += 1
    return metrics

  def summary(self, metrics) -> str:
    line = (f"agreement {metrics['agreement']:.4f}, loss "
            f"{metrics['loss']:.4f}, student accuracy "
            f"{metrics['student_accuracy']:.4f}")
    if "teacher_accuracy" in metrics:
      line += f", teacher accuracy {metrics['teacher_accuracy']:.4f}"
    return (line + f" on {metrics['num_examples']:.0f} examples" +
            unreadable.summary(metrics))


@registry.register(
    "distill",
    fields={
        # Keep the teachers' logits of the split on the devices after the
        # first evaluation, so that later ones run the student only.
        "cache_teacher": True,
    },
    skip=lambda config, fields: objectives.evaluated_by(config, "distill"))
def make(entry: registry.Entry, context: registry.Context):
  """The student against config.distill's teachers on the entry's data
  (labelled with the training data's classes)."""
  config = context.config
  source = context.source(entry.data)
  classification.check_same_classes(entry, context, source)
  return DistillationEvaluator(
      context.model, context.teachers,
      input_pipeline.make_eval_batches(
          entry.data, source,
          collector=context.unreadable), context.mesh, context.params_sharding,
      config.sharding.logical_axis_rules, config.distill.target,
      config.distill.temperature, entry.fields["cache_teacher"])
