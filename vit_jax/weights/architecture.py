"""The model a weights file holds, read from its parameters' shapes.

    arch = read(path)  # Architecture(variant='ViT-B/16', classifier='token',
                       #   class_token=True, posemb='learn',
                       #   representation_size=None, num_classes=1000,
                       #   image_size=224)

So a released `.npz`, a big_vision checkpoint or a timm / Hugging Face file can
be used (predicted with, analysed) without naming a config: the widths, depth,
heads, patch size and hybrid stem pick the entry of the variant table; the
class token, MAP head and pre-logits layer say the classifier; the head says
the classes and the position embeddings the resolution they were trained at (a
file without them has fixed sincos2d ones, which say nothing: big_vision's 224
px is assumed). PyTorch files do not store the number of heads; it follows from
the width (every variant of one width has the same heads) unless given.
"""

import dataclasses
import re
from typing import Optional

import numpy as np

from vit_jax.errors import UserError
from vit_jax.errors import WeightsError
from vit_jax.models.variants import VARIANTS
from vit_jax.models.variants import MixerVariant
from vit_jax.models.variants import ResNetSpec
from vit_jax.models.variants import Variant
from vit_jax.weights import families
from vit_jax.weights import mixer_layout
from vit_jax.weights import origins
from vit_jax.weights import posemb
from vit_jax.weights.files import formats
from vit_jax.weights.names import POSEMB
from vit_jax.weights.names import Converted

_BLOCK = "Transformer/encoderblock_{}/"
_FACTORIZED_ROWS = "Transformer/posembed_input/pos_embedding_y"
SINCOS_IMAGE_SIZE = 224  # What big_vision's plain ViTs train at.
_TORCH_PATCH_PROJECTION = (
    "patch_embed.proj.weight",
    "patch_embeddings.projection.weight",
    "embeds.proj.weight",  # timm's NaFlexViT.
    "embeddings.patch_embeddings.weight",  # transformers' DINOv3.
    "embeddings.patch_embedding.weight")  # transformers' SigLIP.


@dataclasses.dataclass(frozen=True)
class Architecture:
  variant: Optional[str]  # A name of models/variants.py (None: none fits).
  classifier: str  # token | gap | map.
  class_token: bool
  posemb: str  # learn | sincos2d | factorized.
  representation_size: Optional[int]  # The pre-logits width; None: none.
  num_classes: Optional[int]  # None: no head.
  image_size: int  # The resolution its position embeddings were trained at.
  # A Mixer fine-tuned at K times its variant's token grid (its token MLP
  # K^2 times as wide): config.model.mixer_tiles.
  mixer_tiles: int = 1
  # config.model options of PyTorch's families ((name, value), ...; see
  # families.py): registers, LayerScale, pre-norm, fc_norm, ...
  options: tuple = ()
  # Trained on images at their own shape (NaFlex): predicted and evaluated
  # so by default (config.sequence_length).
  sequences: bool = False

  def model_fields(self) -> dict:
    """The `config.model` fields that build this model."""
    return {
        "variant": self.variant,
        "classifier": self.classifier,
        "class_token": self.class_token,
        "posemb": self.posemb,
        "representation_size": self.representation_size,
        "mixer_tiles": self.mixer_tiles,
        **dict(self.options)
    }


def heads_for_width(width: int) -> int:
  """The attention heads of the variants `width` wide."""
  heads = {
      v.num_heads
      for v in VARIANTS.values()
      if v.hidden_size == width and v.num_heads  # Mixers have no attention.
  }
  if len(heads) != 1:
    raise UserError(f"No variant is {width} wide, so its number of attention "
                    "heads is unknown; pass --num_heads.")
  return heads.pop()


def read(path: str, num_heads: Optional[int] = None,
         cache_dir=None) -> Architecture:
  return read_with_source(path, num_heads, cache_dir)[0]


def read_with_source(
    path: str, num_heads: Optional[int] = None, cache_dir=None,
    need_variant: bool = True) -> tuple[Architecture, Converted]:
  """The architecture, and the file's parameters under the released names
  with where they came from (origin, the tower read). `need_variant`
  False: a ViT no variant describes has variant None."""
  fmt, tensors = formats.read(path, cache_dir)
  origins.detect(fmt, list(tensors), path)  # Refuses a family not computed.
  if fmt in ("safetensors", "torch") and not num_heads and (
      not mixer_layout.is_mixer(tensors)):
    widths = [
        v.shape[0]
        for k, v in tensors.items()
        if k.endswith(_TORCH_PATCH_PROJECTION)
    ]
    if not widths:
      raise WeightsError(f"{path} has no patch projection "
                         f"({' or '.join(_TORCH_PATCH_PROJECTION)}).")
    num_heads = origins.stated_heads(path) or heads_for_width(widths[0])
  converted = origins.convert(fmt, tensors, num_heads or 0, path)
  arch = from_params(converted.params, converted.posemb_prefix_tokens, path,
                     need_variant)
  # What the family says, then what a transformers or timm directory's
  # config.json says beside.
  options = {
      **dict(arch.options),
      **converted.options,
      **origins.stated_options(path)
  }
  # Pooling and positions said so (DINOv3's: RoPE and no table, its
  # pooling) override what the names suggest.
  fields = {
      k: options.pop(k)
      for k in ("classifier", "class_token", "posemb")
      if k in options
  }
  arch = dataclasses.replace(arch, sequences=converted.sequences, options=tuple(
      options.items()), **fields)
  return arch, converted


def from_params(params: dict[str, np.ndarray], posemb_prefix_tokens: int,
                path: str, need_variant: bool = True) -> Architecture:
  """The architecture of flat `params` under the released names (see `read`)."""
  if mixer_layout.is_mixer(params):
    return _mixer(params, path, need_variant)
  variant = variant_of(params, path)
  name = next((n for n, v in VARIANTS.items() if v == variant), None)
  if name is None and need_variant:
    raise WeightsError(
        f"{path} is a ViT no entry of models/variants.py describes "
        f"({variant}); register it (vit_jax.models.variants.register in a "
        "module of config.imports), or pass --config with that model.")
  found = families.options(params, posemb_prefix_tokens)
  if any(k.startswith("MAPHead_0/") for k in params):
    classifier = "map"
  elif found.get("pooled_norm"):  # timm's fc_norm comes with GAP.
    classifier = "gap"
  elif "cls" in params:
    classifier = "token"
  else:
    classifier = "gap"
  pre_logits = params.get("pre_logits/kernel")
  head = params.get("head/kernel")
  table = params.get(POSEMB)
  rows = params.get(_FACTORIZED_ROWS)  # NaViT's factorized tables.
  image_size = SINCOS_IMAGE_SIZE
  if table is not None:
    grid = posemb.square_grid(table.shape[-2] - posemb_prefix_tokens, path)
    image_size = grid[0] * variant.stride
  elif rows is not None:
    image_size = rows.shape[1] * variant.stride
  kind = "learn" if table is not None else "sincos2d"
  return Architecture(
      variant=name, classifier=classifier, class_token="cls" in params,
      posemb="factorized" if rows is not None else kind,
      representation_size=None if pre_logits is None else pre_logits.shape[-1],
      num_classes=None if head is None else head.shape[-1],
      image_size=image_size, options=tuple(found.items()))


def _mixer(params, path, need_variant: bool = True) -> Architecture:
  """An MLP-Mixer's: mean pooling, no class token or position embeddings."""
  arch = mixer_layout.mixer_architecture(params)
  name, tiles = None, 1
  for k in range(1, 9):  # Widened for K times the resolution, or not.
    if arch.tokens_mlp_dim % (k * k):
      continue
    variant = MixerVariant(arch.hidden_size, arch.tokens_mlp_dim // (k * k),
                           arch.channels_mlp_dim, arch.num_layers,
                           arch.patch_size)
    name = next((n for n, v in VARIANTS.items() if v == variant), None)
    if name is not None:
      tiles = k
      break
  if (name is None and need_variant) or arch.image_size is None:
    raise WeightsError(
        f"{path} is an MLP-Mixer no entry of models/variants.py describes "
        f"({variant}, {arch.num_tokens} patches); register it "
        "(vit_jax.models.variants.register in a module of config.imports).")
  return Architecture(variant=name, classifier="gap", class_token=False,
                      posemb="learn",
                      representation_size=arch.representation_size,
                      num_classes=arch.num_classes, image_size=arch.image_size,
                      mixer_tiles=tiles)


def variant_of(params, path) -> Variant:
  """The widths, depth, heads, patch size and stem of `params`."""
  try:
    embedding = params["embedding/kernel"]  # P x P x C x D
    layers = len({
        m.group(1)
        for k in params
        if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))
    })
    block = _BLOCK.format(0)
    query = params[block + "MultiHeadDotProductAttention_1/query/kernel"]
    mlp = params[block + "MlpBlock_3/Dense_0/kernel"]
  except KeyError as e:
    raise WeightsError(f"{path} lacks {e} of a ViT.") from None
  resnet = None
  if "conv_root/kernel" in params:
    units = []
    while any(k.startswith(f"block{len(units) + 1}/") for k in params):
      units.append(
          len({
              m.group(1)
              for k in params
              if (m := re.match(rf"block{len(units) + 1}/unit(\d+)/", k))
          }))
    resnet = ResNetSpec(num_layers=tuple(units),
                        width_factor=params["conv_root/kernel"].shape[-1] / 64)
  return Variant(hidden_size=embedding.shape[-1], mlp_dim=mlp.shape[-1],
                 num_heads=query.shape[1], num_layers=layers,
                 patch_size=embedding.shape[0], resnet=resnet)
