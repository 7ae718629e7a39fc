"""What the train step minimises, as it takes it from an objective (a
`Loss`, giving `Sums`), and the classification losses (`config.loss`)
and mixup's draw that the objectives learning labels share. Imports no
TensorFlow.
"""

import dataclasses
from typing import Callable
from typing import Optional

import flax
import jax
import jax.numpy as jnp
import optax

from vit_jax.training import mixup


def softmax_xent(logits, labels):
  return optax.softmax_cross_entropy(logits.astype(jnp.float32), labels)


def sigmoid_xent(logits, labels):
  per_class = optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32),
                                                 labels)
  return jnp.sum(per_class, axis=-1)


LOSSES = {"softmax_xent": softmax_xent, "sigmoid_xent": sigmoid_xent}


def mixed(rng, images, labels, mask_B, alpha: float, p: float):
  """(images, labels, mask, rng) after mixup (`mixup.py`) with its own key
  (without mixup, the dropout key stays as it was); an example mixed with
  a placeholder (mask 0: an unreadable file's) is left out as well."""
  if alpha <= 0:
    return images, labels, mask_B, rng
  mixup_rng, rng = jax.random.split(rng)
  images, labels, own_B = mixup.mix(mixup_rng, images, labels, alpha, p)
  if mask_B is not None:
    mask_B = mask_B * jnp.where(own_B < 1, jnp.roll(mask_B, 1), 1.0)
  return images, labels, mask_B, rng


@flax.struct.dataclass
class Sums:
  """A batch's loss as a sum over its examples of weight 1 (an unreadable
  file's placeholder weighs 0) and their count: the step divides.
  `per_example`: more sums over the same examples, reported divided by
  the count (an accuracy); `per_batch`: values of the batch as a whole,
  reported as they are (SigLIP's t and b). A loss that is no sum over
  examples (SigLIP's, over the pairs of the global batch) is its value
  with count 1."""
  loss: jax.Array
  count: jax.Array
  per_example: dict = dataclasses.field(default_factory=dict)
  per_batch: dict = dataclasses.field(default_factory=dict)

  def mean(self) -> jax.Array:
    """The loss per example (0 for a batch of placeholders)."""
    return self.loss / jnp.maximum(self.count, 1.0)

  def metrics(self) -> dict:
    count = jnp.maximum(self.count, 1.0)
    return {
        **{
            k: v / count for k, v in self.per_example.items()
        },
        **self.per_batch
    }


def weighted_sums(loss_B, weights_B=None, **per_example_B) -> Sums:
  """The Sums of per-example values, each example weighted (None: all 1)."""
  if weights_B is None:
    weights_B = jnp.ones(loss_B.shape[:1], jnp.float32)
  total = lambda values_B: jnp.sum(values_B * weights_B)
  return Sums(total(loss_B), jnp.sum(weights_B), {
      k: total(v) for k, v in per_example_B.items()
  })


# `sums(forward, batch, rng, teachers) -> Sums`: `forward(images, **kw)` is
# the model in training mode, its parameters bound; `teachers(images)`
# gives the frozen teachers' logits of those images (None where the
# objective has none, `Objective.teachers`).
SumsFn = Callable[[Callable, dict, jax.Array, Optional[Callable]], Sums]


@dataclasses.dataclass(frozen=True)
class Loss:
  """What the train step minimises, made for a config and a mesh."""
  sums: SumsFn
  # `draw(batch, rng) -> entries added to the batch`, drawn once for the
  # global batch before the step splits it over devices, FSDP's shards or
  # micro-batches (MAE's masking noise): each example's draw is a pure
  # function of the seed, the step and its place in the batch, so a run is
  # the same on any mesh and resumes exactly on another. None: no draw.
  draw: Optional[Callable[[dict, jax.Array], dict]] = None
  # Collectives of its own over the global batch (SigLIP's ring): the step
  # leaves FSDP's gathering to XLA rather than run the loss per shard.
  across_batch: bool = False

  def __call__(self, forward, batch, rng, teachers=None):
    """(the loss per example, the metrics), as the step computes them."""
    sums = self.sums(forward, batch, rng, teachers)
    return sums.mean(), sums.metrics()
