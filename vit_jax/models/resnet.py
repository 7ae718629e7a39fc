"""ResNet stem of the hybrid models: weight-standardised convs and GroupNorm.

Names follow the released hybrid checkpoints (`conv_root`, `gn_root`,
`block{n}/unit{m}/{conv1,gn1,...,conv_proj,gn_proj}`), created directly in the
calling module's scope so that they sit at the top of the parameter tree.
"""

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.models.variants import ResNetSpec

Dtype = Any


def weight_standardize(w, axis, eps: float):
  """(w - mean) / (std + eps) per output channel, in fp32.

  Exactly the released code's form: eps is added to the standard deviation
  (biased, over the kernel's other axes), not to the variance. The two
  differ by about 5% at the std of trained kernels (about 0.01).
  """
  w32 = w.astype(jnp.float32)
  w32 = w32 - jnp.mean(w32, axis=axis, keepdims=True)
  w32 = w32 / (jnp.std(w32, axis=axis, keepdims=True) + eps)
  return w32.astype(w.dtype)


class StdConv(nn.Conv):
  """Conv whose kernel is standardised each call (parameter stays raw)."""

  def param(self, name, *args, **kwargs):
    value = super().param(name, *args, **kwargs)
    if name == "kernel":
      value = weight_standardize(value, axis=(0, 1, 2), eps=1e-5)
    return value


class ResidualUnit(nn.Module):
  """Bottleneck unit: 1x1 -> 3x3 (strided) -> 1x1 (4x wider), GN after each."""
  features: int
  strides: tuple[int, int] = (1, 1)
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(StdConv, use_bias=False, dtype=self.dtype,
                             param_dtype=self.param_dtype)
    norm = functools.partial(nn.GroupNorm, dtype=self.dtype,
                             param_dtype=self.param_dtype)

    residual = x
    if x.shape[-1] != 4 * self.features or self.strides != (1, 1):
      residual = conv(4 * self.features, (1, 1), self.strides,
                      name="conv_proj")(x)
      residual = norm(name="gn_proj")(residual)

    y = nn.relu(norm(name="gn1")(conv(self.features, (1, 1), name="conv1")(x)))
    y = conv(self.features, (3, 3), self.strides, name="conv2")(y)
    y = nn.relu(norm(name="gn2")(y))
    y = conv(4 * self.features, (1, 1), name="conv3")(y)
    # Zero-init last scale: every unit starts as the identity on its residual.
    y = norm(name="gn3", scale_init=nn.initializers.zeros)(y)
    return nn.relu(residual + y)


class ResNetStage(nn.Module):
  """`num_units` residual units; the first one strides and projects."""
  num_units: int
  features: int
  first_stride: tuple[int, int]
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    for i in range(self.num_units):
      x = ResidualUnit(self.features, self.first_stride if i == 0 else (1, 1),
                       dtype=self.dtype, param_dtype=self.param_dtype,
                       name=f"unit{i + 1}")(x)
    return x


def resnet_stem(x, spec: ResNetSpec, dtype: Dtype, param_dtype: Dtype):
  """Runs the stem; call inside a compact method so names land in its scope."""
  width = int(64 * spec.width_factor)
  x = StdConv(width, (7, 7), (2, 2), use_bias=False, dtype=dtype,
              param_dtype=param_dtype, name="conv_root")(x)
  x = nn.relu(
      nn.GroupNorm(dtype=dtype, param_dtype=param_dtype, name="gn_root")(x))
  x = nn.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding="SAME")
  for stage, num_units in enumerate(spec.num_layers):
    x = ResNetStage(num_units, width * 2**stage, (1, 1) if stage == 0 else
                    (2, 2), dtype=dtype, param_dtype=param_dtype,
                    name=f"block{stage + 1}")(x)
  return x
