"""Writing weights in other code bases' formats (no TensorFlow).

`npz`: the released google-research/vision_transformer form (flat 'a/b/c'
names, looped blocks, class-token position embedding included). `timm`: a
safetensors state dict of timm's `VisionTransformer` or `MlpMixer`, which
its room writes (`timm/timm_dir.save_timm`). What both need of a model:
its position table, its class token's entry, its patch size baked in.
"""

import io

import flax
import numpy as np

from vit_jax import paths
from vit_jax.weights import loader
from vit_jax.weights.names import POSEMB

EXPORT_FORMATS = ("npz", "timm")


def released_params(path: str, num_heads: int = 0) -> dict[str, np.ndarray]:
  """Any file's params under the released names; class-token posemb included."""
  source = loader.read_converted(path, num_heads)
  return with_class_token_entry(source.params, source.posemb_prefix_tokens)


def with_class_token_entry(params, posemb_prefix_tokens: int) -> dict:
  """`params` whose position embeddings have an entry for the class token:
  a zero one where the table has none (big_vision adds no position
  embedding to the class token; zero is the same model)."""
  params = dict(params)
  posemb = params.get(POSEMB)
  if "cls" in params and posemb is not None and posemb_prefix_tokens == 0:
    zeros = np.zeros_like(posemb[:, :1])
    params[POSEMB] = np.concatenate([zeros, posemb], axis=1)
  return params


def with_posemb_table(params, image_size: int, posemb: str) -> dict:
  """`params` with the position embeddings of config.model.posemb=`posemb`
  stored nowhere written as the table of their values at `image_size`,
  patches only (fixed sincos2d ones; zeros for none): the same model at
  that resolution, for formats that only know learned ones."""
  if POSEMB in params:
    return params
  from vit_jax.models import embeddings  # pylint: disable=g-import-not-at-top
  patch, _, _, width = params["embedding/kernel"].shape
  grid = image_size // patch
  table = embeddings.posemb_sincos2d(grid, grid, width)
  if posemb == "none":
    table = np.zeros(table.shape, np.float32)
  return {**params, POSEMB: np.asarray(table, np.float32)}


def at_patch_size(params, patch: int, image_size: int) -> dict:
  """A ViT stored at one patch size (FlexiViT) as the plain ViT it is when
  run at `patch` on `image_size` pixels: the kernel PI-resized and learned
  position embeddings resized to that grid, as the model does in its step.
  For formats whose models run at the patch size they store."""
  from vit_jax.models import embeddings  # pylint: disable=g-import-not-at-top
  kernel = params["embedding/kernel"]
  stored = kernel.shape[0]
  if patch == stored:
    return params
  out = {
      **params, "embedding/kernel": np.asarray(
          embeddings.kernel_at_patch_size(kernel, patch))
  }
  if POSEMB in params:
    out[POSEMB] = np.asarray(
        embeddings.posemb_at_grid(params[POSEMB], (image_size // stored,) * 2,
                                  (image_size // patch,) * 2))
  return out


def save_npz(params, path: str):
  """Params (flat names or a nested tree) -> a released-form .npz."""
  if not all(isinstance(k, str) and "/" in k for k in params):
    params = flax.traverse_util.flatten_dict(params, sep="/")
  buffer = io.BytesIO()  # Object storage cannot seek while writing a zip.
  np.savez(buffer, **{k: np.asarray(v) for k, v in params.items()})
  paths.resolve(path).write_bytes(buffer.getvalue())
