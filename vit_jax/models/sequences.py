"""Images at their own shape: a ViT over a sequence of patches.

NaFlex (SigLIP 2, timm's NaFlexViT) cuts each image, resized with its
aspect ratio kept, into as many patches as a length budget allows and pads
the sequence to that length; NaViT ("Patch n' Pack") puts several images
into one sequence. Both reach the model as a `PatchSequence`:

  patches   B x N x (P*P*C)  pixels of each patch in (row, column, channel)
                             order, the order a conv kernel (P, P, C, D)
                             reshaped to (P*P*C, D) reads them in
  coords    B x N x 2        each patch's (row, column) in its image's grid
  segments  B x N            0 for padding, k for the k-th image (1-based)
  grids     B x K x 2        each image's grid (rows, columns); K, the most
                             images a sequence holds, is static

What changes in the model, all here: the position embedding of each patch
is its image's table resized to that image's grid and read at the patch's
(row, column); attention is masked to the tokens of one image (padding
attends to padding, so no row of the softmax is empty); pooling is per
image. A square image as a one-image sequence gives what the image path
gives (tests/test_sequences.py).

Resizing a learned table: half-pixel centres with an antialiasing kernel
widened when shrinking, the weights renormalised over the taps inside the
table (jax.image.scale_and_translate's definition). With a triangle kernel
it is big_vision's NaFlex (bilinear); with Keys' cubic (a = -0.5) it is
timm's (PyTorch's antialiased bicubic); the form a checkpoint was trained
with is `VisionTransformer.posemb_interpolation`. timm's factorized tables
(one per axis) are resized linearly without antialiasing, as timm does.
"""

from collections.abc import Mapping
from typing import Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.config import model_form

# How a learned table is resized to an image's grid (the form's choices).
INTERPOLATIONS = model_form.choices("posemb_interpolation")
FIELDS = ("patches", "coords", "segments", "grids")


@flax.struct.dataclass
class PatchSequence:
  """A batch of patch sequences (see the module's docstring)."""
  patches: jax.Array
  coords: jax.Array
  segments: jax.Array
  grids: jax.Array

  @property
  def images_per_sequence(self) -> int:
    return self.grids.shape[1]

  @property
  def length(self) -> int:
    return self.patches.shape[1]


def as_sequence(inputs) -> Optional[PatchSequence]:
  """`inputs` as a PatchSequence (a batch's dict of its fields too); None
  for images."""
  if isinstance(inputs, PatchSequence):
    return inputs
  if isinstance(inputs, Mapping):
    return PatchSequence(**{f: inputs[f] for f in FIELDS})
  return None


def from_images(images_BxHxWxC, patch: int,
                length: Optional[int] = None) -> PatchSequence:
  """Each image (all of one size) as a one-image sequence, row by row,
  padded to `length` patches (None: no padding)."""
  images_BxHxWxC = jnp.asarray(images_BxHxWxC)
  batch, height, width, channels = images_BxHxWxC.shape
  rows, cols = height // patch, width // patch
  x = images_BxHxWxC[:, :rows * patch, :cols * patch].reshape(
      batch, rows, patch, cols, patch, channels)
  patches = x.transpose(0, 1, 3, 2, 4, 5).reshape(batch, rows * cols, -1)
  row, col = np.divmod(np.arange(rows * cols), cols)
  coords = np.broadcast_to(np.stack([row, col], -1), (batch, rows * cols, 2))
  segments = np.ones((batch, rows * cols), np.int32)
  pad = (length or rows * cols) - rows * cols
  if pad < 0:
    raise ValueError(f"{rows * cols} patches do not fit in {length}.")
  return PatchSequence(
      patches=jnp.pad(patches, ((0, 0), (0, pad), (0, 0))), coords=jnp.asarray(
          np.pad(coords,
                 ((0, 0), (0, pad), (0, 0))), jnp.int32), segments=jnp.asarray(
                     np.pad(segments, ((0, 0), (0, pad)))), grids=jnp.full(
                         (batch, 1, 2), jnp.array([rows, cols]), jnp.int32))


def grid_coords(grid_h: int, grid_w: int):
  """1 x (H*W) x 2: the (row, column) of each patch of a grid, row-major."""
  rows, cols = jnp.divmod(jnp.arange(grid_h * grid_w), grid_w)
  return jnp.stack([rows, cols], axis=-1)[None]


def token_grids(seq: PatchSequence):
  """B x N x 2: the grid of the image each token belongs to (padding: its
  sequence's first image's, which nothing reads)."""
  slot = jnp.maximum(seq.segments - 1, 0)
  return jnp.take_along_axis(seq.grids, slot[..., None], axis=1)


def attention_mask(segments_BxN):
  """B x 1 x N x N: a token attends to the tokens of its own image;
  padding to padding (no softmax row is empty, so none is NaN)."""
  return (segments_BxN[:, None, :, None] == segments_BxN[:, None, None, :])


def pooling_mask(segments_BxN, images: int):
  """B x K x N: which tokens each image's pooling reads."""
  slots = jnp.arange(1, images + 1)
  return segments_BxN[:, None, :] == slots[None, :, None]


def masked_mean(x_BxNxD, mask_BxKxN):
  """B x K x D: the mean of each image's tokens (zeros for an empty slot)."""
  weights = mask_BxKxN.astype(jnp.float32)
  total = jnp.einsum("bkn,bnd->bkd", weights, x_BxNxD.astype(jnp.float32))
  count = jnp.maximum(weights.sum(-1, keepdims=True), 1.0)
  return (total / count).astype(x_BxNxD.dtype)


def _triangle(t):
  return jnp.maximum(0.0, 1.0 - t)


def _keys_cubic(t):  # a = -0.5, as PIL, jax.image and PyTorch's antialias.
  inner = ((1.5 * t - 2.5) * t) * t + 1.0
  outer = ((-0.5 * t + 2.5) * t - 4.0) * t + 2.0
  return jnp.where(t < 1.0, inner, jnp.where(t < 2.0, outer, 0.0))


def axis_weights(position, run_size, stored: int, method: str, antialias: bool):
  """(..., stored) weights reading position `position` of an axis resized
  from `stored` entries to `run_size` (traced; per token)."""
  position = position.astype(jnp.float32)
  run_size = jnp.maximum(run_size.astype(jnp.float32), 1.0)
  ratio = stored / run_size
  source = (position + 0.5) * ratio - 0.5
  widen = jnp.maximum(ratio, 1.0) if antialias else jnp.ones_like(ratio)
  taps = jnp.arange(stored, dtype=jnp.float32)
  distance = jnp.abs(source[..., None] - taps) / widen[..., None]
  kernel = _triangle if method == "bilinear" else _keys_cubic
  weights = kernel(distance)
  total = weights.sum(-1, keepdims=True)  # 0 only off the grid (padding).
  return jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 0.0)


def learned_at(table_HxWxD, coords_BxNx2, grids_BxNx2, method: str):
  """B x N x D: a learned table resized to each token's image grid
  (antialiased) and read at the token's (row, column)."""
  stored_h, stored_w, _ = table_HxWxD.shape
  rows = axis_weights(coords_BxNx2[..., 0], grids_BxNx2[..., 0], stored_h,
                      method, antialias=True)
  cols = axis_weights(coords_BxNx2[..., 1], grids_BxNx2[..., 1], stored_w,
                      method, antialias=True)
  table = table_HxWxD.astype(jnp.float32)
  return jnp.einsum("bnh,bnw,hwd->bnd", rows, cols, table)


def factorized_at(rows_HxD, cols_WxD, coords_BxNx2, grids_BxNx2):
  """B x N x D: one table per axis, each resized linearly to the token's
  image grid (no antialiasing, as timm), read and summed."""
  rows = axis_weights(coords_BxNx2[..., 0], grids_BxNx2[..., 0],
                      rows_HxD.shape[0], "bilinear", antialias=False)
  cols = axis_weights(coords_BxNx2[..., 1], grids_BxNx2[..., 1],
                      cols_WxD.shape[0], "bilinear", antialias=False)
  return (jnp.einsum("bnh,hd->bnd", rows, rows_HxD.astype(jnp.float32)) +
          jnp.einsum("bnw,wd->bnd", cols, cols_WxD.astype(jnp.float32)))


def sincos2d_at(coords_BxNx2, width: int, temperature: float = 10_000.0):
  """B x N x D fixed position embeddings at each token's (y, x): a quarter
  of the channels each sin(x w_k), cos(x w_k), sin(y w_k), cos(y w_k), with
  w_k = temperature^(-k / (D/4 - 1)), k = 0 .. D/4 - 1 (MoCo v3's)."""
  quarter = width // 4
  omega = 1.0 / temperature**(jnp.arange(quarter) / max(quarter - 1, 1))
  y = coords_BxNx2[..., 0:1] * omega
  x = coords_BxNx2[..., 1:2] * omega
  return jnp.concatenate(
      [jnp.sin(x), jnp.cos(x), jnp.sin(y),
       jnp.cos(y)], axis=-1).astype(jnp.float32)
