"""The models: ViT (and hybrids), MLP-Mixer, and what builds them.

A model is its variant's sizes (`variants.py`) and its form, every other
`config.model` field as one value (`vit_jax.config.model_form.ModelForm`):
`build_model(config.model, num_classes)` for a decided config,
`create_model("ViT-B/16", num_classes, **options)` in code. The checks of
`config.model` are `model_checks.py`'s; the builder and what composes a model
`builder.py`'s.
"""

from vit_jax.config.model_form import ModelForm
from vit_jax.models.builder import build_model
from vit_jax.models.builder import clamped
from vit_jax.models.builder import create_model
from vit_jax.models.builder import form_of
from vit_jax.models.builder import fp8_state
from vit_jax.models.builder import init_on_zeros
from vit_jax.models.builder import is_two_towers
from vit_jax.models.builder import param_shapes
from vit_jax.models.builder import stride
from vit_jax.models.builder import two_towers
from vit_jax.models.builder import uses_fp8
from vit_jax.models.builder import vit_of
from vit_jax.models.builder import with_block_gather
from vit_jax.models.mixer import MlpMixer
from vit_jax.models.model_checks import check_image_size
from vit_jax.models.model_checks import check_model_config
from vit_jax.models.variants import VARIANTS
from vit_jax.models.variants import MixerVariant
from vit_jax.models.variants import Variant
from vit_jax.models.variants import get_variant
from vit_jax.models.vit import VisionTransformer

__all__ = [
    "VARIANTS", "ModelForm", "VisionTransformer", "MlpMixer", "MixerVariant",
    "Variant", "build_model", "create_model", "check_image_size", "form_of",
    "get_variant", "check_model_config", "stride", "init_on_zeros",
    "param_shapes", "fp8_state", "uses_fp8", "vit_of", "with_block_gather",
    "two_towers", "is_two_towers", "clamped"
]
