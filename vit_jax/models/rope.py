"""Rotary position embeddings (RoPE) in 2D: each head's queries and keys of
the patch tokens are rotated by angles read from the patch's (row, column),
so attention logits depend on where two patches are relative to each other,
and nothing is stored but (in the mixed form) the frequencies: a model reads
the same weights at any resolution or aspect ratio. The class token and
registers are not rotated. With K the head width:

  positions  per axis, from the patch's index c in a grid of n:
             dinov3  2 (c + 0.5) / n - 1 (its centre, scaled into [-1, 1])
             axial, mixed  c + offset, times r / n where a reference grid
                     r is set (EVA's resize: the grid read as r patches)
             in row, column order, or column, row (`rope_axes`)
  angles     dinov3  2 pi p / T_k, T_k = base^(4k / K), k < K/4
             axial   p / T_k (timm's RotaryEmbeddingCat; EVA-02, PE,
                     RoPE-ViT)
             each axis K/4 angles, the first axis's first: K/2 per head
             mixed   p_0 f_0 + p_1 f_1 per head: K/2 frequencies learned
                     per block and head (RoPE-ViT's RoPE-Mixed)
  layout     half: angle j turns channels j and j + K/2 together;
             interleaved: channels 2j and 2j + 1

In training, DINOv3's augmentations may move the positions (`augmented`:
shift, per-axis jitter, rescale), one draw for the whole batch in every
block as DINOv3's own code draws them (`rope_augment_per=block`; its
RopePositionEmbedding runs once per block), once for every block (batch:
timm's and transformers' ports), or one per image (image).

Images give every patch its grid; patch sequences (NaFlex, packing) give
each patch its own image's grid, so both read the same angles for the
same image.
"""

import jax
import jax.numpy as jnp
import numpy as np


def _check(head_dim: int):
  if head_dim % 4:
    raise ValueError(f"RoPE in 2D needs a head width divisible by 4, not "
                     f"{head_dim}.")


def positions(form, coords_BxNx2, grids_BxNx2):
  """Each patch's position (B x N x 2, float32) in RoPE form `form`'s
  units and axis order (a ModelForm's rope fields)."""
  coords = coords_BxNx2.astype(jnp.float32)
  grids = grids_BxNx2.astype(jnp.float32)
  if form.rope == "dinov3":  # As float32 as DINOv3: centre / size, scaled.
    p = 2.0 * ((coords + 0.5) / grids) - 1.0
  else:
    p = coords + jnp.float32(form.rope_grid_offset)
    if form.rope_reference_grid:
      p = p / grids * jnp.float32(form.rope_reference_grid)
  return p[..., ::-1] if form.rope_axes == "column_row" else p


def augmented(form, positions_BxNx2, rng):
  """DINOv3's training-time augmentations of RoPE's positions: a shift of
  up to +-rope_shift per axis, then a factor in [1/J, J] per axis
  (rope_jitter) and one in [1/R, R] for both (rope_rescale), log-uniform,
  in that order; one draw for every image, or with rope_augment_per=image
  one per image (row of `positions_BxNx2`, a packed sequence's images
  sharing it). A function of `rng` alone: any mesh draws the same."""
  rows = positions_BxNx2.shape[0] if form.rope_augment_per == "image" else 1
  shift_key, jitter_key, rescale_key = jax.random.split(rng, 3)
  p = positions_BxNx2
  if form.rope_shift:
    p = p + jax.random.uniform(shift_key, (rows, 1, 2), jnp.float32,
                               -form.rope_shift, form.rope_shift)
  for key, factor, axes in ((jitter_key, form.rope_jitter, 2),
                            (rescale_key, form.rope_rescale, 1)):
    if factor != 1:
      log = float(np.log(factor))
      p = p * jnp.exp(
          jax.random.uniform(key, (rows, 1, axes), jnp.float32, -log, log))
  return p


def augments(form) -> bool:
  return bool(form.rope_shift or form.rope_jitter != 1 or
              form.rope_rescale != 1)


def drawn_per_block(form, train: bool) -> bool:
  """Whether each block moves the positions itself (a draw of its own)."""
  return train and augments(form) and form.rope_augment_per == "block"


def _layout(angles, layout: str):
  """K/2 angles per head -> K channels in `layout`."""
  if layout == "half":
    return jnp.concatenate([angles, angles], axis=-1)
  return jnp.repeat(angles, 2, axis=-1)


def sin_cos(form, p_BxNx2, head_dim: int):
  """(sin, cos), each B x N x K in float32, of the fixed forms (dinov3,
  axial) at the patches' `positions`."""
  _check(head_dim)
  p = p_BxNx2
  exponents = 4.0 * jnp.arange(head_dim // 4, dtype=jnp.float32) / head_dim
  periods = jnp.float32(form.rope_temperature)**exponents
  scale = 2 * jnp.pi if form.rope == "dinov3" else 1.0
  angles = scale * p[..., None] / periods  # B x N x 2 x K/4
  angles = _layout(angles.reshape(*angles.shape[:-2], head_dim // 2),
                   form.rope_layout)
  return jnp.sin(angles), jnp.cos(angles)


def mixed_sin_cos(positions_BxNx2, frequencies_2xHxK2, layout: str):
  """(sin, cos), each B x N x H x K in float32, of RoPE-Mixed: per head,
  the angles p_0 f_0 + p_1 f_1 of learned frequencies."""
  f = frequencies_2xHxK2.astype(jnp.float32)
  angles = jnp.einsum("bna,ahk->bnhk", positions_BxNx2, f,
                      precision=jax.lax.Precision.HIGHEST)
  angles = _layout(angles, layout)
  return jnp.sin(angles), jnp.cos(angles)


def init_mixed_frequencies(temperature: float):
  """RoPE-Mixed's initial frequencies (2 x H x K/2): the axial form's
  magnitudes base^(-4k/K), turned per head by a random angle theta, as
  (cos theta, cos(theta + pi/2)) on the first axis and the sines on the
  second, so each head starts looking along its own direction."""

  def init(key, shape, dtype=jnp.float32):
    _, heads, half = shape
    magnitudes = temperature**(-4.0 * np.arange(half // 2) / (2 * half))
    theta = jax.random.uniform(key, (heads, 1), jnp.float32) * 2 * jnp.pi
    first = jnp.concatenate(
        [magnitudes * jnp.cos(theta), magnitudes * jnp.cos(theta + jnp.pi / 2)],
        axis=-1)
    second = jnp.concatenate(
        [magnitudes * jnp.sin(theta), magnitudes * jnp.sin(theta + jnp.pi / 2)],
        axis=-1)
    return jnp.stack([first, second]).astype(dtype)

  return init


def _turned(x, layout: str):
  """The rotation's partner of each channel, negated where it leads."""
  if layout == "half":
    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-second, first], axis=-1)
  pairs = x.reshape(*x.shape[:-1], -1, 2)
  return jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)


def rotate(x_BxNxHxK, sin, cos, prefix: int, layout: str = "half"):
  """The tokens after the first `prefix` rotated, in float32 at least, and
  returned in x's dtype; `sin`, `cos`: B x N x K (every head alike) or
  B x N x H x K."""
  head, patches = x_BxNxHxK[:, :prefix], x_BxNxHxK[:, prefix:]
  if sin.ndim == 3:
    sin, cos = sin[:, :, None], cos[:, :, None]
  p = patches.astype(jnp.promote_types(patches.dtype, jnp.float32))
  p = p * cos + _turned(p, layout) * sin
  return jnp.concatenate([head, p.astype(x_BxNxHxK.dtype)], axis=1)
