"""MAE's reconstructions: what a checkpoint with MAE's decoder (a training
workdir of the mae objective, or facebookresearch/mae's full files)
predicts of an image's dropped patches from its visible ones.

For each image: the masked input (dropped patches grey), the prediction of
every patch, the prediction with the visible patches pasted back, and the
original. A decoder trained on normalised pixels (MAE's norm_pix_loss)
predicts each patch standardised by its own mean and variance; it is shown
at the original patch's mean and variance, as MAE's own demo shows its
normalised-pixel models. Plain jax.numpy and numpy: no plotting here.
"""

from typing import NamedTuple
from typing import Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import weights
from vit_jax.models import mae
from vit_jax.models import sequences

_DECODER = mae.DECODER + "/"


class Decoder(NamedTuple):
  """A checkpoint's MAE decoder: its sizes, parameters and target."""
  size: mae.DecoderSize
  params: dict  # The tree under `mae_decoder`.
  norm_pix_loss: bool
  mask_ratio: float


def decoder_of(loaded,
               norm_pix_loss: Optional[bool] = None) -> Optional[Decoder]:
  """The decoder of `loaded` (`inference.Loaded`)'s checkpoint, None where
  it has none. Its target and mask ratio are the run's (a workdir's
  config), else MAE's released ones (normalised pixels, 0.75);
  `norm_pix_loss` overrides the target (facebookresearch/mae's
  `mae_visualize_*` files predict plain pixels)."""
  vit = loaded.model
  flat = weights.read_converted(loaded.checkpoint, vit.size.num_heads).params
  found = {
      k[len(_DECODER):]: np.asarray(v)
      for k, v in flat.items()
      if k.startswith(_DECODER)
  }
  if not found:
    return None
  run = loaded.config.mae if loaded.trained_here else None
  blocks = {
      k.split("/")[1] for k in found if k.startswith("Transformer/enc"
                                                     "oderblock_")
  }
  first = "Transformer/encoderblock_0/"
  # Width x heads x head width, as read (facebookresearch/mae's fused qkv
  # is split at MAE_DECODER_HEADS on reading).
  query = found[first + "MultiHeadDotProductAttention_1/query/kernel"]
  size = mae.DecoderSize(
      width=found["embed/kernel"].shape[1], depth=len(blocks),
      num_heads=query.shape[1],
      mlp_dim=found[first + "MlpBlock_3/Dense_0/kernel"].shape[1])
  if norm_pix_loss is None:
    norm_pix_loss = run.norm_pix_loss if run else True
  return Decoder(size, flax.traverse_util.unflatten_dict(found, sep="/"),
                 norm_pix_loss, run.mask_ratio if run else 0.75)


def reconstruct(loaded, decoder: Decoder, images_BxHxWxC, seed: int = 0):
  """(masked, predicted, pasted, loss) for images as the model sees them
  (in [-1, 1]): the first three B x H x W x C, the last the reconstruction
  loss per image (B) on its dropped patches, in the decoder's target."""
  images = jnp.asarray(images_BxHxWxC, jnp.float32)
  patch = loaded.stride
  batch, height, width, channels = images.shape
  grid = (height // patch, width // patch)
  masking = mae.sample_masking(jax.random.key(seed), batch, grid[0] * grid[1],
                               decoder.mask_ratio)
  model = mae.MaskedAutoencoder(loaded.model, decoder.size)
  params = {**jax.device_get(loaded.params), mae.DECODER: decoder.params}
  _, out = model.apply({"params": params}, images, masking=masking)
  predicted = out["mae_predictions"]
  target = mae.patch_targets(images, patch, decoder.norm_pix_loss)
  removed = masking.removed_BxN
  loss = (mae.per_patch_loss(predicted, target) *
          removed).sum(1) / removed.sum(1)
  if decoder.norm_pix_loss:  # At the original patch's mean and variance.
    pixels = sequences.from_images(images, patch).patches
    mean = pixels.mean(-1, keepdims=True)
    std = jnp.sqrt(pixels.var(-1, keepdims=True, ddof=1) + 1e-6)
    predicted = predicted * std + mean

  def as_images(patches_BxNxO):
    x = patches_BxNxO.reshape(batch, *grid, patch, patch, channels)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(batch, height, width, channels)

  dropped = as_images(jnp.broadcast_to(removed[..., None], predicted.shape))
  masked = jnp.where(dropped > 0, 0.0, images)  # Grey: 0 in [-1, 1].
  predicted = as_images(predicted)
  pasted = jnp.where(dropped > 0, predicted, images)
  return tuple(
      np.asarray(x) for x in jax.device_get((masked, predicted, pasted, loss)))
