"""Model FLOPs: multiply-adds of a forward pass, counted from the jaxpr.

Only matmuls and convolutions count (what the paper's compute figures
count); a training step is 6 x forward multiply-adds per image (forward and
backward, 2 FLOPs per multiply-add).
"""

import math

import jax
import jax.extend as jex
import jax.numpy as jnp

from vit_jax import models


def forward_macs(model, image_size: int, **apply_kwargs) -> int:
  """Multiply-adds of one image's forward pass: its matmuls and convolutions
  (`apply_kwargs`: how the model is called, e.g. MAE's masking)."""
  params = models.param_shapes(model, image_size)
  images = jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32)
  forward = lambda p, x: model.apply({"params": p}, x, **apply_kwargs)
  closed = jax.make_jaxpr(forward)(params, images)
  return _count_macs(closed.jaxpr)


def _count_macs(jaxpr) -> int:
  total = 0
  for eqn in jaxpr.eqns:
    out_size = math.prod(eqn.outvars[0].aval.shape) if eqn.outvars else 0
    if eqn.primitive.name == "dot_general":
      (lhs_contract, _), _ = eqn.params["dimension_numbers"]
      lhs_shape = eqn.invars[0].aval.shape
      total += out_size * math.prod(lhs_shape[d] for d in lhs_contract)
    elif eqn.primitive.name == "conv_general_dilated":
      kernel = eqn.invars[1].aval.shape
      rhs_spec = eqn.params["dimension_numbers"].rhs_spec  # (out, in, *space)
      total += out_size * math.prod(kernel[d] for d in rhs_spec[1:])
    repeat = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(sub, jex.core.ClosedJaxpr):
          total += repeat * _count_macs(sub.jaxpr)
        elif isinstance(sub, jex.core.Jaxpr):
          total += repeat * _count_macs(sub)
  return total
