"""`masked_patch`: the paper's self-supervision (App. B.1.2;
`models/masked_patch.py`): some patch embeddings corrupted, each
corrupted patch's colours predicted. Labels are not read, so unlabelled
data trains it."""

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import models
from vit_jax.config import fields
from vit_jax.data import preprocess
from vit_jax.errors import UserError
from vit_jax.models import masked_patch
from vit_jax.objectives import interface


def patch_sums(apply, images, rng, mp_config, stride: int,
               weights_B=None) -> interface.Sums:
  """Masked patch prediction on `images` with a corruption drawn from
  `rng`: sums of the loss and of the correct predictions (`accuracy`)
  over the corrupted patches, and their count (each image weighted by
  `weights_B`, e.g. the evaluation's padding mask)."""
  corruption_rng, dropout_rng = jax.random.split(rng)
  batch, height, width = images.shape[:3]
  corruption = masked_patch.sample_corruption(
      corruption_rng, batch, (height // stride) * (width // stride),
      mp_config.corrupt_rate, mp_config.mask_rate, mp_config.replace_rate)
  _, out = apply(images, corruption=corruption, rngs={"dropout": dropout_rng})
  assert out["grid"][0] * out["grid"][1] == corruption.kind_BxN.shape[1], (
      f"{stride}-pixel patches do not match the model's grid {out['grid']}.")
  targets = masked_patch.patch_targets(images, out["grid"], mp_config.target,
                                       mp_config.color_bits,
                                       mp_config.downsized_size)
  loss_BxN, correct_BxN = masked_patch.per_patch_loss_and_correct(
      out["patch_predictions"], targets, mp_config.target, mp_config.color_bits)
  weights_BxN = corruption.corrupted_BxN.astype(jnp.float32)
  if weights_B is not None:
    weights_BxN = weights_BxN * weights_B[:, None]
  return interface.Sums(jnp.sum(loss_BxN * weights_BxN), jnp.sum(weights_BxN),
                        {"accuracy": jnp.sum(correct_BxN * weights_BxN)})


def prediction_loss(mp_config, stride: int) -> interface.Loss:
  """The loss and per-patch accuracy on the corrupted patches."""

  def sums(forward, batch, rng, teachers):
    del teachers
    return patch_sums(forward, batch["image"], rng, mp_config, stride,
                      batch.get("mask"))

  return interface.Loss(sums)


class MaskedPatch(interface.Objective):
  name = "masked_patch"
  evaluators = ("masked_patch", "fewshot")
  config_section = "masked_patch"
  benchmarked = True

  def check(self, config):
    check_config(config)

  def model(self, config, num_classes):
    mp = config.masked_patch
    return models.build_model(
        config.model, None,
        masked_patch.output_width(mp.target, models.stride(config.model),
                                  mp.color_bits, mp.downsized_size))

  def loss(self, config: ml_collections.ConfigDict, mesh=None):
    return prediction_loss(config.masked_patch, models.stride(config.model))

  def describe(self, config, num_classes, teachers=()):
    return f"masked_patch: {config.masked_patch.target}"


def check_config(config: ml_collections.ConfigDict):
  """The model (a plain ViT with nothing it cannot train), the rates, the
  colour bits, the patch grid and the pixel range it needs."""
  fields.check_choice(config, "masked_patch.target", masked_patch.TARGETS)
  mp = config.masked_patch
  stride = models.stride(config.model)
  if models.get_variant(config.model.variant).resnet is not None:
    raise UserError(
        f"config.objective=masked_patch does not take the hybrid "
        f"{config.model.variant}: its ResNet stem sees across patch borders, "
        "so a corrupted patch's pixels reach its neighbours' tokens (the "
        "paper pre-trains plain ViTs this way). Pick a plain ViT variant.")
  if config.model.classifier == "map" or config.model.representation_size:
    raise UserError(
        "config.model.classifier=map and config.model.representation_size "
        "add layers masked patch prediction never trains (weight decay would "
        "shrink them to zero); use classifier token or gap and no "
        "representation_size with config.objective=masked_patch.")
  if not 0.0 < mp.corrupt_rate <= 1.0:
    raise UserError(f"config.masked_patch.corrupt_rate={mp.corrupt_rate} "
                    "must be in (0, 1] (the paper: 0.5).")
  for field in ("mask_rate", "replace_rate"):
    if not 0.0 <= mp[field] <= 1.0:
      raise UserError(f"config.masked_patch.{field}={mp[field]} must be in "
                      "[0, 1].")
  if mp.mask_rate + mp.replace_rate > 1.0:
    raise UserError(
        f"config.masked_patch.mask_rate + replace_rate = "
        f"{mp.mask_rate + mp.replace_rate:g} exceeds 1; they are shares of the "
        "corrupted patches (the rest are kept), e.g. 0.8 and 0.1.")
  if not 1 <= mp.color_bits <= 5:
    raise UserError(f"config.masked_patch.color_bits={mp.color_bits} must be "
                    "in 1..5 (3 bits per channel: 512 colour classes).")
  if mp.target == "downsized" and (mp.downsized_size < 1 or
                                   stride % mp.downsized_size):
    raise UserError(
        f"config.masked_patch.downsized_size={mp.downsized_size} does not "
        f"divide the {stride}-pixel patches the model runs at; use a "
        f"divisor of {stride} (the paper: 4).")
  if (config.image_size // stride)**2 < 2:
    raise UserError(
        f"config.image_size={config.image_size} gives one patch; masked "
        "patch prediction needs at least two (a patch is replaced by "
        "another).")
  _check_pixel_range(config)


def _check_pixel_range(config):
  """Its colour targets are read from pixels in [-1, 1]: its pipelines end
  with value_range."""
  pipelines = [("pp_train", config.pp_train), ("pp_eval", config.pp_eval)]
  pipelines += [(f"evals.{name}.data.pp", entry.data.pp)
                for name, entry in config.evals.items()
                if entry.type == "masked_patch" and entry.data.pp]
  for field, spec in pipelines:
    if preprocess.op_names(config, spec)[-1:] != ["value_range"]:
      raise UserError(
          f"config.{field}={spec!r} must end with value_range: the "
          "colour targets of config.objective=masked_patch are read from "
          "pixels in [-1, 1].")


interface.register(MaskedPatch())
