"""Mixup (Zhang et al. 2018) on the device, inside the train step.

Each example is mixed, with probability `p`, with its neighbour in the
batch (the batch rolled by one, as big_vision does): images and labels
with the same weight `w = max(r, 1 - r)` for its own, `r ~ Beta(alpha,
alpha)` drawn once per batch. An example that is not mixed keeps weight 1,
so `p = 0` (or `alpha = 0`) leaves the batch exactly as it was.
"""

import jax
import jax.numpy as jnp


def mix(rng, images_BxHxWxC, labels_BxK, alpha: float, p: float = 1.0):
  """(mixed images, mixed labels, weights B of each example's own);
  `labels_BxK` may be None (distillation reads none): then None."""
  if alpha <= 0 or p <= 0:
    weights_B = jnp.ones(images_BxHxWxC.shape[:1], jnp.float32)
    return images_BxHxWxC, labels_BxK, weights_B
  ratio_rng, chosen_rng = jax.random.split(rng)
  ratio = jax.random.beta(ratio_rng, alpha, alpha)
  ratio = jnp.maximum(ratio, 1.0 - ratio)
  chosen_B = jax.random.uniform(chosen_rng, images_BxHxWxC.shape[:1]) < p
  weights_B = jnp.where(chosen_B, ratio, 1.0).astype(jnp.float32)

  def mixed(x):
    w = weights_B.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)
    return w * x + (1 - w) * jnp.roll(x, 1, axis=0)

  return (mixed(images_BxHxWxC),
          None if labels_BxK is None else mixed(labels_BxK), weights_B)
