"""A model applied as one compiled program. Applied op by op, a ViT has
XLA compile each of its ~100 operations on its own (about 40 ms each on
CPU), which costs more than the whole forward pass compiled at once."""

import jax
import numpy as np


def logits(model, params, images) -> np.ndarray:
  """`model.apply({"params": params}, images)[0]`, compiled."""
  forward = jax.jit(lambda p, x: model.apply({"params": p}, x)[0])
  return np.asarray(forward(params, images))
