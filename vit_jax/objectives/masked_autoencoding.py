"""`mae` (He et al. 2021, "Masked Autoencoders Are Scalable Vision
Learners"; `models/mae.py`): most patches dropped, the ViT encodes the
rest, a light decoder predicts every patch's pixels; the loss is the mean
squared error on the dropped ones. Labels are not read."""

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import models
from vit_jax.errors import UserError
from vit_jax.models import mae
from vit_jax.objectives import interface

MAE_NOISE = "mae_noise"  # The batch's entry of MAE's per-patch noise.
_MAE_NOISE_STREAM = 0x6d6165  # Folded into the step's key for that noise.


def reconstruction_sums(apply, images, rng, mae_config, stride: int,
                        weights_B=None, masking=None) -> interface.Sums:
  """MAE on `images` with a masking drawn from `rng` (or the `masking`
  given): the sum of the per-patch squared error over the dropped patches
  and their count (each image weighted by `weights_B`, e.g. the
  evaluation's padding mask)."""
  masking_rng, dropout_rng = jax.random.split(rng)
  batch, height, width = images.shape[:3]
  if masking is None:
    masking = mae.sample_masking(masking_rng, batch,
                                 (height // stride) * (width // stride),
                                 mae_config.mask_ratio)
  _, out = apply(images, masking=masking, rngs={"dropout": dropout_rng})
  targets = mae.patch_targets(images, stride, mae_config.norm_pix_loss)
  loss_BxN = mae.per_patch_loss(out["mae_predictions"], targets)
  weights_BxN = masking.removed_BxN
  if weights_B is not None:
    weights_BxN = weights_BxN * weights_B[:, None]
  return interface.Sums(jnp.sum(loss_BxN * weights_BxN), jnp.sum(weights_BxN))


def reconstruction_loss(mae_config, stride: int) -> interface.Loss:
  """MAE's (loss x mask).sum() / mask.sum() over the batch; the masking's
  noise is drawn for the global batch (`Loss.draw`)."""

  def draw(batch, rng):
    batch_size, height, width = batch["image"].shape[:3]
    num_patches = (height // stride) * (width // stride)
    return {
        MAE_NOISE: jax.random.uniform(
            jax.random.fold_in(rng, _MAE_NOISE_STREAM),
            (batch_size, num_patches))
    }

  def sums(forward, batch, rng, teachers):
    del teachers
    masking = mae.masking_from_noise(batch[MAE_NOISE], mae_config.mask_ratio)
    return reconstruction_sums(forward, batch["image"], rng, mae_config, stride,
                               batch.get("mask"), masking)

  return interface.Loss(sums, draw=draw)


def decoder_size(config: ml_collections.ConfigDict) -> mae.DecoderSize:
  m = config.mae
  return mae.DecoderSize(m.decoder_width, m.decoder_depth, m.decoder_heads,
                         m.decoder_mlp_dim)


class MaskedAutoencoder(interface.Objective):
  name = "mae"
  evaluators = ("mae", "fewshot")
  config_section = "mae"
  benchmarked = True

  def check(self, config):
    check_config(config)

  def model(self, config, num_classes):
    return mae.MaskedAutoencoder(models.build_model(config.model, None),
                                 decoder_size(config))

  def loss(self, config: ml_collections.ConfigDict, mesh=None):
    return reconstruction_loss(config.mae, models.stride(config.model))

  def forward_options(self, config, image_size):
    patches = (image_size // models.stride(config.model))**2
    return {
        "masking": mae.sample_masking(jax.random.key(0), 1, patches,
                                      config.mae.mask_ratio)
    }

  def describe(self, config, num_classes, teachers=()):
    return f"MAE, {config.mae.mask_ratio:.0%} of the patches masked"


def check_config(config: ml_collections.ConfigDict):
  """The model (a plain ViT on whole images, with nothing it cannot
  train), the ratio and the decoder's sizes that MAE needs."""
  m, objective = config.mae, "config.objective=mae"
  variant = models.get_variant(config.model.variant)
  if not isinstance(variant, models.Variant) or variant.resnet is not None:
    raise UserError(
        f"{objective} does not take {config.model.variant}: the encoder runs "
        "on the visible patches alone, which a Mixer cannot (its token MLP "
        "reads every patch) and a hybrid's ResNet stem would see across "
        "(the dropped patches' pixels reach it). Pick a plain ViT variant.")
  if config.model.classifier == "map" or config.model.representation_size:
    raise UserError(
        "config.model.classifier=map and config.model.representation_size "
        f"add layers {objective} never trains (weight decay would shrink "
        "them to zero); use classifier token or gap and no "
        "representation_size.")
  if (config.sequence_length or config.packing.length or
      config.flexi.patch_sizes):
    raise UserError(
        f"{objective} masks whole images at the model's patch size; unset "
        "config.sequence_length, config.packing.length and "
        "config.flexi.patch_sizes.")
  patches = (config.image_size // models.stride(config.model))**2
  kept = mae.num_kept(patches, m.mask_ratio)
  if not 0.0 < m.mask_ratio < 1.0 or kept >= patches:
    raise UserError(
        f"config.mae.mask_ratio={m.mask_ratio} must leave some of the "
        f"{patches} patches visible and drop some (MAE: 0.75).")
  for field in ("decoder_width", "decoder_depth", "decoder_heads",
                "decoder_mlp_dim"):
    if not isinstance(m[field], int) or m[field] < 1:
      raise UserError(f"config.mae.{field}={m[field]} must be a positive "
                      "integer.")
  if m.decoder_width % m.decoder_heads or m.decoder_width % 4:
    raise UserError(
        f"config.mae.decoder_width={m.decoder_width} must be a multiple of 4 "
        f"(its sin-cos position embeddings) and of config.mae.decoder_heads="
        f"{m.decoder_heads}, e.g. 512 and 16.")


interface.register(MaskedAutoencoder())
