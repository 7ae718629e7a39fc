"""transformers' DINOv3 (`DINOv3ViTModel`) <-> timm's Eva names, which
`timm_names.from_timm` reads as DINOv3 (`timm/dinov3.py`), and the
directory transformers loads it from.

The same model as timm's port: a class token, registers, LayerScale
(`layer_scale1.lambda1`), query and value biases without a key bias (its
defaults; `key_bias=True` adds one), RoPE in DINOv3's form with base
`rope_theta`, the final norm on every token. transformers' output is the
tokens (`last_hidden_state`) and the class token's (`pooler_output`): the
model here pools the class token and has no head. Its gated MLPs
(`use_gated_mlp`, the larger models': down(SiLU(gate x) * up x)) are
SwiGLU's (`config.model.swiglu`); a config.json naming another gate
activation is refused.

Two layouts name its blocks: the files' (`save_pretrained` and the Hub's
released models: `layer.N.`, which transformers 5 renames on loading) and
its modules' (`model.layer.N.`, a `state_dict()` taken by hand); both are
read, and the files' is written. Its patch embedding is one convolution
(`embeddings.patch_embeddings.weight`, DINOv2's and ViT's end in
`.projection.weight`): that and the blocks tell the family apart.
"""

import re

import numpy as np

from vit_jax.errors import WeightsError
from vit_jax.weights import architecture
from vit_jax.weights import exports
from vit_jax.weights import families
from vit_jax.weights import torch_layout
from vit_jax.weights.timm import eva
from vit_jax.weights.timm import timm_names

# (transformers' name, timm's VisionTransformer name) of each module, as
# prefixes; {} is a block's index. Read both ways.
_NAMES = (
    ("embeddings.cls_token", "cls_token"),
    ("embeddings.register_tokens", "reg_token"),
    ("embeddings.patch_embeddings.", "patch_embed.proj."),
    ("layer.{}.norm1.", "blocks.{}.norm1."),
    ("layer.{}.norm2.", "blocks.{}.norm2."),
    *((f"layer.{{}}.attention.{part}_proj.", f"blocks.{{}}.attn.{part}.")
      for part in "qkv"),
    ("layer.{}.attention.o_proj.", "blocks.{}.attn.proj."),
    ("layer.{}.layer_scale1.lambda1", "blocks.{}.ls1.gamma"),
    ("layer.{}.layer_scale2.lambda1", "blocks.{}.ls2.gamma"),
    ("layer.{}.mlp.up_proj.", "blocks.{}.mlp.fc1."),
    ("layer.{}.mlp.gate_proj.", "blocks.{}.mlp.fc1_g."),
    ("layer.{}.mlp.down_proj.", "blocks.{}.mlp.fc2."),
    ("norm.", "norm."),
)


def _renamer(to_timm: bool):
  """name -> the other side's name by `_NAMES` (None if unknown)."""
  pairs = [(a, b) if to_timm else (b, a) for a, b in _NAMES]

  def rename(name: str):
    for source, target in pairs:
      match = re.match(re.escape(source).replace(r"\{\}", r"(\d+)"), name)
      if match:
        return target.format(*match.groups()) + name[match.end():]
    return None

  return rename


LEFT_OUT = {"embeddings.mask_token": "DINOv3's masked-image training only"}

_BLOCKS = re.compile(r"(model\.)?layer\.\d+\.")


def is_family(names) -> bool:
  return "embeddings.patch_embeddings.weight" in names and any(
      _BLOCKS.match(n) for n in names)


def to_timm(tensors: dict, path: str) -> tuple[dict, list[str]]:
  """(Eva-named state dict, what was left out) of a DINOv3ViTModel, in
  either layout."""
  tensors = {
      (k[len("model."):] if k.startswith("model.layer.") else k): v
      for k, v in tensors.items()
  }
  out, left_out = torch_layout.renamed(tensors, _renamer(to_timm=True),
                                       LEFT_OUT, path, "transformers DINOv3")
  if "reg_token" not in out or not out["reg_token"].size:
    raise WeightsError(
        f"{path} is transformers' DINOv3 without register tokens, which "
        "this project does not read yet; DINOv3's released models have 4.")
  return eva.as_eva_names(out), left_out


def stated_options(config: dict) -> dict:
  """What a DINOv3ViTModel's config.json says beside its weights."""
  if config.get("use_gated_mlp") and config.get("hidden_act") not in ("silu",
                                                                      "swish"):
    raise WeightsError(
        f"transformers' DINOv3 with a gated MLP of {config.get('hidden_act')!r}"
        " is not computed here: its gated models' SiLU (SwiGLU) is.")
  return {
      "rope_temperature": float(config.get("rope_theta", 100.0)),
      "classifier": "token",
  }


def write_model(params: dict, model_config,
                image_size: int) -> tuple[dict, dict]:
  """(state dict, config.json) of a DINOv3ViTModel with `params`: a model
  of DINOv3's form without a head (transformers' has none). Refused in one
  line: a field it does not write (`exports`: hf-dinov3), or a value or
  parameter of one it writes that DINOv3's backbone does not have."""
  exports.refuse_unwritten(model_config, "hf-dinov3")
  block = families.block_options(params)
  differs = {
      "a head": any(k.startswith("head/") for k in params),
      "no class token": "cls" not in params,
      "no registers": "registers" not in params,
      "a position table": model_config.posemb != "none",
      "another activation": not model_config.swiglu
                            and model_config.gelu_approximate,
  }
  wrong = [what for what, found in differs.items() if found]
  if wrong or model_config.rope != "dinov3":
    raise WeightsError(
        "transformers' DINOv3ViTModel is DINOv3's backbone: RoPE "
        "(config.model.rope=dinov3), a class token and registers, the erf "
        "GELU, no head; this model has " +
        ", ".join(wrong or ["another RoPE"]) +
        ": use --format=timm-dir or --format=npz (or export it without "
        "its head).")
  state, _ = torch_layout.renamed(timm_names.to_timm_split(params),
                                  _renamer(to_timm=False), {}, "the model",
                                  "timm")
  width = state["embeddings.cls_token"].shape[-1]
  state["embeddings.mask_token"] = np.zeros((1, 1, width), np.float32)
  if "layer.0.layer_scale1.lambda1" not in state:  # Always there.
    for name in [n for n in state if n.endswith(".norm1.weight")]:
      for k in (1, 2):
        state[name.replace(".norm1.weight",
                           f".layer_scale{k}.lambda1")] = (np.ones((width,),
                                                                   np.float32))
  variant = architecture.variant_of(params, "the model")
  biased = block["qkv_bias"]
  config = {
      "architectures": ["DINOv3ViTModel"],
      "model_type": "dinov3_vit",
      "hidden_size": variant.hidden_size,
      "intermediate_size": variant.mlp_dim,
      "num_hidden_layers": variant.num_layers,
      "num_attention_heads": variant.num_heads,
      "patch_size": variant.patch_size,
      "image_size": image_size,
      "num_register_tokens": int(params["registers"].shape[1]),
      "hidden_act": "silu" if block["swiglu"] else "gelu",
      "layer_norm_eps": model_config.layer_norm_eps,
      "rope_theta": model_config.rope_temperature,
      "query_bias": biased,
      "key_bias": biased and block["key_bias"],
      "value_bias": biased,
      "proj_bias": True,
      "mlp_bias": True,
      "use_gated_mlp": block["swiglu"],
      "dtype": "float32",
  }
  return state, config
