"""The checks of `config.model`, before anything is traced: each a one-line
`UserError` that names the field and the fix."""

import math

import ml_collections

from vit_jax.config import model_form
from vit_jax.errors import UserError
from vit_jax.models import variants
from vit_jax.models.variants import MixerVariant


def check_model_config(model_config: ml_collections.ConfigDict):
  """Raises a clear error for a bad `config.model` before anything is traced."""
  variant = variants.get_variant(model_config.variant)
  model_form.check(model_config)  # Every choice among its field's.
  if (model_config.classifier == "token" and model_config.class_token is False):
    raise UserError(
        "config.model.classifier=token reads the class token, but "
        "config.model.class_token=False removes it; pool the patches with "
        "classifier gap or map, or unset class_token.")
  tiles = model_config.mixer_tiles
  if tiles != 1 and (not isinstance(variant, MixerVariant) or tiles < 1):
    raise UserError(
        f"config.model.mixer_tiles={tiles}: it widens an MLP-Mixer's "
        "token-mixing MLP for K times its checkpoint's resolution (a positive "
        f"K); {model_config.variant} is not a Mixer. Unset it (1).")
  run_patch = model_config.patch_size
  if run_patch is not None and (run_patch < 1 or variant.resnet is not None or
                                isinstance(variant, MixerVariant)):
    raise UserError(
        f"config.model.patch_size={run_patch}: only a plain ViT runs at "
        f"another patch size than its variant's (FlexiViT), and a positive "
        f"one; {model_config.variant} cannot. Unset it.")
  _check_torch_family_options(model_config)
  if isinstance(variant, MixerVariant):
    _check_mixer_config(model_config)
  elif model_config.posemb == "sincos2d" and (variant.hidden_size % 4):
    raise UserError(
        f"config.model.posemb=sincos2d needs a width divisible by 4; "
        f"{model_config.variant} is {variant.hidden_size} wide. Use "
        "posemb=learn.")
  elif model_config.posemb_init == "sincos" and (model_config.posemb != "learn"
                                                 or variant.hidden_size % 4):
    raise UserError(
        "config.model.posemb_init=sincos starts a learned table (posemb=learn) "
        "at MAE's 2D sin-cos values, which need a width divisible by 4; "
        f"here posemb={model_config.posemb}, {model_config.variant} is "
        f"{variant.hidden_size} wide. Use posemb_init=normal.")
  elif model_config.rope != "none" and (variant.hidden_size //
                                        variant.num_heads) % 4:
    raise UserError(
        f"config.model.rope={model_config.rope} turns each head's features "
        "in pairs along rows and columns: it needs a head width divisible by "
        f"4; {model_config.variant}'s heads are "
        f"{variant.hidden_size // variant.num_heads} wide.")


def _check_torch_family_options(model_config: ml_collections.ConfigDict):
  """Refuses combinations no model family uses (they would load nothing)."""
  m = model_config
  sincos = m.posemb == "sincos2d"
  prefix = (int(m.class_token if m.class_token is not None else m.classifier ==
                "token") + max(m.num_registers, 0))
  refusals = (
      (m.num_registers < 0, "config.model.num_registers must be 0 or more"),
      (m.num_registers and sincos, "register tokens come with learned "
       "position embeddings (DINOv2); set posemb=learn"),
      (not m.posemb_covers_prefix and (m.posemb != "learn" or not prefix),
       "posemb_covers_prefix=False leaves the class token or registers "
       "without a position embedding; it needs learned position "
       "embeddings and prefix tokens"),
      (m.pooled_norm and m.classifier == "map",
       "pooled_norm normalises pooled patches or the class token (timm's "
       "fc_norm); a MAP head has its own LayerNorm"),
      (m.rope in ("none", "dinov3") and
       (m.rope_grid_offset or m.rope_reference_grid),
       "rope_grid_offset and rope_reference_grid move the patch indices of "
       "rope=axial or mixed; DINOv3's positions are centred and scaled"),
      (m.rope == "none" and
       (m.rope_shift or m.rope_jitter != 1 or m.rope_rescale != 1),
       "rope_shift, rope_jitter and rope_rescale move RoPE's positions; set "
       "config.model.rope"),
      (m.map_heads is not None and m.map_heads < 1,
       "config.model.map_heads must be positive, or None (the encoder's)"),
      (m.map_heads is not None and m.classifier != "map",
       f"config.model.map_heads={m.map_heads} sets the heads of a MAP head, "
       f"and classifier={m.classifier} has none: set classifier=map, or "
       "unset map_heads"),
  )
  for refused, why in refusals:
    if refused:
      raise UserError(f"{why} ({m.variant}).")
  _check_rope_numbers(m)


# RoPE's numbers (models/rope.py) and the values each may take: outside
# them an angle is inf or NaN, and training diverges at its first steps.
_ROPE_RANGES = (
    ("rope_temperature", lambda v: v > 0, "positive: the base of the periods "
     "base^(4k/K) (DINOv3's 100, EVA's 10000)"),
    ("rope_grid_offset", lambda v: True, "a finite number"),
    ("rope_reference_grid", lambda v: v >= 0,
     "0 (none) or a grid's side in patches"),
    ("rope_shift", lambda v: v >= 0, "0 (none) or more: a shift drawn in "
     "[-shift, shift]"),
    ("rope_jitter", lambda v: v >= 1, "1 (none) or more: a factor drawn in "
     "[1/J, J]"),
    ("rope_rescale", lambda v: v >= 1, "1 (none) or more: a factor drawn in "
     "[1/R, R]"),
)


def _check_rope_numbers(m: ml_collections.ConfigDict):
  """Refuses a RoPE number outside its range (or not finite), naming it."""
  for name, allowed, what in _ROPE_RANGES:
    value = m[name]
    if not (math.isfinite(value) and allowed(value)):
      raise UserError(f"config.model.{name}={value!r} must be {what} "
                      f"({m.variant}).")


def _check_mixer_config(model_config: ml_collections.ConfigDict):
  """A Mixer has no class token, position embeddings or attention: it
  pools by the mean of its patches, and takes none of a ViT's options
  (`model_form.vit_only_fields`). The line names each option set that it
  cannot take, and every fix at once."""
  structure = {  # field: what a Mixer allows, the first said.
      "classifier": ("gap",),
      "class_token": (None, False),
      "posemb": ("learn",),
      "scan_layers": (False,),
  }
  defaults = model_form.defaults()
  vit_options = [
      name for name in model_form.vit_only_fields()
      if model_config[name] != defaults[name]
  ]
  fixes = [(name, defaults[name]) for name in vit_options]
  fixes += [(name, allowed[0])
            for name, allowed in structure.items()
            if model_config[name] not in allowed]
  if not fixes:
    return
  flags = " ".join(f"--config.model.{name}={value}" for name, value in fixes)
  if vit_options:
    said = ", ".join(f"{name}={model_config[name]!r}" for name in vit_options)
    what = "is an option" if len(vit_options) == 1 else "are options"
    raise UserError(
        f"{model_config.variant} is an MLP-Mixer, and {said} {what} "
        f"only a ViT takes: set {flags}.")
  name, value = fixes[0]
  raise UserError(
      f"{model_config.variant} is an MLP-Mixer: it pools by the mean of "
      "its patches, with no class token, position embeddings or scanned "
      f"layers. Set {flags} (config.model.{name} is "
      f"{model_config[name]!r}).")


def check_image_size(model_config: ml_collections.ConfigDict, image_size: int,
                     where: str = "image size"):
  """Refuses an image size the patches the model runs at do not tile."""
  variants.check_image_size(model_config.variant, image_size, where,
                            model_config.patch_size)
