"""Masked autoencoders (MAE; He et al., "Masked Autoencoders Are Scalable
Vision Learners", 2021).

Most of each image's patches (75%) are dropped, at random per image and
the same count for every image, so shapes stay static. The encoder, the
ViT itself, runs on the visible patches only: they reach it as a patch
sequence (`sequences.PatchSequence`, one image per sequence, no padding),
each patch at its own (row, column), so every position-embedding form
reads each patch's own position and the ViT is the one that fine-tunes
later. A light decoder (`MaeDecoder`) takes the encoded tokens, puts a
shared, learned [mask] token at each dropped position, adds fixed 2D
sin-cos position embeddings and predicts the pixels of every patch; the
loss is the mean squared error on the dropped patches
(`objectives/masked_autoencoding.py`).

`MaskedAutoencoder` composes the two in the ViT's parameter scope: the
decoder lives under `mae_decoder/` beside `embedding`, `Transformer`, ...,
so a checkpoint of an MAE run is a ViT checkpoint plus parts only this
objective uses. Everything here is plain JAX (no TensorFlow).
"""

from typing import NamedTuple
from typing import Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.config.model_form import ModelForm
from vit_jax.models import embeddings
from vit_jax.models import sequences
from vit_jax.models.encoder import Encoder

DECODER = "mae_decoder"  # The decoder's scope, beside the ViT's parameters.


@flax.struct.dataclass
class Masking:
  """Which patches each image keeps: its patches in the order of a random
  draw (`ids_shuffle`, MAE's), of which the first `keep` are visible."""
  ids_shuffle_BxN: jax.Array  # int32
  keep: int = flax.struct.field(pytree_node=False)

  @property
  def ids_keep_BxK(self):
    return self.ids_shuffle_BxN[:, :self.keep]

  @property
  def ids_restore_BxN(self):
    """Where each patch sits in the shuffled order (the inverse)."""
    return jnp.argsort(self.ids_shuffle_BxN, axis=1)

  @property
  def removed_BxN(self):
    """1.0 where a patch was dropped (where the loss is), 0.0 if visible."""
    return (self.ids_restore_BxN >= self.keep).astype(jnp.float32)


def num_kept(num_patches: int, mask_ratio: float) -> int:
  """Visible patches per image: MAE's int(N (1 - ratio)), at least one."""
  return max(1, int(num_patches * (1 - mask_ratio)))


def masking_from_noise(noise_BxN, mask_ratio: float) -> Masking:
  """MAE's masking: each image keeps the patches of its smallest noise."""
  keep = num_kept(noise_BxN.shape[1], mask_ratio)
  return Masking(jnp.argsort(noise_BxN, axis=1).astype(jnp.int32), keep)


def sample_masking(rng, batch: int, num_patches: int,
                   mask_ratio: float) -> Masking:
  """A masking drawn from `rng`: uniform noise per patch, so each image's
  visible set is a uniform random subset of the `num_kept` size."""
  return masking_from_noise(jax.random.uniform(rng, (batch, num_patches)),
                            mask_ratio)


def visible_patches(images_BxHxWxC, patch: int,
                    masking: Masking) -> sequences.PatchSequence:
  """The visible patches of each image as a one-image patch sequence, in
  the masking's order, each with its (row, column) in the whole grid."""
  whole = sequences.from_images(images_BxHxWxC, patch)
  keep = masking.ids_keep_BxK
  take = lambda x: jnp.take_along_axis(x, keep[..., None], axis=1)
  return sequences.PatchSequence(patches=take(whole.patches),
                                 coords=take(whole.coords), segments=jnp.ones(
                                     keep.shape, jnp.int32), grids=whole.grids)


def decoder_form(form: ModelForm) -> ModelForm:
  """The decoder's blocks: MAE's plain pre-LN blocks, with what they share
  with the encoder (`ModelForm.for_part`: dtypes, GELU, LayerNorm epsilon,
  attention kernel, remat); never scanned (8 blocks at most compile
  quickly, and its names stay those of a looped encoder). Its position
  embeddings are fixed and added before the blocks: none in them."""
  return form.for_part("mae_decoder", classifier="gap", class_token=False,
                       posemb="none")


class MaeDecoder(nn.Module):
  """Encoded tokens (prefix tokens first, then the visible patches in the
  masking's order) -> B x N x `outputs` pixel predictions, every patch of
  the grid in row-major order (float32).

  Parameters (MAE's, in this project's names): `embed` (its
  decoder_embed), `mask_token`, `Transformer/encoderblock_{i}` and
  `Transformer/encoder_norm` (decoder_blocks, decoder_norm), `pred`
  (decoder_pred). The position embeddings are fixed
  (`embeddings.mae_sincos_table`); the prefix tokens (class token,
  registers) get none, as MAE's class token.
  """
  width: int
  depth: int
  num_heads: int
  mlp_dim: int
  outputs: int  # Pixels per patch: stride * stride * channels.
  form: ModelForm

  @nn.compact
  def __call__(self, encoded_BxTxD, masking: Masking, grid_hw: tuple[int, int],
               prefix: int, deterministic: bool = True):
    form = decoder_form(self.form)
    dtype, param_dtype = jnp.dtype(form.dtype), jnp.dtype(form.param_dtype)
    dense = lambda features, name: nn.Dense(
        features, dtype=dtype, param_dtype=param_dtype, kernel_init=nn.
        initializers.xavier_uniform(), name=name)
    x_BxTxE = dense(self.width, "embed")(encoded_BxTxD)
    mask_token = self.param("mask_token", nn.initializers.normal(0.02),
                            (1, 1, self.width), param_dtype)
    batch, num_patches = masking.ids_shuffle_BxN.shape
    dropped_BxMxE = jnp.broadcast_to(mask_token.astype(
        x_BxTxE.dtype), (batch, num_patches - masking.keep, self.width))
    # Visible tokens, then [mask] tokens: the shuffled order, unshuffled.
    shuffled_BxNxE = jnp.concatenate([x_BxTxE[:, prefix:], dropped_BxMxE], 1)
    x_BxNxE = jnp.take_along_axis(shuffled_BxNxE,
                                  masking.ids_restore_BxN[..., None], axis=1)
    posemb_NxE = embeddings.mae_sincos_table(*grid_hw, self.width)
    x_BxNxE = x_BxNxE + jnp.asarray(posemb_NxE, x_BxNxE.dtype)
    x_BxTxE = jnp.concatenate([x_BxTxE[:, :prefix], x_BxNxE], axis=1)
    decoded_BxTxE, _ = Encoder(self.depth, self.mlp_dim, self.num_heads, form,
                               name="Transformer")(x_BxTxE, deterministic)
    return dense(self.outputs, "pred")(decoded_BxTxE[:, prefix:]).astype(
        jnp.float32)


def patch_targets(images_BxHxWxC, patch: int, normalize: bool):
  """B x N x (P*P*C): each patch's pixels (row, column, channel order,
  float32), with `normalize` standardised by the patch's own mean and
  unbiased variance (MAE's norm_pix_loss: (x - mean) / sqrt(var + 1e-6))."""
  pixels = sequences.from_images(images_BxHxWxC.astype(jnp.float32),
                                 patch).patches
  if not normalize:
    return pixels
  mean = pixels.mean(axis=-1, keepdims=True)
  var = pixels.var(axis=-1, keepdims=True, ddof=1)
  return (pixels - mean) / jnp.sqrt(var + 1e-6)


def per_patch_loss(predictions_BxNxO, targets_BxNxO):
  """B x N: each patch's mean squared error over its pixel values."""
  return jnp.mean(jnp.square(predictions_BxNxO - targets_BxNxO), axis=-1)


class DecoderSize(NamedTuple):
  """The decoder's widths, depth and heads (MAE's: 512, 8, 16, 2048)."""
  width: int = 512
  depth: int = 8
  num_heads: int = 16
  mlp_dim: int = 2048


class MaskedAutoencoder(nn.Module):
  """A ViT with MAE's decoder, sharing the ViT's parameter scope. Called
  with a `masking`, the ViT encodes the visible patches and the decoder's
  predictions of every patch are `out["mae_predictions"]` (B x N x
  P*P*C); without one it is the ViT alone, on whole images (feature
  extraction, fine-tuning's load)."""
  vit: nn.Module  # vit_jax.models.vit.VisionTransformer
  decoder: DecoderSize = DecoderSize()

  def setup(self):
    nn.share_scope(self, self.vit)

  @nn.compact
  def __call__(self, images_BxHxWxC, *, train: bool = False,
               return_intermediates: bool = False,
               masking: Optional[Masking] = None):
    initializing = self.is_initializing()
    if masking is None and not initializing:
      return self.vit(images_BxHxWxC, train=train,
                      return_intermediates=return_intermediates)
    patch = self.vit.form.patch_size or self.vit.size.patch_size
    grid_hw = (images_BxHxWxC.shape[1] // patch,
               images_BxHxWxC.shape[2] // patch)
    if initializing:
      # The ViT's parameters are made on the whole image (a patch sequence
      # reads its position table at the image's grid), the decoder's with
      # any masking (its shapes do not depend on it).
      self.vit(images_BxHxWxC, train=False)
      if masking is None:
        num = grid_hw[0] * grid_hw[1]
        masking = Masking(
            jnp.broadcast_to(jnp.arange(num, dtype=jnp.int32),
                             (images_BxHxWxC.shape[0], num)), max(1, num // 4))
    logits, out = self.vit(visible_patches(images_BxHxWxC, patch,
                                           masking), train=train,
                           return_intermediates=return_intermediates)
    channels = images_BxHxWxC.shape[-1]
    out["mae_predictions"] = MaeDecoder(
        *self.decoder, outputs=patch * patch * channels, form=self.vit.form,
        name=DECODER)(out["encoded"], masking, grid_hw,
                      self.vit.form.num_prefix_tokens, not train)
    return logits, out
