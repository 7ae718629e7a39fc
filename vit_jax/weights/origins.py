"""Which code base wrote a weights file, and its room's converter.

Each origin is a row of `ORIGINS`: how reports name it, the GELU its
models compute, and the function that converts its files into this
project's names. The rooms (`big_vision/`, `timm/`, `transformers/`) hold
the converters; `detect` decides the origin by the whole set of names.
"""

import re
from typing import Callable
from typing import NamedTuple
from typing import Optional

from vit_jax import paths
from vit_jax.errors import WeightsError
from vit_jax.weights import unsupported
from vit_jax.weights.big_vision import flax_names
from vit_jax.weights.big_vision import mixer_layout
from vit_jax.weights.files import directories
from vit_jax.weights.files import formats
from vit_jax.weights.mae import mae_names
from vit_jax.weights.names import Converted
from vit_jax.weights.timm import timm_config
from vit_jax.weights.timm import timm_names
from vit_jax.weights.transformers import hf_names


class Origin(NamedTuple):
  words: str  # How reports name it.
  # The GELU its models compute: True the tanh approximation (both Google
  # code bases), False the exact erf; None: its file says (an Orbax
  # workdir's config.json, `loader.origin_gelu`).
  gelu_approximate: Optional[bool]
  # (format, tensors, num_heads, path) -> Converted.
  convert: Callable[[str, dict, int, str], Converted]


def _flax(name):
  return lambda fmt, tensors, num_heads, path: flax_names.convert(
      name, fmt, tensors, path)


ORIGINS = {
    "orbax": Origin("this project (Orbax)", None, _flax("orbax")),
    "released": Origin("google-research/vision_transformer", True,
                       _flax("released")),
    "released_current_flax": Origin(
        "google-research/vision_transformer, current Flax names", True,
        _flax("released_current_flax")),
    "big_vision": Origin("big_vision", True, _flax("big_vision")),
    "timm": Origin(
        "timm", False, lambda fmt, tensors, heads, path: timm_names.from_timm(
            tensors, heads, path)),
    "mae": Origin(
        "facebookresearch/mae (encoder and decoder)", False,
        lambda fmt, tensors, heads, path: mae_names.from_mae(
            tensors, heads, path)),
    "hugging_face": Origin(
        "Hugging Face transformers", False,
        lambda fmt, tensors, heads, path: hf_names.from_hugging_face(
            tensors, heads, path)),
}


def words(origin: str) -> str:
  return ORIGINS[origin].words if origin in ORIGINS else origin


def detect(fmt: str, names, path: str) -> str:
  """Which code base wrote the file, decided by the whole set of names:
  `orbax` (this project's workdirs), `released`, `released_current_flax`,
  `big_vision` (`flax_names.origin` says how), `timm`, `mae`
  (facebookresearch/mae's full checkpoints), `hugging_face`.
  MLP-Mixers in the released names are `released` (big_vision's names are
  the released ones). A file of a family no room computes is refused
  (`unsupported`)."""
  if fmt == "orbax":
    return "orbax"
  if mixer_layout.is_mixer(names):
    return "timm" if fmt in ("safetensors", "torch") else "released"
  if fmt not in ("safetensors", "torch"):
    return flax_names.origin(names, path)
  _refuse_unsupported_directory(path)
  for table in (unsupported.TIMM, unsupported.TRANSFORMERS):
    refused = unsupported.find(table, names)
    if refused:
      raise WeightsError(unsupported.refusal(refused, path))
  if mae_names.is_full(names):  # Its encoder is timm's, its decoder its own.
    return "mae"
  if any(n.startswith(("blocks.", "patch_embed.")) for n in names):
    return "timm"
  if any(
      re.match(r"(vit\.|vision_model\.)?(embeddings|encoder|layers)\.", n)
      for n in names):
    return "hugging_face"
  raise WeightsError(f"{path} holds PyTorch weights but neither timm's nor "
                     "Hugging Face's ViT names (e.g. 'blocks.0.attn.qkv."
                     "weight' or 'vit.embeddings.cls_token').")


def convert(fmt: str, tensors: dict, num_heads: int, path: str) -> Converted:
  """The file's tensors in this project's names, by its origin's room."""
  origin = detect(fmt, list(tensors), path)
  return ORIGINS[origin].convert(fmt, tensors, num_heads, path)


def stated_options(path) -> dict:
  """The `config.model` fields a timm or transformers directory's
  config.json states (the activation, the LayerNorm epsilon, a
  NaFlexViT's resizing); {} for anything else."""
  config = directories.config_json(paths.resolve(formats.split_tower(path)[0]))
  if config is None:
    return {}
  if timm_config.is_timm_config(config):
    return timm_config.stated_options(config)
  return hf_names.stated_options(config)


def stated_heads(path) -> int:
  """The image tower's attention heads a transformers SigLIP directory's
  config.json states (PyTorch files do not show them); 0 otherwise."""
  config = directories.config_json(paths.resolve(formats.split_tower(path)[0]))
  if config is None or config.get("model_type") not in ("siglip", "siglip2"):
    return 0
  return config["vision_config"]["num_attention_heads"]


def _refuse_unsupported_directory(path):
  """A directory whose config.json names a family no room computes."""
  config = directories.config_json(paths.resolve(path))
  if config is None:
    return
  family = (unsupported.for_architecture(config["architecture"]) if
            timm_config.is_timm_config(config) else unsupported.MODEL_TYPES.get(
                config.get("model_type")))
  if family is not None:
    raise WeightsError(unsupported.refusal(family, path))
