"""A model from its config (`config.model`: a variant's sizes and the form),
or from a variant and options in code; the parts composed around a ViT
(masked patch prediction's, the two towers), FSDP's gathering blocks,
initialisation. What an objective trains, it builds from these
(`vit_jax/objectives/`).

    model = create_model("ViT-B/16", num_classes=1000, classifier="gap")
    model = build_model(config.model, num_classes)  # A decided config.
"""

import dataclasses
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.config.model_form import ModelForm
from vit_jax.errors import UserError
from vit_jax.models import mae
from vit_jax.models import masked_patch
from vit_jax.models import text
from vit_jax.models import variants
from vit_jax.models.attention import FP8_STATE
from vit_jax.models.mixer import MlpMixer
from vit_jax.models.model_checks import check_model_config
from vit_jax.models.two_towers import TwoTowers
from vit_jax.models.variants import MixerVariant
from vit_jax.models.variants import Variant
from vit_jax.models.vit import VisionTransformer

_FORM_FIELDS = tuple(f.name for f in dataclasses.fields(ModelForm))


def _model(size: Variant | MixerVariant, form: ModelForm,
           num_classes: Optional[int]) -> nn.Module:
  if isinstance(size, MixerVariant):
    return MlpMixer(num_classes, size, form)
  return VisionTransformer(num_classes, size, form)


def create_model(variant: str | Variant | MixerVariant,
                 num_classes: Optional[int] = None, **options) -> nn.Module:
  """A ViT (or Mixer) of `variant` (a name of `variants.py`, or sizes) with
  `options` of the form (`config/model_form.py`; dtypes by name or as
  jnp dtypes); the rest at their defaults."""
  size = (variants.get_variant(variant)
          if isinstance(variant, str) else variant)
  unknown = sorted(set(options) - set(_FORM_FIELDS))
  if unknown:
    raise UserError(f"{', '.join(unknown)}: not an option of the model "
                    f"(config/model_form.py has them: "
                    f"{', '.join(_FORM_FIELDS)}).")
  for field in ("dtype", "param_dtype"):
    if field in options:
      options[field] = jnp.dtype(options[field]).name
  return _model(size, ModelForm(**options), num_classes)


def build_model(model_config: ml_collections.ConfigDict,
                num_classes: Optional[int],
                masked_patch_outputs: Optional[int] = None) -> nn.Module:
  """The config's model (its open fields decided: `weights.decide`).
  `num_classes` None: no classification head. `masked_patch_outputs`:
  composed with masked patch prediction's [mask] token and per-patch head
  of that width (`masked_patch.MaskedPatchViT`)."""
  check_model_config(model_config)
  model = _model(variants.get_variant(model_config.variant),
                 ModelForm.from_config(model_config), num_classes)
  if masked_patch_outputs is None:
    return model
  return masked_patch.MaskedPatchViT(model, masked_patch_outputs)


def form_of(model_config: ml_collections.ConfigDict) -> ModelForm:
  """The form `config.model` says as it stands (an open field may still be
  None): for what it implies, such as its prefix tokens."""
  return ModelForm.from_config(model_config, decided=False)


def stride(model_config: ml_collections.ConfigDict) -> int:
  """Pixels per token along each side: the patch size the model runs at
  (config.model.patch_size, FlexiViT), else the variant's."""
  return (model_config.patch_size or
          variants.get_variant(model_config.variant).stride)


def two_towers(config, temperature_init: float, bias_init: Optional[float],
               max_temperature: Optional[float] = None) -> TwoTowers:
  """The image-text model of a decided config: config.model's ViT as the
  image tower, config.text's tower, both projecting to
  config.text.embedding_dim (config.text.vocab_size set: the image-text
  objectives decide it from the tokenizer), the temperature t and the
  bias b (None: none) starting at the values given, t kept at most
  `max_temperature` (None: unbounded; `TwoTowers.max_temperature`)."""
  t = config.text
  if not t.vocab_size:
    raise ValueError("config.text.vocab_size is still None: pass the config "
                     "through vit_jax.objectives.decide first.")
  image = build_model(
      config.model,
      t.embedding_dim if t.image_head else None).clone(head_zeroinit=False)
  form = ModelForm.from_config(config.model)
  tower = text.TextTransformer(t.embedding_dim, variants.get_variant(t.variant),
                               t.vocab_size, text.text_form(form), t.pool)
  return TwoTowers(image, tower, temperature_init, bias_init, t.length,
                   max_temperature=max_temperature)


def is_two_towers(model: nn.Module) -> bool:
  return isinstance(model, TwoTowers)


def clamped(model: nn.Module, params):
  """`params` after an update, kept where the model bounds them (a CLIP
  model's temperature: `TwoTowers.clamped`); as they are for others."""
  return model.clamped(params) if isinstance(model, TwoTowers) else params


def vit_of(model: nn.Module) -> VisionTransformer:
  """The ViT itself, where `build_model` composed parts around it."""
  if isinstance(model, TwoTowers):
    return model.img
  if isinstance(model, (masked_patch.MaskedPatchViT, mae.MaskedAutoencoder)):
    return model.vit
  return model


def with_block_gather(model: nn.Module, gather) -> nn.Module:  # ViTs only.
  """The model whose encoder blocks gather their parameters with `gather`
  (FSDP; see `encoder.Encoder`)."""
  if isinstance(model, (masked_patch.MaskedPatchViT, mae.MaskedAutoencoder)):
    return model.clone(vit=model.vit.clone(gather_block=gather))
  if isinstance(model, TwoTowers):
    return model.clone(img=model.img.clone(gather_block=gather),
                       txt=model.txt.clone(gather_block=gather))
  return model.clone(gather_block=gather)


def init_on_zeros(model, rng, image_size: int):
  """The model's parameters, initialised by tracing one all-zeros image."""
  images = jnp.zeros((1, image_size, image_size, 3))
  return model.init(rng, images, train=False)["params"]


def uses_fp8(model: nn.Module) -> bool:
  """Whether `model` was built with config.model.fp8 (ViTs only)."""
  return vit_of(model).form.fp8


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
