"""Frozen representations of a split, extracted by the sharded model.

The batches are the exact-evaluation ones (padded, with a mask), spread over
all devices and hosts; every process gets the whole split's features back,
padding removed, in a fixed order.
"""

import re
from typing import Iterable

from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from vit_jax import console
from vit_jax import models
from vit_jax import sharding
from vit_jax.errors import UserError

POOLED_LAYERS = ("pre_logits", "head_input", "logits")
# The encoder's output tokens (after its final norm), pooled: the class
# token, the mean of the patch tokens, or both side by side (DINOv2's
# linear probe).
TOKEN_LAYERS = {
    "class_token": lambda out: out["encoded"][:, 0],
    "patch_mean": lambda out: out["patch_tokens"].mean(axis=1),
    "class_and_patch_mean": lambda out: jnp.concatenate(
        [out["encoded"][:, 0], out["patch_tokens"].mean(axis=1)], axis=-1),
}


def available_layers(num_layers: int, class_token: bool = True) -> list[str]:
  return list(POOLED_LAYERS) + [
      name for name in TOKEN_LAYERS if class_token or "class" not in name
  ] + [f"block_{i}" for i in range(num_layers)]


def check_layer(layer: str, num_layers: int, class_token: bool = True):
  if layer not in available_layers(num_layers, class_token):
    raise UserError(
        f"Unknown representation layer {layer!r}; available: "
        f"{', '.join(available_layers(num_layers, class_token))} (block_i: "
        "the class token after block i, or the mean over tokens without "
        "one).")


def make_feature_fn(model, layer: str, mesh, params_sharding,
                    logical_axis_rules=()):
  """jit(params, images) -> B x D features of `layer`, sharded over data."""
  block = re.fullmatch(r"block_(\d+)", layer)
  class_token = models.vit_of(model).has_class_token

  def features(params, images):
    logits, out = model.apply({"params": params}, images,
                              return_intermediates=block is not None)
    if layer in TOKEN_LAYERS:
      return TOKEN_LAYERS[layer](out).astype(jnp.float32)
    if block is None:
      return (logits if layer == "logits" else out[layer]).astype(jnp.float32)
    tokens = out["blocks"][int(block.group(1))]
    pooled = tokens[:, 0] if class_token else tokens.mean(axis=1)
    return pooled.astype(jnp.float32)

  return sharding.jit_on_mesh(
      features, mesh, logical_axis_rules,
      in_shardings=(params_sharding, sharding.batch_sharding(mesh)),
      out_shardings=sharding.batch_sharding(mesh))


def extract(feature_fn, params, batches: Iterable[dict], mesh, num_batches: int,
            what: str) -> tuple[np.ndarray, np.ndarray]:
  """(features N x D, integer labels N) of every real example in `batches`."""
  features, labels, masks = [], [], []
  for local in console.progress(batches, num_batches, f"Features of {what}"):
    batch = sharding.to_global_batch(local, mesh)
    out = feature_fn(params, batch["image"])
    gather = lambda x: np.asarray(
        multihost_utils.process_allgather(x, tiled=True))
    features.append(gather(out))
    labels.append(gather(batch["labels"]).argmax(-1))
    masks.append(gather(batch["mask"]) > 0)
  mask = np.concatenate(masks)
  return np.concatenate(features)[mask], np.concatenate(labels)[mask]
