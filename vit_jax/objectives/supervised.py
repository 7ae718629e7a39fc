"""`supervised`: classification of the data's labels (config.loss), with
label smoothing and mixup where the config asks. Images at their own shape
(NaFlex) and NaViT's packed sequences train this way too."""

from typing import Callable

import ml_collections
import optax

from vit_jax.objectives import interface
from vit_jax.training import losses


def classification_loss(loss_fn: Callable = losses.softmax_xent,
                        label_smoothing: float = 0.0, mixup_alpha: float = 0.0,
                        mixup_p: float = 1.0) -> interface.Loss:
  """`loss_fn(logits, labels)` of `batch["labels"]`; label smoothing mixes
  the targets with the uniform distribution; with `mixup_alpha`, images
  and labels are mixed first (`training/mixup.py`)."""

  def sums(forward, batch, rng, teachers):
    del teachers
    images, labels = batch["image"], batch["labels"]
    mask_B = batch.get("mask")  # 0: an unreadable file's blank placeholder.
    images, labels, mask_B, rng = losses.mixed(rng, images, labels, mask_B,
                                               mixup_alpha, mixup_p)
    if label_smoothing:
      labels = optax.smooth_labels(labels, label_smoothing)
    logits, _ = forward(images, rngs={"dropout": rng})
    if logits.ndim == 3:  # Packed sequences: an image per slot, some empty.
      logits = logits.reshape(-1, logits.shape[-1])
      labels = labels.reshape(-1, labels.shape[-1])
      mask_B = mask_B.reshape(-1)
    return interface.weighted_sums(loss_fn(logits, labels), mask_B)

  return interface.Loss(sums)


class Supervised(interface.Objective):
  name = "supervised"
  classifies = True
  evaluators = ("classification", "fewshot")
  benchmarked = True

  def takes_sequences(self, config):
    return True

  def carries(self, config):
    return interface.Carries(labels=True)

  def loss(self, config: ml_collections.ConfigDict, mesh=None):
    return classification_loss(losses.LOSSES[config.loss],
                               config.label_smoothing, config.mixup.alpha,
                               config.mixup.p)

  def describe(self, config, num_classes, teachers=()):
    return f"{num_classes} classes"


interface.register(Supervised())
