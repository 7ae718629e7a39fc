"""What a train step minimises: the losses and the objectives (supervised
classification, the paper's masked patch prediction, masked autoencoders,
distillation from frozen teachers, image-text pairs: SigLIP's and CLIP's),
and the checks of the config fields that choose them. Imports no
TensorFlow.
"""

import dataclasses
import re
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax import models
from vit_jax import sharding
from vit_jax.config import fields
from vit_jax.errors import UserError
from vit_jax.models import mae
from vit_jax.models import masked_patch
from vit_jax.models import text
from vit_jax.training import contrastive
from vit_jax.training import distill
from vit_jax.training import mixup


def softmax_xent(logits, labels):
  return optax.softmax_cross_entropy(logits.astype(jnp.float32), labels)


def sigmoid_xent(logits, labels):
  per_class = optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32),
                                                 labels)
  return jnp.sum(per_class, axis=-1)


LOSSES = {"softmax_xent": softmax_xent, "sigmoid_xent": sigmoid_xent}

# `objective(apply, batch, rng) -> (loss, metrics)`, where `apply(images,
# **kwargs)` is the model in training mode with its parameters bound.
Objective = Callable[[Callable, dict, jax.Array], tuple[jax.Array, dict]]


@dataclasses.dataclass(frozen=True)
class DrawnForBatch:
  """An objective whose random draw (MAE's masking) is made once for the
  global batch, before the step splits it over devices, FSDP's shards or
  micro-batches: each example's draw is a pure function of the seed, the
  step and its place in the batch, on any mesh and at any
  config.accum_steps, so a run resumed on another device count goes on
  exactly. `draw(batch, rng)` gives the entries to add to the batch (each
  with the batch's leading axis); the objective reads them."""
  objective: Objective
  draw: Callable[[dict, jax.Array], dict]

  def __call__(self, apply, batch, rng):
    return self.objective(apply, batch, rng)


def weighted_mean(values_B, weights_B=None):
  """The mean over the examples of weight 1 (all, without weights). Written
  as mean(values x weights) x B / sum(weights): with every weight 1 that is
  exactly jnp.mean(values), bit for bit."""
  if weights_B is None:
    return jnp.mean(values_B)
  count = jnp.maximum(jnp.sum(weights_B), 1.0)
  return jnp.mean(values_B * weights_B) * (values_B.shape[0] / count)


def _mixed(rng, images, labels, mask_B, alpha: float, p: float):
  """(images, labels, mask, rng) after mixup (`mixup.py`) with its own key
  (without mixup, the dropout key stays as it was); an example mixed with
  a placeholder (mask 0: an unreadable file's) is left out as well."""
  if alpha <= 0:
    return images, labels, mask_B, rng
  mixup_rng, rng = jax.random.split(rng)
  images, labels, own_B = mixup.mix(mixup_rng, images, labels, alpha, p)
  if mask_B is not None:
    mask_B = mask_B * jnp.where(own_B < 1, jnp.roll(mask_B, 1), 1.0)
  return images, labels, mask_B, rng


def supervised(loss_fn: Callable, label_smoothing: float = 0.0,
               mixup_alpha: float = 0.0, mixup_p: float = 1.0) -> Objective:
  """Classification of `batch["labels"]`; label smoothing mixes the targets
  with the uniform distribution; with `mixup_alpha`, images and labels are
  mixed first (`vit_jax/training/mixup.py`)."""

  def objective(apply, batch, rng):
    images, labels = batch["image"], batch["labels"]
    mask_B = batch.get("mask")  # 0: an unreadable file's blank placeholder.
    images, labels, mask_B, rng = _mixed(rng, images, labels, mask_B,
                                         mixup_alpha, mixup_p)
    if label_smoothing:
      labels = optax.smooth_labels(labels, label_smoothing)
    logits, _ = apply(images, rngs={"dropout": rng})
    if logits.ndim == 3:  # Packed sequences: an image per slot, some empty.
      logits = logits.reshape(-1, logits.shape[-1])
      labels = labels.reshape(-1, labels.shape[-1])
      mask_B = mask_B.reshape(-1)
    return weighted_mean(loss_fn(logits, labels), mask_B), {}

  return objective


def distillation(target: str = "probabilities", temperature: float = 1.0,
                 label_weight: float = 0.0, label_loss: Callable = softmax_xent,
                 mixup_alpha: float = 0.0, mixup_p: float = 1.0,
                 label_smoothing: float = 0.0):
  """Function matching (`distill.py`): `objective(apply, batch, rng,
  teachers) -> (loss, metrics)`, where `teachers(images) -> [B x K
  logits]` runs the frozen teachers on exactly the images the student gets
  (after mixup). Metrics: `agreement`, the share of examples whose top-1
  class is the teachers'; with a label term, `distill_loss` alone too."""

  def objective(apply, batch, rng, teachers):
    images, mask_B = batch["image"], batch.get("mask")
    labels = batch["labels"] if label_weight else None
    # One draw, which the student and the teachers both see.
    images, labels, mask_B, rng = _mixed(rng, images, labels, mask_B,
                                         mixup_alpha, mixup_p)
    matched = jax.lax.stop_gradient(
        distill.teachers_target(teachers(images), target, temperature))
    logits, _ = apply(images, rngs={"dropout": rng})
    distill_B = distill.distance(logits, matched, target, temperature)
    agree_B = jnp.argmax(logits, -1) == jnp.argmax(matched, -1)
    metrics = {"agreement": weighted_mean(agree_B.astype(jnp.float32), mask_B)}
    loss_B = distill_B
    if label_weight:
      if label_smoothing:
        labels = optax.smooth_labels(labels, label_smoothing)
      loss_B = loss_B + label_weight * label_loss(logits, labels)
      metrics["distill_loss"] = weighted_mean(distill_B, mask_B)
    return weighted_mean(loss_B, mask_B), metrics

  return objective


def masked_patch_sums(apply, images, rng, mp_config, stride: int,
                      weights_B=None) -> dict[str, jax.Array]:
  """Masked patch prediction on `images` with a corruption drawn from
  `rng`: sums of the loss and of the correct predictions over the corrupted
  patches, and their count (each image weighted by `weights_B`, e.g. the
  evaluation's padding mask)."""
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
  return {
      "loss": jnp.sum(loss_BxN * weights_BxN),
      "correct": jnp.sum(correct_BxN * weights_BxN),
      "count": jnp.sum(weights_BxN)
  }


def masked_patch_prediction(mp_config, stride: int) -> Objective:
  """The paper's self-supervision (`models/masked_patch.py`): labels are not
  read. Metrics: the per-patch accuracy on the corrupted patches."""

  def objective(apply, batch, rng):
    sums = masked_patch_sums(apply, batch["image"], rng, mp_config, stride,
                             batch.get("mask"))
    count = jnp.maximum(sums["count"], 1.0)  # A batch of placeholders: 0.
    return sums["loss"] / count, {"accuracy": sums["correct"] / count}

  return objective


def mae_sums(apply, images, rng, mae_config, stride: int, weights_B=None,
             masking=None) -> dict[str, jax.Array]:
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
  return {
      "loss": jnp.sum(loss_BxN * weights_BxN),
      "count": jnp.sum(weights_BxN)
  }


MAE_NOISE = "mae_noise"  # The batch's entry of MAE's per-patch noise.
_MAE_NOISE_STREAM = 0x6d6165  # Folded into the step's key for that noise.


def masked_autoencoder(mae_config, stride: int) -> DrawnForBatch:
  """MAE (`models/mae.py`): the mean squared error on the dropped patches
  of the batch, MAE's (loss x mask).sum() / mask.sum(). Labels are not
  read. The masking's noise is drawn for the global batch (`DrawnForBatch`)."""

  def draw(batch, rng):
    batch_size, height, width = batch["image"].shape[:3]
    num_patches = (height // stride) * (width // stride)
    return {
        MAE_NOISE: jax.random.uniform(
            jax.random.fold_in(rng, _MAE_NOISE_STREAM),
            (batch_size, num_patches))
    }

  def objective(apply, batch, rng):
    masking = mae.masking_from_noise(batch[MAE_NOISE], mae_config.mask_ratio)
    sums = mae_sums(apply, batch["image"], rng, mae_config, stride,
                    batch.get("mask"), masking)
    return sums["loss"] / jnp.maximum(sums["count"], 1.0), {}

  return DrawnForBatch(objective, draw)


def image_text(loss: str, mesh=None, chunked: bool = True) -> Objective:
  """SigLIP's sigmoid loss (`loss="siglip"`) or CLIP's softmax loss both
  ways (`"clip"`) over the whole global batch of image-text pairs
  (`contrastive.py`; on `mesh`, sharded over its batch axes). The model is
  the two towers (`models/two_towers.py`); labels are not read. Metrics:
  the temperature t and SigLIP's bias b."""
  axes = None if mesh is None else sharding.batch_axes(mesh)

  def objective(apply, batch, rng):
    zimg, ztxt, out = apply(batch["image"], texts=batch["text"],
                            rngs={"dropout": rng})
    mask = batch.get("mask")  # 0: an unreadable image's placeholder.
    if loss == "siglip":
      value = contrastive.sigmoid_loss(zimg, ztxt, out["t"], out["b"], mesh,
                                       axes, chunked, mask)
      return value, {"temperature": out["t"], "bias": out["b"]}
    value = contrastive.softmax_loss(zimg, ztxt, out["t"], mesh, axes, mask)
    return value, {"temperature": out["t"]}

  return objective


def _supervised_for_config(config: ml_collections.ConfigDict) -> Objective:
  return supervised(LOSSES[config.loss], config.label_smoothing,
                    config.mixup.alpha, config.mixup.p)


def _distillation_for_config(config: ml_collections.ConfigDict) -> Objective:
  d = config.distill
  return distillation(d.target, d.temperature, d.label_weight,
                      LOSSES[config.loss], config.mixup.alpha, config.mixup.p,
                      config.label_smoothing)


def _masked_patch_for_config(config: ml_collections.ConfigDict) -> Objective:
  return masked_patch_prediction(config.masked_patch, models.stride(
      config.model))


def _mae_for_config(config: ml_collections.ConfigDict) -> Objective:
  return masked_autoencoder(config.mae, models.stride(config.model))


# config.objective -> the config's objective.
OBJECTIVES: dict[str, Callable[[ml_collections.ConfigDict], Objective]] = {
    "supervised": _supervised_for_config,
    "masked_patch": _masked_patch_for_config,
    "mae": _mae_for_config,
    "distill": _distillation_for_config,
    "siglip": None,  # Made with the mesh (`objective_for_config`).
    "clip": None,
}
# The objectives whose model has a classification head.
CLASSIFIERS = ("supervised", "distill")


def objective_for_config(config: ml_collections.ConfigDict,
                         mesh=None) -> Objective:
  """The config's objective; an image-text one's loss runs over `mesh`'s
  batch axes (None: the whole batch as one array)."""
  if config.objective in models.IMAGE_TEXT_OBJECTIVES:
    return image_text(config.objective, mesh, config.text.chunked)
  return OBJECTIVES[config.objective](config)


def trains_classifier(config: ml_collections.ConfigDict) -> bool:
  """Whether the config's model has a classification head to train."""
  return config.objective in CLASSIFIERS


def check_config(config: ml_collections.ConfigDict):
  """The loss and objective fields (and what masked patch prediction and
  distillation need)."""
  if config.mixup.alpha > 0 and not trains_classifier(config):
    raise UserError(f"config.mixup.alpha={config.mixup.alpha} mixes labels, "
                    f"which config.objective={config.objective!r} does not "
                    "read; set config.mixup.alpha=0.")
  fields.check_choice(config, "loss", LOSSES)
  fields.check_choice(config, "objective", OBJECTIVES)
  fields.check_choice(config, "masked_patch.target", masked_patch.TARGETS)
  distill.check_config(config)
  if config.objective == "masked_patch":
    check_masked_patch(config)
  if config.objective == "mae":
    check_mae(config)
  if config.objective in models.IMAGE_TEXT_OBJECTIVES:
    check_image_text(config)


def check_image_text(config: ml_collections.ConfigDict):
  """What siglip and clip need of config.text and the loop."""
  t = config.text
  fields.check_choice(config, "text.pool", text.POOLS)
  if config.accum_steps > 1:
    raise UserError(
        f"config.accum_steps={config.accum_steps} splits the batch, and "
        f"config.objective={config.objective} scores every image against "
        "every text of the whole batch (its negatives): a micro-batch's loss "
        "is another loss. Set config.accum_steps=1 (a smaller batch, or more "
        "devices, instead).")
  if config.mixup.alpha > 0 or config.label_smoothing:
    raise UserError("config.mixup.alpha and config.label_smoothing mix "
                    f"labels, which config.objective={config.objective} does "
                    "not read; set both to 0.")
  for name in ("length", "embedding_dim"):
    if not t[name] or t[name] < 1:
      raise UserError(f"config.text.{name}={t[name]} must be a positive "
                      "integer.")
  if t.temperature_init is not None and t.temperature_init <= 0:
    raise UserError(f"config.text.temperature_init={t.temperature_init} must "
                    "be positive (it is stored as its log).")
  if config.objective == "clip" and t.bias_init is not None:
    raise UserError(
        f"config.text.bias_init={t.bias_init}: CLIP's softmax loss does not "
        "change with a bias added to every logit, so it would never learn; "
        "leave it None with config.objective=clip.")
  for field, name in (("model.variant", config.model.variant), ("text.variant",
                                                                t.variant)):
    try:
      size = models.get_variant(name)
    except UserError as e:  # Its message names config.model.variant.
      raise UserError(f"config.{field}={name!r} is not a variant of "
                      "vit_jax/models/variants.py (e.g. ViT-B/16, ViT-S/16, "
                      "digits, testing).") from e
    if not isinstance(size, models.Variant) or size.resnet is not None:
      raise UserError(
          f"config.{field}={name!r}: an image-text tower is a plain ViT "
          "(the text tower takes a ViT variant's sizes); pick one such as "
          "ViT-B/16.")
  locked = any(re.fullmatch(rx, "img/embedding/kernel") for rx in config.frozen)
  if locked and not config.init.checkpoint:
    raise UserError(
        "config.frozen locks the image tower (img/), which config.init."
        "checkpoint does not load: it would stay at its random init. Give "
        "the image checkpoint to start from (LiT: a trained ViT), e.g. "
        "configs/image_text.py:lit_digits,init=workdirs/demo/pretrain.")
  image = models.get_variant(config.model.variant)
  if not t.image_head and t.embedding_dim != image.hidden_size:
    raise UserError(
        f"config.text.image_head=False makes the image tower's "
        f"{image.hidden_size}-wide features its embedding, so the text "
        f"tower must project to it: set config.text.embedding_dim="
        f"{image.hidden_size} (it is {t.embedding_dim}).")


def check_masked_patch(config: ml_collections.ConfigDict):
  """The model (a plain ViT with nothing it cannot train), the rates, the
  colour bits and the patch grid that masked patch prediction needs (its
  pixel range: `preprocess.check_pipelines`)."""
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


def check_mae(config: ml_collections.ConfigDict):
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
