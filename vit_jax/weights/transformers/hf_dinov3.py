"""transformers' DINOv3 (`DINOv3ViTModel`) <-> timm's Eva names, which
`timm_names.from_timm` reads as DINOv3 (`timm/dinov3.py`), and the
directory transformers loads it from.

The same model as timm's port: a class token, registers, LayerScale
(`layer_scale1.lambda1`), query and value biases without a key bias (its
defaults; `key_bias=True` adds one), RoPE in DINOv3's form with base
`rope_theta`, the final norm on every token. transformers' output is the
tokens (`last_hidden_state`) and the class token's (`pooler_output`): the
model here pools the class token and has no head. Its gated MLPs
(`use_gated_mlp`, the larger models') are refused in one line
(`weights/unsupported.py`).
"""

import re

import numpy as np

from vit_jax.errors import WeightsError
from vit_jax.weights import architecture
from vit_jax.weights import families
from vit_jax.weights.timm import timm_names

# (transformers' pattern, Eva's replacement) for each module.
_RENAMES = (
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.register_tokens", "reg_token"),
    (r"embeddings\.patch_embeddings\.(\w+)", r"patch_embed.proj.\1"),
    (r"model\.layer\.(\d+)\.norm([12])\.(\w+)", r"blocks.\1.norm\2.\3"),
    (r"model\.layer\.(\d+)\.attention\.([qkv])_proj\.(\w+)",
     r"blocks.\1.attn.\2.\3"),
    (r"model\.layer\.(\d+)\.attention\.o_proj\.(\w+)",
     r"blocks.\1.attn.proj.\2"),
    (r"model\.layer\.(\d+)\.layer_scale([12])\.lambda1", r"blocks.\1.gamma_\2"),
    (r"model\.layer\.(\d+)\.mlp\.up_proj\.(\w+)", r"blocks.\1.mlp.fc1.\2"),
    (r"model\.layer\.(\d+)\.mlp\.down_proj\.(\w+)", r"blocks.\1.mlp.fc2.\2"),
    (r"norm\.(\w+)", r"norm.\1"),
)
LEFT_OUT = {"embeddings.mask_token": "DINOv3's masked-image training only"}


def is_family(names) -> bool:
  return any(n.startswith("model.layer.") for n in names) and any(
      n.startswith("embeddings.patch_embeddings.") for n in names)


def to_timm(tensors: dict, path: str) -> tuple[dict, list[str]]:
  """(Eva-named state dict, what was left out) of a DINOv3ViTModel."""
  out, left_out = {}, []
  for name, value in tensors.items():
    if name in LEFT_OUT:
      left_out.append(f"{name} ({LEFT_OUT[name]})")
      continue
    for pattern, replacement in _RENAMES:
      renamed, count = re.subn(f"^{pattern}$", replacement, name)
      if count:
        out[renamed] = value
        break
    else:
      raise WeightsError(f"{path}: unknown transformers DINOv3 parameter "
                         f"{name!r}.")
  if "reg_token" not in out or not out["reg_token"].size:
    raise WeightsError(
        f"{path} is transformers' DINOv3 without register tokens, which "
        "this project does not read yet; DINOv3's released models have 4.")
  return out, left_out


def stated_options(config: dict) -> dict:
  """What a DINOv3ViTModel's config.json says beside its weights."""
  return {
      "rope_temperature": float(config.get("rope_theta", 100.0)),
      "classifier": "token",
  }


# timm's names (query, key and value apart) -> transformers'.
_FROM_TIMM = (
    (r"cls_token", "embeddings.cls_token"),
    (r"reg_token", "embeddings.register_tokens"),
    (r"patch_embed\.proj\.(\w+)", r"embeddings.patch_embeddings.\1"),
    (r"blocks\.(\d+)\.norm([12])\.(\w+)", r"model.layer.\1.norm\2.\3"),
    (r"blocks\.(\d+)\.attn\.([qkv])\.(\w+)",
     r"model.layer.\1.attention.\2_proj.\3"),
    (r"blocks\.(\d+)\.attn\.proj\.(\w+)",
     r"model.layer.\1.attention.o_proj.\2"),
    (r"blocks\.(\d+)\.ls([12])\.gamma",
     r"model.layer.\1.layer_scale\2.lambda1"),
    (r"blocks\.(\d+)\.mlp\.fc1\.(\w+)", r"model.layer.\1.mlp.up_proj.\2"),
    (r"blocks\.(\d+)\.mlp\.fc2\.(\w+)", r"model.layer.\1.mlp.down_proj.\2"),
    (r"norm\.(\w+)", r"norm.\1"),
)


def write_model(params: dict, model_config,
                image_size: int) -> tuple[dict, dict]:
  """(state dict, config.json) of a DINOv3ViTModel with `params`: a model
  of DINOv3's form without a head (transformers' has none)."""
  block = families.block_options(params)
  differs = {
      "a head or pre-logits layer": any(
          k.startswith(("head/", "pre_logits/")) for k in params),
      "no class token": "cls" not in params,
      "no registers": "registers" not in params,
      "another activation": (model_config.quick_gelu or
                             model_config.gelu_approximate),
      "a pre-norm or pooled norm": any(
          k.startswith(("Transformer/pre_norm/", "pooled_norm/"))
          for k in params),
      "another block": block["parallel_block"] or block["qk_norm"]
                       or not block["use_bias"],
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
  state = {}
  for name, value in timm_names.to_timm_split(params).items():
    for pattern, replacement in _FROM_TIMM:
      renamed, count = re.subn(f"^{pattern}$", replacement, name)
      if count:
        state[renamed] = value
        break
  width = state["embeddings.cls_token"].shape[-1]
  state["embeddings.mask_token"] = np.zeros((1, 1, width), np.float32)
  if "model.layer.0.layer_scale1.lambda1" not in state:  # Always there.
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
      "hidden_act": "gelu",
      "layer_norm_eps": model_config.layer_norm_eps,
      "rope_theta": model_config.rope_temperature,
      "query_bias": biased,
      "key_bias": biased and block["key_bias"],
      "value_bias": biased,
      "proj_bias": True,
      "mlp_bias": True,
      "use_gated_mlp": False,
      "dtype": "float32",
  }
  return state, config
