"""`siglip` and `clip`: an image tower and a text tower learnt from
image-text pairs, SigLIP's sigmoid loss or CLIP's softmax loss both ways
over the whole global batch (`training/contrastive.py`; the model
`models/two_towers.py`, config.text the text tower and the captions).
LiT is either with the image tower frozen (config.frozen). Labels are
not read. One family, two registered values: they differ in the loss and
the scalars the model learns."""

import re

import ml_collections

from vit_jax import models
from vit_jax import sharding
from vit_jax import weights
from vit_jax.config import fields
from vit_jax.errors import UserError
from vit_jax.models import text
from vit_jax.objectives import interface
from vit_jax.training import contrastive


class _ImageText(interface.Objective):
  """What SigLIP and CLIP share: the towers, the texts, the checks."""
  evaluators = ("zeroshot", "retrieval")
  config_section = "text"
  paper = ""  # Its name in the console's words.
  temperature_init = 1.0  # The learned t's start (logits x t).
  max_temperature = None  # t's bound after each update (None: none).

  def bias_init(self, config):
    """The learned b's start (logits + b); None: the model has none."""
    del config
    return None

  def check(self, config):
    check_config(config)

  def takes_sequences(self, config):
    # One image per sequence: NaViT's packing pairs images with labels only.
    return not config.packing.length

  def decide(self, config, resumed_workdir=None):
    return weights.decide_text(config, resumed_workdir)

  def carries(self, config):
    return interface.Carries(text=True)

  def model(self, config, num_classes):
    del num_classes
    return models.two_towers(
        config, config.text.temperature_init or self.temperature_init,
        self.bias_init(config), self.max_temperature)

  def init(self, config, checkpoint, params, params_sharding):
    return weights.init_two_towers(config, checkpoint, params, params_sharding)

  def keep(self, config, workdir):
    from vit_jax.data import tokenizer  # pylint: disable=g-import-not-at-top
    tokenizer.keep(config.text.tokenizer, workdir)

  def describe(self, config, num_classes, teachers=()):
    return f"{self.paper}, text tower {config.text.variant}"


class SigLIP(_ImageText):
  """Zhai et al. 2023: t starts at 10 and b at -10 (most pairs are
  negatives); the loss on the devices' ring where config.text.chunked."""
  name = "siglip"
  paper = "SigLIP"
  temperature_init = 10.0

  def bias_init(self, config):
    return -10.0 if config.text.bias_init is None else config.text.bias_init

  def loss(self, config: ml_collections.ConfigDict, mesh=None):
    axes = None if mesh is None else sharding.batch_axes(mesh)
    chunked = config.text.chunked

    def sums(forward, batch, rng, teachers):
      del teachers
      zimg, ztxt, out = forward(batch["image"], texts=batch["text"],
                                rngs={"dropout": rng})
      value = contrastive.sigmoid_loss(zimg, ztxt, out["t"], out["b"], mesh,
                                       axes, chunked, batch.get("mask"))
      return interface.Sums(
          value, 1.0, per_batch={
              "temperature": out["t"],
              "bias": out["b"]
          })

    return interface.Loss(sums, across_batch=True)


class CLIP(_ImageText):
  """Radford et al. 2021: t starts at 1 / 0.07, and is clamped at 100
  after each update (as the paper and OpenCLIP: "to prevent scaling the
  logits by more than 100"); no bias (a softmax does not change with
  one)."""
  name = "clip"
  paper = "CLIP"
  temperature_init = 1 / 0.07
  max_temperature = 100.0

  def check(self, config):
    super().check(config)
    if config.text.bias_init is not None:
      raise UserError(
          f"config.text.bias_init={config.text.bias_init}: CLIP's softmax "
          "loss does not change with a bias added to every logit, so it "
          "would never learn; leave it None with config.objective=clip.")

  def loss(self, config: ml_collections.ConfigDict, mesh=None):
    axes = None if mesh is None else sharding.batch_axes(mesh)

    def sums(forward, batch, rng, teachers):
      del teachers
      zimg, ztxt, out = forward(batch["image"], texts=batch["text"],
                                rngs={"dropout": rng})
      value = contrastive.softmax_loss(zimg, ztxt, out["t"], mesh, axes,
                                       batch.get("mask"))
      return interface.Sums(value, 1.0, per_batch={"temperature": out["t"]})

    return interface.Loss(sums, across_batch=True)


def check_config(config: ml_collections.ConfigDict):
  """What siglip and clip need of config.text and the loop."""
  t, objective = config.text, f"config.objective={config.objective}"
  fields.check_choice(config, "text.pool", text.POOLS)
  if config.accum_steps > 1:
    raise UserError(
        f"config.accum_steps={config.accum_steps} splits the batch, and "
        f"{objective} scores every image against every text of the whole "
        "batch (its negatives): a micro-batch's loss is another loss. Set "
        "config.accum_steps=1 (a smaller batch, or more devices, instead).")
  if config.mixup.alpha > 0 or config.label_smoothing:
    raise UserError("config.mixup.alpha and config.label_smoothing mix "
                    f"labels, which {objective} does not read; set both to "
                    "0.")
  for name in ("length", "embedding_dim"):
    if not t[name] or t[name] < 1:
      raise UserError(f"config.text.{name}={t[name]} must be a positive "
                      "integer.")
  if t.temperature_init is not None and t.temperature_init <= 0:
    raise UserError(f"config.text.temperature_init={t.temperature_init} must "
                    "be positive (it is stored as its log).")
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


interface.register(SigLIP())
interface.register(CLIP())
