"""How images are handed from the host to the devices: as uint8 where the
training pipeline ends in an op the train step applies itself.

The host's last op, value_range, turns [0, 255] pixels into [-1, 1] floats:
four bytes per value where one would do. With `config.pp_uint8` the
training pipeline stops before it and hands uint8 images over (a quarter of
the bytes through the host and onto the device); the train step maps them
with `images_in_value_range`. Plain jax (no TensorFlow): both the input
pipeline and the train step import it.
"""

import jax.numpy as jnp
import ml_collections
import numpy as np

# Preprocessing ops the train step applies itself (`images_in_value_range`),
# so the host may stop before them and hand uint8 images over.
DEVICE_OPS = ("value_range",)


def hands_over_uint8(config: ml_collections.ConfigDict) -> bool:
  """Whether training batches carry uint8 images: with `config.pp_uint8`,
  a `pp_train` that ends in one of DEVICE_OPS."""
  ops = [op.strip().split("(")[0] for op in config.pp_train.split("|")]
  if ops[-1:] == ["patchify"]:  # Cuts the image the op before gives.
    ops = ops[:-1]
  return bool(config.pp_uint8 and ops and ops[-1] in DEVICE_OPS)


def images_in_value_range(images):
  """uint8 images (see `hands_over_uint8`) mapped to [-1, 1] as the host's
  value_range op does (to 1e-7); float images as they are. A patch
  sequence's dict (images at their own shape): its patches likewise."""
  if isinstance(images, dict):
    return {**images, "patches": images_in_value_range(images["patches"])}
  if images.dtype != jnp.uint8:
    return images
  # (2x - 255) is exact; one multiplication then rounds the same in every
  # program (XLA's division by a constant depends on how it is fused).
  return (images.astype(jnp.float32) * 2.0 - 255.0) * np.float32(1 / 255)
