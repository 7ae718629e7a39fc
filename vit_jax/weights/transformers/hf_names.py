"""transformers' ViT state dicts <-> this project's names.

Two namings of one `ViTModel`: version 4's, which wrote the Hub's files
(`encoder.layer.N.attention.attention.query`, and which version 5 still
reads and writes), and version 5's own modules (`layers.N.attention.q_proj`);
one table of modules with a column for each (`MODULES`), read both ways
through `torch_layout`. Its DINOv2 (`hf_dinov2.py`) and DINOv3
(`hf_dinov3.py`) are read in timm's names; families this project does not
compute (`unsupported.TRANSFORMERS`) are refused in one line. The origin
`hugging_face` of `origins.ORIGINS` and the reader of transformers'
config.json are registered here.
"""

import re
from typing import NamedTuple

from vit_jax.errors import WeightsError
from vit_jax.weights import origins
from vit_jax.weights import torch_layout
from vit_jax.weights import unsupported
from vit_jax.weights.names import BLOCK
from vit_jax.weights.names import POSEMB
from vit_jax.weights.names import Converted
from vit_jax.weights.timm import timm_names
from vit_jax.weights.torch_layout import ACTIVATIONS
from vit_jax.weights.torch_layout import Module
from vit_jax.weights.transformers import hf_dinov2
from vit_jax.weights.transformers import hf_dinov3
from vit_jax.weights.transformers import hf_siglip


class _Row(NamedTuple):
  ours: str
  kind: str
  transformers_4: str
  transformers_5: str


_ATTENTION = BLOCK + "MultiHeadDotProductAttention_1/"
_ROWS = (
    _Row("cls", "tensor", "embeddings.cls_token", "embeddings.cls_token"),
    _Row(POSEMB, "tensor", "embeddings.position_embeddings",
         "embeddings.position_embeddings"),
    _Row("embedding", "conv", "embeddings.patch_embeddings.projection",
         "embeddings.patch_embeddings.projection"),
    _Row("Transformer/encoder_norm", "norm", "layernorm", "layernorm"),
    _Row("head", "dense", "classifier", "classifier"),
    _Row("pre_logits", "dense", "pooler.dense", "pooler.dense"),
    *(_Row(_ATTENTION + name, "heads_in",
           f"encoder.layer.{{}}.attention.attention.{name}",
           f"layers.{{}}.attention.{short}_proj")
      for short, name in zip("qkv", ("query", "key", "value"))),
    _Row(_ATTENTION + "out", "heads_out",
         "encoder.layer.{}.attention.output.dense",
         "layers.{}.attention.o_proj"),
    _Row(BLOCK + "LayerNorm_0", "norm", "encoder.layer.{}.layernorm_before",
         "layers.{}.layernorm_before"),
    _Row(BLOCK + "LayerNorm_2", "norm", "encoder.layer.{}.layernorm_after",
         "layers.{}.layernorm_after"),
    _Row(BLOCK + "MlpBlock_3/Dense_0", "dense",
         "encoder.layer.{}.intermediate.dense", "layers.{}.mlp.fc1"),
    _Row(BLOCK + "MlpBlock_3/Dense_1", "dense", "encoder.layer.{}.output.dense",
         "layers.{}.mlp.fc2"),
)
MODULES = {
    naming: tuple(Module(r.ours, r.kind, getattr(r, naming)) for r in _ROWS)
    for naming in ("transformers_4", "transformers_5")
}


def from_hugging_face(tensors, num_heads, path) -> Converted:
  """transformers' ViTModel / ViTForImageClassification (either naming), or
  its DINOv2 (`hf_dinov2.py`)."""
  refused = unsupported.find(unsupported.TRANSFORMERS, tensors)
  if refused:
    raise WeightsError(unsupported.refusal(refused, path))
  if hf_siglip.is_siglip(tensors):  # Its vision tower, as an image model.
    return hf_siglip.vision_tower(tensors, num_heads, path)
  for family, overrides in ((hf_dinov3, {
      "classifier": "token"
  }), (hf_dinov2, None)):
    if family.is_family(tensors):
      renamed, left_out = family.to_timm(tensors, path)
      converted = timm_names.from_timm(renamed, num_heads, path, overrides)
      converted.origin = "hugging_face"
      converted.notes += ([f"left out {', '.join(left_out)}"]
                          if left_out else [])
      return converted
  tensors = {
      (k[len("vit."):] if k.startswith("vit.") else k): v
      for k, v in tensors.items()
  }
  naming = ("transformers_4" if any(
      k.startswith("encoder.layer.") for k in tensors) else "transformers_5")
  return Converted(
      torch_layout.from_torch(tensors, MODULES[naming], num_heads, path), 1,
      "hugging_face")


def to_hugging_face(params: dict) -> dict:
  """This project's flat names -> transformers' ViTModel state dict in the
  Hub's names (hf_dir.py checks first that the model is one)."""
  return torch_layout.to_torch(params, MODULES["transformers_4"],
                               "transformers_4", {}, set())


def stated_options(config: dict) -> dict:
  """The `config.model` fields a transformers config.json states."""
  if config.get("model_type") in hf_siglip.MODEL_TYPES:
    return hf_siglip.stated_options(config)
  options = dict(ACTIVATIONS.get(config.get("hidden_act", "gelu"), {}))
  if "layer_norm_eps" in config:
    options["layer_norm_eps"] = float(config["layer_norm_eps"])
  if config.get("model_type") == "dinov3_vit":
    options.update(hf_dinov3.stated_options(config))
  return options


def _is_transformers(names) -> bool:
  return any(
      re.match(r"(vit\.|vision_model\.)?(embeddings|encoder|layers)\.", n)
      for n in names)


def _heads(config: dict) -> int:
  """A SiglipModel's image tower's attention heads; 0 for other models."""
  if config.get("model_type") not in hf_siglip.MODEL_TYPES:
    return 0
  return config["vision_config"]["num_attention_heads"]


def _convert(fmt: str, tensors, num_heads: int, path: str) -> Converted:
  del fmt  # A safetensors file or a pickle: the same names.
  return from_hugging_face(tensors, num_heads, path)


def _unsupported(config: dict):
  return unsupported.MODEL_TYPES.get(config.get("model_type"))


origins.register(
    "hugging_face",
    origins.Origin("Hugging Face transformers", gelu_approximate=False,
                   convert=_convert, claims=_is_transformers, rank=30))
origins.register_config_reader(
    "transformers",
    origins.ConfigReader(claims=lambda config: "model_type" in config, rank=20,
                         stated_options=stated_options,
                         unsupported=_unsupported, heads=_heads))
