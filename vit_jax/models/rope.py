"""Rotary position embeddings (RoPE) in 2D: each head's queries and keys of
the patch tokens are rotated by angles read from the patch's (row, column),
so attention logits depend on where two patches are relative to each other,
and nothing is stored: a model reads the same weights at any resolution or
aspect ratio. The class token and registers are not rotated.

DINOv3's form (`rope="dinov3"`; Siméoni et al. 2025), as its code and
timm's port compute it:

  position  p = 2 (c + 0.5) / n - 1, per axis: the patch's centre in its
            grid of n rows (or columns), scaled into [-1, 1]
  periods   T_k = base^(4k / K), k = 0 .. K/4 - 1, K the head width
            (base: `rope_temperature`, DINOv3's 100)
  angles    2 pi p / T_k: K/4 for the row, then K/4 for the column
  layout    "half": angle j turns channels j and j + K/2 together,
            x' = x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]

Images give every patch its grid; patch sequences (NaFlex, packing) give
each patch its own image's grid, so both read the same angles for the
same image.
"""

import jax.numpy as jnp


def dinov3_sin_cos(coords_BxNx2, grids_BxNx2, head_dim: int,
                   temperature: float):
  """(sin, cos), each B x N x K in float32: the angles of each patch at
  (row, column) `coords` in a grid of `grids` (rows, columns)."""
  if head_dim % 4:
    raise ValueError(f"RoPE in 2D needs a head width divisible by 4, not "
                     f"{head_dim}.")
  quarter = head_dim // 4
  exponents = 2.0 * jnp.arange(quarter, dtype=jnp.float32) / (head_dim // 2)
  periods = jnp.float32(temperature)**exponents
  # As float32 as DINOv3 computes them: centre / size, then to [-1, 1].
  centred = (coords_BxNx2.astype(jnp.float32) + 0.5) / grids_BxNx2.astype(
      jnp.float32)
  position = 2.0 * centred - 1.0
  angles = 2 * jnp.pi * position[..., None] / periods  # B x N x 2 x K/4
  angles = angles.reshape(*angles.shape[:-2], head_dim // 2)
  angles = jnp.concatenate([angles, angles], axis=-1)  # The half layout.
  return jnp.sin(angles), jnp.cos(angles)


def sin_cos(form: str, coords_BxNx2, grids_BxNx2, head_dim: int,
            temperature: float):
  """The (sin, cos) tables of RoPE form `form` (config.model.rope's
  choices; the config's checks refuse others)."""
  if form == "dinov3":
    return dinov3_sin_cos(coords_BxNx2, grids_BxNx2, head_dim, temperature)
  raise ValueError(f"Unknown RoPE form {form!r}.")


def rotate(x_BxNxHxK, sin_BxNxK, cos_BxNxK, prefix: int):
  """The tokens after the first `prefix` rotated (half layout), in float32
  at least, and returned in x's dtype."""
  head, patches = x_BxNxHxK[:, :prefix], x_BxNxHxK[:, prefix:]
  p = patches.astype(jnp.promote_types(patches.dtype, jnp.float32))
  first, second = jnp.split(p, 2, axis=-1)
  turned = jnp.concatenate([-second, first], axis=-1)
  p = p * cos_BxNxK[:, :, None] + turned * sin_BxNxK[:, :, None]
  return jnp.concatenate([head, p.astype(x_BxNxHxK.dtype)], axis=1)
