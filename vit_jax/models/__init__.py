"""Model construction from the config's `model` section."""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.errors import UserError
from vit_jax.models import masked_patch
from vit_jax.models import variants
from vit_jax.models.attention import ATTENTION
from vit_jax.models.attention import FP8_STATE
from vit_jax.models.mixer import MlpMixer
from vit_jax.models.sequences import INTERPOLATIONS
from vit_jax.models.variants import VARIANTS
from vit_jax.models.variants import MixerVariant
from vit_jax.models.variants import Variant
from vit_jax.models.variants import get_variant
from vit_jax.models.vit import CLASSIFIERS
from vit_jax.models.vit import POSEMB_TYPES
from vit_jax.models.vit import REMAT_POLICIES
from vit_jax.models.vit import VisionTransformer
from vit_jax.models.vit import has_class_token

DTYPES = {
    "float32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "float16": jnp.float16
}

# Fields added after workdirs were first recorded, with the value that
# keeps an older config.json's meaning.
_LATER_FIELDS = {
    "attention": "auto",
    "posemb": "learn",
    "class_token": None,
    "patch_size": None,
    "mixer_tiles": 1,
    "num_registers": 0,
    "posemb_covers_prefix": True,
    "layer_scale": None,
    "pre_norm": False,
    "quick_gelu": False,
    "pooled_norm": False,
    "layer_norm_eps": 1e-6,
    "fp8": False,
    "posemb_interpolation": "bilinear",
    "posemb_keep_aspect": False,
    "parallel_block": False,
    "use_bias": True,
    "qkv_bias": True,
    "qk_norm": False,
}
# The options of PyTorch's ViT families, as VisionTransformer's fields.
TORCH_FAMILY_OPTIONS = ("num_registers", "posemb_covers_prefix", "layer_scale",
                        "pre_norm", "quick_gelu", "pooled_norm",
                        "layer_norm_eps", "posemb_keep_aspect")
# ViT-22B's block options (encoder.Encoder1DBlock), as its fields.
BLOCK_OPTIONS = ("parallel_block", "use_bias", "qkv_bias", "qk_norm")


def model_field(model_config: ml_collections.ConfigDict, field: str):
  """`config.model.FIELD`, or what an older recorded config meant by its
  absence."""
  return model_config.get(field, _LATER_FIELDS.get(field))


def num_prefix_tokens(model_config: ml_collections.ConfigDict) -> int:
  """Tokens before the patch grid: the class token (if any), registers."""
  return int(
      has_class_token(model_config.classifier,
                      model_field(model_config, "class_token"))) + model_field(
                          model_config, "num_registers")


def posemb_prefix_tokens(model_config: ml_collections.ConfigDict) -> int:
  """Prefix tokens the learned position embeddings have entries for."""
  if model_field(model_config, "posemb_covers_prefix"):
    return num_prefix_tokens(model_config)
  return 0


def stride(model_config: ml_collections.ConfigDict) -> int:
  """Pixels per token along each side: the patch size the model runs at
  (config.model.patch_size, FlexiViT), else the variant's."""
  return (model_field(model_config, "patch_size") or
          get_variant(model_config.variant).stride)


def check_image_size(model_config: ml_collections.ConfigDict, image_size: int,
                     where: str = "image size"):
  """Refuses an image size the patches the model runs at do not tile."""
  variants.check_image_size(model_config.variant, image_size, where,
                            model_field(model_config, "patch_size"))


def check_model_config(model_config: ml_collections.ConfigDict):
  """Raises a clear error for a bad `config.model` before anything is traced."""
  variant = get_variant(model_config.variant)
  for field, allowed in (("classifier", CLASSIFIERS), ("remat", REMAT_POLICIES),
                         ("dtype", DTYPES), ("param_dtype", DTYPES),
                         ("attention", ATTENTION), ("posemb", POSEMB_TYPES)):
    value = model_field(model_config, field)
    if value not in allowed:
      raise UserError(f"config.model.{field}={value!r} is not "
                      f"one of {', '.join(allowed)}.")
  if (model_config.classifier == "token" and
      model_field(model_config, "class_token") is False):
    raise UserError(
        "config.model.classifier=token reads the class token, but "
        "config.model.class_token=False removes it; pool the patches with "
        "classifier gap or map, or unset class_token.")
  tiles = model_field(model_config, "mixer_tiles")
  if tiles != 1 and (not isinstance(variant, MixerVariant) or tiles < 1):
    raise UserError(
        f"config.model.mixer_tiles={tiles}: it widens an MLP-Mixer's "
        "token-mixing MLP for K times its checkpoint's resolution (a positive "
        f"K); {model_config.variant} is not a Mixer. Unset it (1).")
  run_patch = model_field(model_config, "patch_size")
  if run_patch is not None and (run_patch < 1 or variant.resnet is not None or
                                isinstance(variant, MixerVariant)):
    raise UserError(
        f"config.model.patch_size={run_patch}: only a plain ViT runs at "
        f"another patch size than its variant's (FlexiViT), and a positive "
        f"one; {model_config.variant} cannot. Unset it.")
  interpolation = model_field(model_config, "posemb_interpolation")
  if interpolation not in (None,) + INTERPOLATIONS:
    raise UserError(f"config.model.posemb_interpolation={interpolation!r} is "
                    f"not one of {', '.join(INTERPOLATIONS)}.")
  _check_torch_family_options(model_config)
  if isinstance(variant, MixerVariant):
    _check_mixer_config(model_config)
  elif model_field(model_config,
                   "posemb") == "sincos2d" and (variant.hidden_size % 4):
    raise UserError(
        f"config.model.posemb=sincos2d needs a width divisible by 4; "
        f"{model_config.variant} is {variant.hidden_size} wide. Use "
        "posemb=learn.")


def _check_torch_family_options(model_config: ml_collections.ConfigDict):
  """Refuses combinations no model family uses (they would load nothing)."""
  option = lambda name: model_field(model_config, name)
  sincos = option("posemb") == "sincos2d"
  refusals = (
      (option("num_registers") < 0, "config.model.num_registers must be 0 or "
       "more"),
      (option("num_registers") and sincos, "register tokens come with "
       "learned position embeddings (DINOv2); set posemb=learn"),
      (not option("posemb_covers_prefix") and
       (sincos or not num_prefix_tokens(model_config)),
       "posemb_covers_prefix=False leaves the class token or registers "
       "without a position embedding; it needs learned position "
       "embeddings and prefix tokens"),
      (option("pooled_norm") and model_config.classifier == "map",
       "pooled_norm normalises pooled patches or the class token (timm's "
       "fc_norm); a MAP head has its own LayerNorm"),
  )
  for refused, why in refusals:
    if refused:
      raise UserError(f"{why} ({model_config.variant}).")


def _check_mixer_config(model_config: ml_collections.ConfigDict):
  """A Mixer has no class token, position embeddings or attention: it
  pools by the mean of its patches."""
  options = {  # field: (value, what a Mixer allows, the first said).
      "classifier": (model_config.classifier, ("gap",)),
      "class_token": (model_field(model_config, "class_token"), (None, False)),
      "posemb": (model_field(model_config, "posemb"), ("learn",)),
      "scan_layers": (model_config.scan_layers, (False,)),
      "fp8": (model_field(model_config, "fp8"), (False,)),
  }
  for name in TORCH_FAMILY_OPTIONS + BLOCK_OPTIONS:  # A ViT's options only.
    options[name] = (model_field(model_config, name), (_LATER_FIELDS[name],))
  for field, (value, allowed) in options.items():
    if value not in allowed:
      raise UserError(
          f"{model_config.variant} is an MLP-Mixer: it pools by the mean of "
          "its patches, with no class token, position embeddings or scanned "
          f"layers. Set config.model.{field}={allowed[0]} (it is "
          f"{value!r}).")


def _mixer(variant: MixerVariant, model_config, num_classes) -> MlpMixer:
  return MlpMixer(
      num_classes=num_classes, hidden_size=variant.hidden_size,
      tokens_mlp_dim=variant.tokens_mlp_dim *
      model_field(model_config, "mixer_tiles")**2,
      channels_mlp_dim=variant.channels_mlp_dim, num_layers=variant.num_layers,
      patch_size=variant.patch_size,
      representation_size=model_config.representation_size,
      head_bias_init=model_config.head_bias_init,
      dropout_rate=model_config.dropout_rate,
      drop_path_rate=model_config.drop_path_rate,
      gelu_approximate=_decided_gelu(model_config), remat=model_config.remat,
      dtype=DTYPES[model_config.dtype],
      param_dtype=DTYPES[model_config.param_dtype])


def _decided_gelu(model_config: ml_collections.ConfigDict) -> bool:
  """The GELU form, which `weights.decide` settles before a model is built
  (from the checkpoint the run starts from)."""
  if model_config.gelu_approximate is None:
    raise ValueError(
        "config.model.gelu_approximate is still undecided (None): pass the "
        "config through vit_jax.weights.decide before building the model.")
  return bool(model_config.gelu_approximate)


def build_model(model_config: ml_collections.ConfigDict,
                num_classes: Optional[int],
                masked_patch_outputs: Optional[int] = None) -> nn.Module:
  """The config's ViT. `num_classes` None: no classification head.
  `masked_patch_outputs`: composed with masked patch prediction's [mask]
  token and per-patch head of that width (`masked_patch.MaskedPatchViT`)."""
  check_model_config(model_config)
  variant = get_variant(model_config.variant)
  if isinstance(variant, MixerVariant):
    vit = _mixer(variant, model_config, num_classes)
  else:
    vit = _vit(variant, model_config, num_classes)
  if masked_patch_outputs is None:
    return vit
  return masked_patch.MaskedPatchViT(vit, masked_patch_outputs)


def _vit(variant: Variant, model_config, num_classes) -> VisionTransformer:
  return VisionTransformer(
      num_classes=num_classes,
      hidden_size=variant.hidden_size,
      mlp_dim=variant.mlp_dim,
      num_heads=variant.num_heads,
      num_layers=variant.num_layers,
      patch_size=variant.patch_size,
      resnet=variant.resnet,
      classifier=model_config.classifier,
      class_token=model_field(model_config, "class_token"),
      posemb=model_field(model_config, "posemb"),
      posemb_interpolation=model_field(model_config, "posemb_interpolation") or
      "bilinear",
      run_patch_size=model_field(model_config, "patch_size"),
      **{n: model_field(model_config, n) for n in TORCH_FAMILY_OPTIONS},
      **{n: model_field(model_config, n) for n in BLOCK_OPTIONS},
      representation_size=model_config.representation_size,
      head_bias_init=model_config.head_bias_init,
      dropout_rate=model_config.dropout_rate,
      attention_dropout_rate=model_config.attention_dropout_rate,
      drop_path_rate=model_config.drop_path_rate,
      remat=model_config.remat,
      scan_layers=model_config.scan_layers,
      attention=model_field(model_config, "attention"),
      fp8=model_field(model_config, "fp8"),
      gelu_approximate=_decided_gelu(model_config),
      dtype=DTYPES[model_config.dtype],
      param_dtype=DTYPES[model_config.param_dtype],
  )


def from_config(config, num_classes):
  """The model a training config trains (the loop, the plan and `inspect`
  build it so): with a head of `num_classes` (None: none); for
  config.objective=masked_patch no head but the [mask] token and the patch
  head. Inference and few-shot read a plain ViT (`build_model`)."""
  if config.objective != "masked_patch":
    return build_model(config.model, num_classes)
  mp = config.masked_patch
  return build_model(
      config.model, None,
      masked_patch.output_width(mp.target, stride(config.model), mp.color_bits,
                                mp.downsized_size))


def vit_of(model: nn.Module) -> VisionTransformer:
  """The ViT itself, where `build_model` composed parts around it."""
  return model.vit if isinstance(model, masked_patch.MaskedPatchViT) else model


def with_block_gather(model: nn.Module, gather) -> nn.Module:  # ViTs only.
  """The model whose encoder blocks gather their parameters with `gather`
  (FSDP; see `vit.Encoder`)."""
  if isinstance(model, masked_patch.MaskedPatchViT):
    return model.clone(vit=model.vit.clone(gather_block=gather))
  return model.clone(gather_block=gather)


def init_on_zeros(model, rng, image_size: int):
  """The model's parameters, initialised by tracing one all-zeros image."""
  images = jnp.zeros((1, image_size, image_size, 3))
  return model.init(rng, images, train=False)["params"]


def uses_fp8(model: nn.Module) -> bool:
  """Whether `model` was built with config.model.fp8 (ViTs only)."""
  return getattr(vit_of(model), "fp8", False)


def fp8_state(model, rng, image_size: int):
  """The scaling state (amax histories, scales) of the FP8 matmuls of a
  model built with config.model.fp8, which training keeps beside the
  parameters (`TrainState.fp8`); None for any other model."""
  if not uses_fp8(model):
    return None
  images = jnp.zeros((1, image_size, image_size, 3))
  variables = model.init({"params": rng, "dropout": rng}, images, train=True)
  return variables[FP8_STATE]


def param_shapes(model, image_size: int):
  """The parameter tree as ShapeDtypeStructs: nothing is allocated."""
  return jax.eval_shape(
      lambda: init_on_zeros(model, jax.random.key(0), image_size))


__all__ = [
    "VARIANTS", "VisionTransformer", "MlpMixer", "MixerVariant", "build_model",
    "check_image_size", "from_config", "get_variant", "check_model_config",
    "DTYPES", "BLOCK_OPTIONS", "model_field", "num_prefix_tokens",
    "posemb_prefix_tokens", "stride", "init_on_zeros", "param_shapes",
    "fp8_state", "uses_fp8"
]
