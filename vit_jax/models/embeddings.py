"""The patch and position embeddings of a ViT, in their four forms.

Learned position embeddings, one per token (the paper's); fixed 2D sin-cos
ones (big_vision's `sincos2d`, MoCo v3's formula); NaViT's factorized ones
(a table per axis); and FlexiViT's: a patch
embedding stored for one patch size and run at another (its kernel
PI-resized in every step, `patch_resize.py`), with learned position
embeddings stored for one grid and bilinearly resized to the grid it runs
at. The plain patch embedding is `nn.Conv` in `vit.VisionTransformer`.
"""

import math
from typing import Any
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import patch_resize
from vit_jax.models import sequences

Dtype = Any


class AddPositionEmbs(nn.Module):
  """Learned 1D position embeddings, one per token (class token included),
  or one per token after the first `skip` (timm's `no_embed_class`: the
  class token and registers get none).

  With `grids` ((stored H, W), (run H, W)), FlexiViT's: the table is stored
  for the first grid and, where the tokens form the second, its grid part
  is bilinearly resized to it on the fly (as FlexiViT does; the tokens
  before the grid keep theirs).

  With `positions` (coords B x N' x 2, grids B x N' x 2 of the last N'
  tokens, a patch sequence's): the grid part, stored square, is resized to
  each token's image grid (`interpolation`, antialiased) and read at its
  (row, column) (`sequences.learned_at`). An image of another grid than
  the stored table's is read so too: a square image computes what the
  patch-sequence path computes (timm's NaFlexViT does the same).
  """
  param_dtype: Dtype = jnp.float32
  grids: Optional[tuple] = None
  skip: int = 0
  interpolation: str = "bilinear"  # One of sequences.INTERPOLATIONS.
  init: str = "normal"  # The table's first values (ModelForm.posemb_init).

  @nn.compact
  def __call__(self, x_BxNxD, positions=None, grid_hw=None):
    """`positions`: a patch sequence's (coords, grids); `grid_hw`: the
    image's grid, where the table was stored for another (a table of a
    model trained on images at their own shape, or at another resolution:
    read at the image's rows and columns as a patch sequence would be)."""
    skipped, x_BxNxD = x_BxNxD[:, :self.skip], x_BxNxD[:, self.skip:]
    if positions is None and self._stored_for_another(x_BxNxD, grid_hw):
      positions = (sequences.grid_coords(*grid_hw), jnp.asarray(grid_hw)[None,
                                                                         None])
    if positions is not None:
      posemb = self._at_positions(x_BxNxD, *positions)
    elif self.grids is None:
      posemb = self.param("pos_embedding", self._initializer(grid_hw),
                          (1,) + x_BxNxD.shape[1:], self.param_dtype)
    else:
      (stored_h, stored_w), (run_h, run_w) = self.grids
      prefix = x_BxNxD.shape[1] - run_h * run_w
      posemb = self.param("pos_embedding",
                          self._initializer((stored_h, stored_w)),
                          (1, prefix + stored_h * stored_w, x_BxNxD.shape[-1]),
                          self.param_dtype)
      posemb = posemb_at_grid(posemb, *self.grids)
    x_BxNxD = x_BxNxD + posemb.astype(x_BxNxD.dtype)
    if not self.skip:
      return x_BxNxD
    return jnp.concatenate([skipped, x_BxNxD], axis=1)

  def _initializer(self, grid_hw):
    if self.init == "normal":
      return nn.initializers.normal(stddev=0.02)

    def sincos(key, shape, dtype):  # MAE's table; the prefix tokens' zero.
      del key
      _, tokens, width = shape
      table = mae_sincos_table(*grid_hw, width)
      prefix = np.zeros((tokens - len(table), width), np.float32)
      return jnp.asarray(np.concatenate([prefix, table])[None], dtype)

    return sincos

  def _stored_for_another(self, x_BxNxD, grid_hw) -> bool:
    """Whether the stored table has another token count than the image's
    (FlexiViT's `grids` say their own)."""
    return (grid_hw is not None and self.grids is None and
            self.has_variable("params", "pos_embedding") and self.get_variable(
                "params", "pos_embedding").shape[1] != x_BxNxD.shape[1])

  def _at_positions(self, x_BxNxD, coords_BxNx2, grids_BxNx2):
    table = _stored(self, "pos_embedding")
    prefix = x_BxNxD.shape[1] - coords_BxNx2.shape[1]
    side = math.isqrt(table.shape[1] - prefix)
    if side * side != table.shape[1] - prefix:
      raise ValueError(f"Patch sequences read a square table of position "
                       f"embeddings; this one has {table.shape[1] - prefix}.")
    grid = table[0, prefix:].reshape(side, side, -1)
    at_patches = sequences.learned_at(grid, coords_BxNx2, grids_BxNx2,
                                      self.interpolation)
    return jnp.concatenate([
        jnp.broadcast_to(table[:, :prefix],
                         (x_BxNxD.shape[0], prefix, table.shape[-1])),
        at_patches.astype(table.dtype)
    ], axis=1)


class FactorizedPositionEmbs(nn.Module):
  """NaViT's factorized position embeddings (timm's `factorized`): a table
  of rows and one of columns, each resized linearly to the grid the
  patches form (no antialiasing) and summed. The tokens before the grid
  (class token, registers) get none."""
  param_dtype: Dtype = jnp.float32
  prefix: int = 0

  @nn.compact
  def __call__(self, x_BxNxD, grid_hw=None, positions=None):
    """`grid_hw`: the image path's grid (the stored size at init);
    `positions`: a patch sequence's (coords, grids) per patch."""
    width = x_BxNxD.shape[-1]
    if positions is None:
      rows, cols = np.divmod(np.arange(grid_hw[0] * grid_hw[1]), grid_hw[1])
      coords = jnp.asarray(np.stack([rows, cols], -1))[None]
      positions = (coords, jnp.asarray(grid_hw)[None, None])
    if grid_hw is None or self.has_variable("params", "pos_embedding_y"):
      # A sequence, or an image of any grid, reads the stored tables.
      rows, cols = (
          _stored(self, n) for n in ("pos_embedding_y", "pos_embedding_x"))
    else:
      init = nn.initializers.normal(stddev=0.02)
      rows = self.param("pos_embedding_y", init, (1, grid_hw[0], width),
                        self.param_dtype)
      cols = self.param("pos_embedding_x", init, (1, grid_hw[1], width),
                        self.param_dtype)
    coords, grids = positions
    grids = jnp.broadcast_to(grids, coords.shape)
    posemb = sequences.factorized_at(rows[0], cols[0], coords, grids)
    prefix, patches = x_BxNxD[:, :self.prefix], x_BxNxD[:, self.prefix:]
    return jnp.concatenate([prefix, patches + posemb.astype(patches.dtype)],
                           axis=1)


def _stored(module: nn.Module, name: str):
  """A parameter a sequence reads at the shape an image gave it (its shape
  is the stored grid's, not the sequence's)."""
  if not module.has_variable("params", name):
    raise ValueError("Initialise a ViT from a square image "
                     "(models.init_on_zeros); patch sequences read its "
                     "position embeddings.")
  return module.get_variable("params", name)


class PatchEmbedding(nn.Module):
  """FlexiViT's patch embedding: the kernel is stored for `patch_size`
  patches and PI-resized (`patch_resize.pi_matrix`, a constant) to
  `run_patch_size` in every step; parameters as `nn.Conv`'s."""
  features: int
  patch_size: int
  run_patch_size: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images_BxHxWxC):
    stored, run = self.patch_size, self.run_patch_size
    channels = images_BxHxWxC.shape[-1]
    kernel = self.param("kernel", nn.initializers.lecun_normal(),
                        (stored, stored, channels, self.features),
                        self.param_dtype)
    bias = self.param("bias", nn.initializers.zeros, (self.features,),
                      self.param_dtype)
    y = jax.lax.conv_general_dilated(
        images_BxHxWxC.astype(self.dtype),
        kernel_at_patch_size(kernel, run).astype(self.dtype), (run, run),
        "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + bias.astype(self.dtype)


def kernel_at_patch_size(kernel_PxPxCxD, run: int):
  """A patch-embedding kernel stored for P x P patches, PI-resized to
  run x run (float32, as in the step; exports bake it in)."""
  stored, _, channels, features = kernel_PxPxCxD.shape
  matrix = patch_resize.pi_matrix((stored, stored), (run, run))
  kernel = jnp.einsum("rp,pcd->rcd", jnp.asarray(matrix, jnp.float32),
                      kernel_PxPxCxD.reshape(stored * stored, channels, -1))
  return kernel.reshape(run, run, channels, features)


def posemb_at_grid(posemb_1xNxD, stored_hw, run_hw):
  """Learned position embeddings stored for one grid, bilinearly resized to
  another (FlexiViT's jax.image.resize); the tokens before the grid keep
  theirs."""
  (stored_h, stored_w), (run_h, run_w) = stored_hw, run_hw
  if (stored_h, stored_w) == (run_h, run_w):
    return posemb_1xNxD
  width = posemb_1xNxD.shape[-1]
  prefix = posemb_1xNxD.shape[1] - stored_h * stored_w
  grid = posemb_1xNxD[0, prefix:].reshape(stored_h, stored_w, width)
  grid = jax.image.resize(grid, (run_h, run_w, width), "bilinear")
  return jnp.concatenate(
      [posemb_1xNxD[:, :prefix],
       grid.reshape(1, run_h * run_w, width)], axis=1)


def mae_sincos_table(grid_h: int, grid_w: int, width: int) -> np.ndarray:
  """(H*W) x D, MAE's fixed 2D sin-cos embeddings (its `pos_embed.py`): a
  quarter of the channels each sin(x w_k), cos(x w_k), sin(y w_k),
  cos(y w_k), w_k = 10000^(-k / (D/4)), x the column and y the row. (The
  ViT's `sincos2d` is big_vision's, with D/4 - 1 in that exponent.)"""
  quarter = width // 4
  omega = 1.0 / 10_000.0**(np.arange(quarter, dtype=np.float64) / quarter)
  rows, cols = np.divmod(np.arange(grid_h * grid_w), grid_w)
  x, y = cols[:, None] * omega, rows[:, None] * omega
  return np.concatenate([np.sin(x), np.cos(x),
                         np.sin(y), np.cos(y)], axis=1).astype(np.float32)


def posemb_sincos2d(grid_h: int, grid_w: int, width: int,
                    temperature: float = 10_000.0):
  """1 x (H*W) x D fixed position embeddings, tokens in row-major order.

  A quarter of the channels each: sin(x w_k), cos(x w_k), sin(y w_k),
  cos(y w_k), with x the column and y the row of the token and
  w_k = temperature^(-k / (D/4 - 1)), k = 0 .. D/4 - 1.
  """
  if width % 4:  # models.check_model_config says so before tracing.
    raise ValueError(f"sincos2d position embeddings need a width divisible "
                     f"by 4, not {width}.")
  return sequences.sincos2d_at(sequences.grid_coords(grid_h, grid_w), width,
                               temperature)
