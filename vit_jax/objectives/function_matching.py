"""`distill`: the student matches frozen teachers' predictions on exactly
the images it sees (function matching; `training/distill.py` has the
distances and the fields, `training/teachers.py` the teachers)."""

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax.errors import UserError
from vit_jax.objectives import interface
from vit_jax.training import distill
from vit_jax.training import losses
from vit_jax.training import teachers as teachers_lib


def matching_loss(target: str = "probabilities", temperature: float = 1.0,
                  label_weight: float = 0.0,
                  label_loss: Callable = losses.softmax_xent,
                  mixup_alpha: float = 0.0, mixup_p: float = 1.0,
                  label_smoothing: float = 0.0) -> interface.Loss:
  """The distance to the teachers' predictions of the student's images
  (after mixup), plus `label_weight` x the labels' loss. Metrics:
  `agreement`, the share of examples whose top-1 class is the teachers';
  with a label term, `distill_loss` alone too."""

  def sums(forward, batch, rng, teachers):
    images, mask_B = batch["image"], batch.get("mask")
    labels = batch["labels"] if label_weight else None
    # One draw, which the student and the teachers both see.
    images, labels, mask_B, rng = losses.mixed(rng, images, labels, mask_B,
                                               mixup_alpha, mixup_p)
    matched = jax.lax.stop_gradient(
        distill.teachers_target(teachers(images), target, temperature))
    logits, _ = forward(images, rngs={"dropout": rng})
    distill_B = distill.distance(logits, matched, target, temperature)
    agree_B = (jnp.argmax(logits, -1) == jnp.argmax(matched, -1)).astype(
        jnp.float32)
    if not label_weight:
      return interface.weighted_sums(distill_B, mask_B, agreement=agree_B)
    if label_smoothing:
      labels = optax.smooth_labels(labels, label_smoothing)
    loss_B = distill_B + label_weight * label_loss(logits, labels)
    return interface.weighted_sums(loss_B, mask_B, agreement=agree_B,
                                   distill_loss=distill_B)

  return interface.Loss(sums)


class Distill(interface.Objective):
  name = "distill"
  classifies = True
  evaluators = ("classification", "distill", "fewshot")
  config_section = "distill"
  own_fields = ("distill.teachers",)

  def check(self, config):
    if not distill.teacher_specs(config):
      raise UserError(
          "config.objective=distill needs a teacher: set "
          "--config.distill.teachers=\"('CHECKPOINT',)\" (configs/distill.py "
          "has recipes).")
    distill.check_config(config)

  def carries(self, config):
    return interface.Carries(labels=config.distill.label_weight > 0)

  def loss(self, config: ml_collections.ConfigDict, mesh=None):
    d = config.distill
    return matching_loss(d.target, d.temperature, d.label_weight,
                         losses.LOSSES[config.loss], config.mixup.alpha,
                         config.mixup.p, config.label_smoothing)

  def teachers(self, config, mesh, num_classes, abstract=False):
    return teachers_lib.load(config, mesh, num_classes, abstract=abstract)

  def describe(self, config, num_classes, teachers=()):
    plural = "s" if len(teachers) > 1 else ""
    return f"{num_classes} classes from {len(teachers)} teacher{plural}"


interface.register(Distill())
