"""Resizing position embeddings to a new token grid (new resolution).

The paper: "we perform 2D interpolation of the pre-trained position
embeddings, according to their location in the original image". The grid
part is interpolated; the prefix tokens (the class token's embedding, when
there is one) are kept as they are. Their number is always passed in, never
inferred from the shape. Interpolation is separable and maps corner to corner
(`scipy.ndimage.zoom(order=1)`'s convention), with a linear (default) or a
cubic (Keys, a=-0.5) kernel. Pure numpy: it runs where TensorFlow does not.
"""

import numpy as np

from vit_jax.config import fields
from vit_jax.errors import UserError

METHODS = ("bilinear", "bicubic")


def check_config(config):
  fields.check_choice(config, "init.posemb_resize", METHODS)


def _keys_cubic(t):
  t = np.abs(t)
  a = -0.5
  return np.where(
      t <= 1, (a + 2) * t**3 - (a + 3) * t**2 + 1,
      np.where(t < 2, a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a, 0.0))


def _interpolation_matrix(size_in: int, size_out: int, method: str):
  """W (size_out x size_in) with out = W @ in, corners aligned."""
  if size_out == 1 or size_in == 1:
    # A single output takes the first input (zoom's convention), and a single
    # input is repeated.
    weights = np.zeros((size_out, size_in))
    weights[:, 0] = 1.0
    return weights
  source = np.arange(size_out) * (size_in - 1) / (size_out - 1)
  taps = np.arange(size_in)
  distance = source[:, None] - taps[None, :]
  if method == "bilinear":
    return np.maximum(0.0, 1.0 - np.abs(distance))
  # Cubic: the sample one step beyond an edge is extrapolated linearly
  # (f(-1) = 2 f(0) - f(1)), so linear ramps are reproduced exactly.
  base = np.minimum(np.floor(source).astype(int), size_in - 2)
  rows = np.arange(size_out)
  weights = np.zeros((size_out, size_in))
  for offset in (-1, 0, 1, 2):
    tap = base + offset
    w = _keys_cubic(source - tap)
    for beyond, edge, inner in ((tap < 0, 0, 1), (tap > size_in - 1,
                                                  size_in - 1, size_in - 2)):
      np.add.at(weights, (rows[beyond], edge), 2 * w[beyond])
      np.add.at(weights, (rows[beyond], inner), -w[beyond])
    inside = (tap >= 0) & (tap <= size_in - 1)
    np.add.at(weights, (rows[inside], tap[inside]), w[inside])
  return weights


def resize_grid(grid_HxWxD: np.ndarray, new_hw, method: str = "bilinear"):
  """Interpolates an (H, W, D) grid of embeddings to (H', W', D)."""
  if method not in METHODS:
    raise UserError(f"Unknown position-embedding resize method {method!r}; "
                    f"use one of {', '.join(METHODS)}.")
  h, w, _ = grid_HxWxD.shape
  rows = _interpolation_matrix(h, new_hw[0], method)
  cols = _interpolation_matrix(w, new_hw[1], method)
  grid = grid_HxWxD.astype(np.float64)
  out = np.einsum("ih,hwd->iwd", rows, grid)
  out = np.einsum("jw,iwd->ijd", cols, out)
  return out.astype(grid_HxWxD.dtype)


def resize_posemb(posemb_1xNxD: np.ndarray, num_prefix_tokens: int, old_grid,
                  new_grid, method: str = "bilinear") -> np.ndarray:
  """(1, prefix + H*W, D) -> (1, prefix + H'*W', D); the same grid: as is."""
  old_grid, new_grid = tuple(old_grid), tuple(new_grid)
  _, length, width = posemb_1xNxD.shape
  if length != num_prefix_tokens + old_grid[0] * old_grid[1]:
    raise UserError(
        f"Position embeddings of {length} tokens are not {num_prefix_tokens} "
        f"prefix token(s) plus a {old_grid[0]}x{old_grid[1]} grid.")
  if old_grid == new_grid:
    return posemb_1xNxD
  prefix = posemb_1xNxD[:, :num_prefix_tokens]
  grid = posemb_1xNxD[0, num_prefix_tokens:].reshape(*old_grid, width)
  grid = resize_grid(grid, new_grid, method).reshape(1, -1, width)
  return np.concatenate([prefix, grid], axis=1)


def resize_as_sequences(posemb_1xNxD: np.ndarray, num_prefix_tokens: int,
                        old_grid, new_grid, method: str) -> np.ndarray:
  """As `resize_posemb`, but as a model trained on images at their own
  shape (NaFlex) reads its table at a grid (`models/sequences.py`:
  half-pixel centres, antialiased where it shrinks, bilinear or bicubic):
  the table it computes with on an image of that grid."""
  from vit_jax.models import sequences  # pylint: disable=g-import-not-at-top
  old_grid, new_grid = tuple(old_grid), tuple(new_grid)
  if old_grid == new_grid:
    return posemb_1xNxD
  width = posemb_1xNxD.shape[-1]
  prefix = posemb_1xNxD[:, :num_prefix_tokens]
  grid = posemb_1xNxD[0, num_prefix_tokens:].reshape(*old_grid, width)
  coords = sequences.grid_coords(*new_grid)
  read = sequences.learned_at(
      grid, coords, np.broadcast_to(np.asarray(new_grid), coords.shape), method)
  return np.concatenate(
      [prefix, np.asarray(read, np.float32).astype(posemb_1xNxD.dtype)], axis=1)


def square_grid(num_grid_tokens: int, what: str):
  """The side of a square grid; released files store square grids."""
  side = int(round(np.sqrt(num_grid_tokens)))
  if side * side != num_grid_tokens:
    raise UserError(
        f"{what} has {num_grid_tokens} grid position embeddings, which is not "
        "a square grid; set config.init.source_grid=(H, W) to say its shape.")
  return (side, side)
