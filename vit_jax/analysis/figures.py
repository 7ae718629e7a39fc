"""The paper's figures of what a ViT learnt, drawn from `analysis.run`.

Matplotlib figures made without pyplot (PNG files through its Agg canvas:
no display, no global backend or figure registry). Each function
writes one PNG: the patch-embedding filters' principal components (the
paper's Fig. 7 left), the position-embedding similarities (Fig. 7 centre),
the mean attention distance per head against depth (Fig. 7 right), the
attention rollout over input images (Fig. 6), and MAE's reconstructions.
"""

import io

import matplotlib
from matplotlib import figure
import numpy as np
import scipy.ndimage

from vit_jax import paths

_DPI = 100


def _save(fig, path: str):
  """Through the path layer, so `path` may be on object storage."""
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=_DPI, bbox_inches="tight")
  paths.resolve(path).write_bytes(buffer.getvalue())


def _unit(x: np.ndarray) -> np.ndarray:
  """Min-max scaled to [0, 1] (a flat array becomes 0.5)."""
  low, high = float(np.min(x)), float(np.max(x))
  return np.full_like(x, 0.5) if high <= low else (x - low) / (high - low)


def embedding_filters(components_KxPxPxC, variance_ratio, layer: str, path: str,
                      columns: int = 7):
  """RGB tiles of the principal components, each scaled to [0, 1]."""
  k = len(components_KxPxPxC)
  rows = -(-k // columns)
  fig = figure.Figure(figsize=(1.1 * columns, 1.2 * rows))
  axes = fig.subplots(rows, columns, squeeze=False)
  for i, ax in enumerate(axes.ravel()):
    ax.axis("off")
    if i < k:
      tile = components_KxPxPxC[i]
      ax.imshow(_unit(tile if tile.shape[-1] == 3 else tile[..., 0]),
                cmap=None if tile.shape[-1] == 3 else "gray",
                interpolation="nearest")
      ax.set_title(f"{100 * variance_ratio[i]:.1f}%", fontsize=7)
  fig.suptitle(
      f"RGB embedding filters ({layer}):\nfirst {k} principal "
      "components, % of variance", fontsize=9)
  _save(fig, path)


def position_similarity(similarity_NxN, grid, path: str):
  """A grid of small grids: tile (r, c) holds the cosine similarity of
  position (r, c)'s embedding with every position's."""
  gh, gw = grid
  mosaic = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan)
  for r in range(gh):
    for c in range(gw):
      tile = similarity_NxN[r * gw + c].reshape(gh, gw)
      mosaic[r * (gh + 1):r * (gh + 1) + gh,
             c * (gw + 1):c * (gw + 1) + gw] = tile
  size = min(2 + 0.35 * max(gh, gw), 9)
  fig = figure.Figure(figsize=(size + 1, size))
  ax = fig.subplots()
  image = ax.imshow(mosaic, cmap="viridis", vmin=-1, vmax=1,
                    interpolation="nearest")
  ax.set_xticks(
      np.arange(gw) * (gw + 1) + (gw - 1) / 2, [str(c + 1) for c in range(gw)],
      fontsize=7)
  ax.set_yticks(
      np.arange(gh) * (gh + 1) + (gh - 1) / 2, [str(r + 1) for r in range(gh)],
      fontsize=7)
  ax.set_xlabel("Input patch column")
  ax.set_ylabel("Input patch row")
  ax.tick_params(length=0)
  for side in ax.spines.values():
    side.set_visible(False)
  fig.colorbar(image, ax=ax, fraction=0.046, label="Cosine similarity")
  ax.set_title("Position embedding similarity")
  _save(fig, path)


def mean_attention_distance(distance_LxH, image_size: int, path: str):
  """One dot per head at each depth, as the paper's Figure 7 (right)."""
  distance_LxH = np.asarray(distance_LxH)
  layers, heads = distance_LxH.shape
  fig = figure.Figure(figsize=(4.5, 3.5))
  ax = fig.subplots()
  colors = matplotlib.colormaps["tab20"](np.linspace(0, 1, max(heads, 2)))
  for h in range(heads):
    ax.scatter(np.arange(1, layers + 1), distance_LxH[:, h], s=14,
               color=colors[h], label=f"Head {h + 1}")
  ax.set_xlabel("Network depth (layer)")
  ax.set_ylabel("Mean attention distance (pixels)")
  ax.set_xlim(0.5, layers + 0.5)
  ax.set_ylim(0, image_size)
  ax.set_xticks(np.arange(1, layers + 1))
  if heads <= 16:
    ax.legend(fontsize=6, ncol=2, loc="lower right", frameon=False)
  ax.set_title(f"{heads} heads, {layers} layers ({image_size} px input)",
               fontsize=9)
  _save(fig, path)


def upsample(map_RxC: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
  """Bilinear, each grid cell's value at the centre of the pixels it
  covers (grid_mode: cells as areas, not points on the corners)."""
  zoom = (shape[0] / map_RxC.shape[0], shape[1] / map_RxC.shape[1])
  return scipy.ndimage.zoom(np.asarray(map_RxC, np.float64), zoom, order=1,
                            grid_mode=True, mode="nearest")


def attention_rollout(shown, names, path: str):
  """One column per input image: the image, the image weighted by its
  upsampled rollout map (the attention from the output token to the input,
  as the paper's Fig. 6), and the map overlaid on the image."""
  columns = len(shown)
  fig = figure.Figure(figsize=(1.7 * columns, 5.4))
  axes = fig.subplots(3, columns, squeeze=False)
  for (image, rollout_map), name, column in zip(shown, names, axes.T):
    image = _unit(np.asarray(image, np.float64))
    mask = _unit(upsample(rollout_map, image.shape[:2]))
    column[0].imshow(image, interpolation="nearest")
    column[1].imshow(image * mask[..., None], interpolation="nearest")
    column[2].imshow(image, interpolation="nearest")
    column[2].imshow(mask, cmap="inferno", alpha=0.6, interpolation="bilinear")
    column[0].set_title(name, fontsize=7)
    for ax in column:
      ax.set_xticks([])
      ax.set_yticks([])
  for ax, label in zip(axes[:, 0], ("Input", "Attention", "Rollout map")):
    ax.set_ylabel(label, fontsize=9)
  _save(fig, path)


def mae_reconstructions(masked, predicted, pasted, originals, names, path: str,
                        normalized: bool):
  """One column per image: the masked input, MAE's prediction of every
  patch, the prediction with the visible patches pasted back, and the
  original (pixels in [-1, 1])."""
  columns = len(originals)
  fig = figure.Figure(figsize=(1.7 * columns, 7.0))
  axes = fig.subplots(4, columns, squeeze=False)
  show = lambda x: np.clip((np.asarray(x, np.float64) + 1.0) / 2.0, 0.0, 1.0)
  for rows, name, column in zip(zip(masked, predicted, pasted, originals),
                                names, axes.T):
    for image, ax in zip(rows, column):
      ax.imshow(show(image), interpolation="nearest")
      ax.set_xticks([])
      ax.set_yticks([])
    column[0].set_title(name, fontsize=7)
  labels = ("Masked", "Prediction", "Visible pasted", "Original")
  for ax, label in zip(axes[:, 0], labels):
    ax.set_ylabel(label, fontsize=9)
  if normalized:
    fig.suptitle(
        "Normalised-pixel target: each predicted patch shown at its "
        "original's mean and variance", fontsize=8)
  _save(fig, path)
