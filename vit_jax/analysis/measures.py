"""What a ViT learnt, measured as the paper shows it (Sec. 4.5, App. D.7-D.8).

  embedding_filters_pca   the top principal components of the patch
                          embedding's filters (each a flattened P x P x 3
                          filter), ordered by the variance they explain;
  position_similarity     the cosine similarity of each position
                          embedding with every other one;
  mean_attention_distance see DISTANCE_DEFINITION;
  attention_rollout       Abnar & Zuidema (2020): average the attention
                          over heads, add the identity (the residual),
                          renormalise the rows, multiply through the
                          layers; then the row of what the head reads, over
                          the patches: the class token's row, the mean row
                          for `gap`, the probe's attention (mean over
                          heads) times the rollout for a MAP head.

`run` applies them to a loaded checkpoint and a stream of image batches.
Plain jax.numpy and numpy: no TensorFlow, no plotting (`figures.py` draws).
"""

from typing import Iterable
from typing import NamedTuple
from typing import Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import console
from vit_jax import inference
from vit_jax import models
from vit_jax import sharding
from vit_jax import weights
from vit_jax.models import embeddings
from vit_jax.models import resnet

NUM_FILTER_COMPONENTS = 28  # As the paper's Figure 7 (left).

DISTANCE_DEFINITION = (
    "Mean attention distance, per layer and head, in input pixels: for each "
    "query patch, the sum over key patches of its attention times the "
    "distance between the two patches' centres, averaged over query patches "
    "and images. Prefix tokens (the class token) are left out as queries "
    "and as keys, and each query's attention is renormalised to sum to 1 "
    "over the patches; a patch attending only to itself gives 0.")


class Shown(NamedTuple):
  """An image of the rollout figure."""
  index: Optional[int]  # Its position in the input (None: unknown).
  image: np.ndarray  # As the model saw it, H x W x 3.
  rollout_map: np.ndarray  # Grid rows x columns.


def embedding_filters_pca(kernel_PxPxCxD: np.ndarray,
                          num_components: int = NUM_FILTER_COMPONENTS):
  """(components K x P x P x C with unit norm, explained variance ratio K),
  largest variance first. The D filters are the samples."""
  p1, p2, c, d = kernel_PxPxCxD.shape
  filters_DxF = np.asarray(kernel_PxPxCxD, np.float64).reshape(-1, d).T
  centred = filters_DxF - filters_DxF.mean(axis=0)
  _, singular, components_KxF = np.linalg.svd(centred, full_matrices=False)
  variance = singular**2
  k = min(num_components, len(variance))
  return (components_KxF[:k].reshape(
      k, p1, p2, c), variance[:k] / max(variance.sum(), 1e-30))


def position_similarity(posemb_NxD: np.ndarray) -> np.ndarray:
  """N x N cosine similarities of the (grid) position embeddings."""
  x = np.asarray(posemb_NxD, np.float64)
  x = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-30)
  return x @ x.T


def patch_distances(grid: tuple[int, int], stride: int) -> np.ndarray:
  """N x N distances in pixels between the centres of a grid's patches
  (row-major, as the model's tokens)."""
  rows, cols = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]),
                           indexing="ij")
  centres = np.stack([rows.ravel(), cols.ravel()], axis=-1) * stride
  return np.linalg.norm(centres[:, None] - centres[None], axis=-1)


def mean_attention_distance(attention_LxBxHxTxT, distances_NxN,
                            num_prefix: int):
  """L x B x H mean attention distances (DISTANCE_DEFINITION)."""
  a = attention_LxBxHxTxT[..., num_prefix:, num_prefix:]
  a = a / jnp.maximum(jnp.sum(a, axis=-1, keepdims=True), 1e-30)
  per_query = jnp.sum(a * distances_NxN, axis=-1)  # L x B x H x N
  return jnp.mean(per_query, axis=-1)


def rollout_matrix(attention_LxBxHxTxT):
  """B x T x T: A_L ... A_1, each A = rows of (heads' mean + I) renormalised
  (the identity stands for the residual connection)."""
  tokens = attention_LxBxHxTxT.shape[-1]
  a = jnp.mean(attention_LxBxHxTxT, axis=2) + jnp.eye(tokens)
  a = a / jnp.sum(a, axis=-1, keepdims=True)  # L x B x T x T
  rollout = a[0]
  for layer in range(1, a.shape[0]):
    rollout = a[layer] @ rollout
  return rollout


def head_reads(classifier: str, tokens: int, batch: int,
               map_attention_BxHx1xN=None, num_prefix: int = 0):
  """B x T: how the head weighs the encoder's output tokens (gap reads the
  patch tokens only, the last T - num_prefix; map every token)."""
  if classifier == "token":
    return jnp.zeros((batch, tokens)).at[:, 0].set(1.0)
  reads = jnp.zeros((batch, tokens))
  if classifier == "map":
    return jnp.mean(map_attention_BxHx1xN[:, :, 0], axis=1)
  # gap: the mean patch token.
  return reads.at[:, num_prefix:].set(1.0 / (tokens - num_prefix))


def attention_rollout(attention_LxBxHxTxT, reads_BxT, num_prefix: int):
  """B x N: how much each patch reaches what the head reads (`head_reads`)."""
  rollout = rollout_matrix(attention_LxBxHxTxT)
  return jnp.einsum("bt,bts->bs", reads_BxT, rollout)[:, num_prefix:]


def pixel_filters(params, hybrid: bool) -> tuple[np.ndarray, str]:
  """(kernel P x P x 3 x D of the first layer that sees pixels, its name):
  the patch embedding (a Mixer's `stem`), or a hybrid stem's root
  convolution (standardised, as the model applies it; a hybrid's embedding
  sees the stem's features)."""
  if hybrid:
    kernel = resnet.weight_standardize(
        jnp.asarray(params["conv_root"]["kernel"]), axis=(0, 1, 2), eps=1e-5)
    return np.asarray(kernel), "conv_root (the hybrid stem's first layer)"
  if "stem" in params:
    return np.asarray(params["stem"]["kernel"]), "stem (the Mixer's patches)"
  return np.asarray(params["embedding"]["kernel"]), "embedding"


def position_table(params, config, grid, prefix: int):
  """(the grid's position embeddings N x D, how they were made), or
  (None, why not)."""
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  if weights.POSEMB in flat:
    return np.asarray(flat[weights.POSEMB])[0, prefix:], "learned"
  if config.model.posemb == "sincos2d":
    width = flat["embedding/kernel"].shape[-1]
    return np.asarray(embeddings.posemb_sincos2d(
        *grid,
        width))[0], ("fixed 2D sin-cos (sincos2d), computed, not learned")
  if config.model.posemb == "none":
    return None, "the model has no position table (posemb=none)"
  return None, "an MLP-Mixer has no position embeddings"


def _attention(loaded, batches, max_images: int, num_shown: int, grid):
  """(mean attention distance L x H summed over images, images counted,
  the rollouts kept)."""
  config = loaded.config
  prefix = models.form_of(config.model).num_prefix_tokens
  distances = jnp.asarray(patch_distances(grid, loaded.stride), jnp.float32)

  def per_batch(outputs, images):
    _, out = outputs
    assert tuple(out["grid"]) == grid, (out["grid"], grid)
    attention = out["attention_weights"]  # L x B x H x T x T
    distance_LxBxH = mean_attention_distance(attention, distances, prefix)
    reads = head_reads(config.model.classifier, attention.shape[-1],
                       attention.shape[1], out.get("map_attention"), prefix)
    return (jnp.transpose(distance_LxBxH,
                          (1, 0, 2)), attention_rollout(attention, reads,
                                                        prefix), images)

  apply = inference.make_apply_fn(loaded, per_batch, intermediates=True)
  distance_sum, count, shown = 0.0, 0, []
  for batch in console.progress(batches, None, "Attention"):
    images = sharding.to_global_batch(batch["image"], loaded.mesh)
    distance_BxLxH, rollout_BxN, images = jax.device_get(
        apply(loaded.params, images))
    real = np.flatnonzero(batch["mask"] > 0)[:max_images - count]
    distance_sum = distance_sum + distance_BxLxH[real].sum(axis=0)
    count += len(real)
    for i in real[:num_shown - len(shown)]:
      shown.append(
          Shown(
              int(batch["index"][i]) if "index" in batch else None, images[i],
              rollout_BxN[i].reshape(grid)))
    if count >= max_images:
      break
  if not count:
    raise ValueError("No image could be analysed.")
  return distance_sum, count, shown


def run(loaded, batches: Iterable[dict], max_images: int,
        num_shown: int = 6) -> dict:
  """Every analysis of `loaded` (`inference.Loaded`), attention averaged
  over at most `max_images` images of `batches` (padded batches with a
  mask, and optionally the index of each image); the rollout of the first
  `num_shown` images is kept, with them (`Shown`). What a model has none
  of (an MLP-Mixer: attention, position embeddings) is None, and
  `not_computed` says why."""
  config, model = loaded.config, loaded.model
  params = jax.device_get(loaded.params)
  grid = (config.image_size // loaded.stride,) * 2
  distance, count, shown, not_computed = None, 0, [], []
  if isinstance(model, models.MlpMixer):
    not_computed.append("mean attention distance and attention rollout: an "
                        "MLP-Mixer has no attention")
  else:
    distance_sum, count, shown = _attention(loaded, batches, max_images,
                                            num_shown, grid)
    distance = distance_sum / count  # L x H, pixels.
  hybrid = model.size.resnet is not None  # Mixers have none.
  kernel, filters_of = pixel_filters(params, hybrid)
  components, variance_ratio = embedding_filters_pca(kernel)
  posemb, posemb_kind = position_table(
      params, config, grid,
      models.form_of(config.model).num_prefix_tokens)
  if posemb is None:
    not_computed.append(f"position embedding similarity: {posemb_kind}")
  return {
      "variant": config.model.variant,
      "image_size": config.image_size,
      "grid": list(grid),
      "patch_pixels": loaded.stride,
      "num_images": count,
      "embedding_filters": {
          "layer": filters_of,
          "explained_variance_ratio": variance_ratio,
          "components": components
      },
      "position_embeddings": posemb_kind,
      "position_embedding_similarity": (
          None if posemb is None else position_similarity(posemb)),
      "mean_attention_distance": distance,
      "attention_rollout": shown,
      "not_computed": not_computed,
  }


def summary_by_layer(distance_LxH) -> list[tuple[float, float, float]]:
  """(min, mean, max) over heads of each layer's mean attention distance."""
  d = np.asarray(distance_LxH)
  return [(float(r.min()), float(r.mean()), float(r.max())) for r in d]


def rounded(value, digits: int = 5):
  """Arrays and floats as JSON lists and numbers."""
  if isinstance(value, (np.ndarray, jnp.ndarray)):
    return np.round(np.asarray(value, np.float64), digits).tolist()
  if isinstance(value, float):
    return round(value, digits)
  return value
