"""transformers' DINOv2 (`Dinov2Model`, `Dinov2WithRegistersModel`) in timm's
names, which `timm_names.from_timm` reads.

Both namings of transformers are read: the Hub files' (`save_pretrained`:
`attention.attention.query`, `attention.output.dense`) and version 5's
modules (`attention.q_proj`, `attention.o_proj`). With registers,
transformers adds the class token's position embedding to it and none to
the registers: the class token here holds that sum and the table keeps the
patches' entries only (timm's `no_embed_class`), the same model.
"""

import re

import numpy as np

from vit_jax.weights import torch_layout

# (transformers' pattern, timm's replacement); {i} is a block's index.
_RENAMES = (
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.register_tokens", "reg_token"),
    (r"embeddings\.position_embeddings", "pos_embed"),
    (r"embeddings\.patch_embeddings\.projection\.(\w+)",
     r"patch_embed.proj.\1"),
    (r"encoder\.layer\.(\d+)\.norm([12])\.(\w+)", r"blocks.\1.norm\2.\3"),
    (r"encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(\w+)",
     lambda m: f"blocks.{m[1]}.attn.{m[2][0]}.{m[3]}"),
    (r"encoder\.layer\.(\d+)\.attention\.([qkv])_proj\.(\w+)",
     r"blocks.\1.attn.\2.\3"),
    (r"encoder\.layer\.(\d+)\.attention\.(output\.dense|o_proj)\.(\w+)",
     r"blocks.\1.attn.proj.\3"),
    (r"encoder\.layer\.(\d+)\.layer_scale([12])\.lambda1",
     r"blocks.\1.ls\2.gamma"),
    (r"encoder\.layer\.(\d+)\.mlp\.(fc[12])\.(\w+)", r"blocks.\1.mlp.\2.\3"),
    (r"layernorm\.(\w+)", r"norm.\1"),
)
# What is left out, and why (said in the load report).
LEFT_OUT = {
    "embeddings.mask_token": "DINOv2's masked-image training only",
    "classifier.weight": "a head on the class and mean patch tokens",
    "classifier.bias": "a head on the class and mean patch tokens",
}


def _timm_name(name: str):
  """timm's name of a transformers DINOv2 parameter; None if unknown."""
  for pattern, replacement in _RENAMES:
    renamed, count = re.subn(f"^{pattern}$", replacement, name)
    if count:
      return renamed
  return None


def is_family(names) -> bool:
  return any(
      ".layer_scale1." in n or re.search(r"encoder\.layer\.\d+\.mlp\.", n)
      for n in names)


def to_timm(tensors: dict, path: str) -> tuple[dict, list[str]]:
  """(timm-named state dict, what was left out) of a transformers DINOv2."""
  tensors = {
      (k[len("dinov2."):] if k.startswith("dinov2.") else k): v
      for k, v in tensors.items()
  }
  out, left_out = torch_layout.renamed(tensors, _timm_name, LEFT_OUT, path,
                                       "transformers DINOv2")
  if "reg_token" in out and "pos_embed" in out:
    table = out["pos_embed"]
    out["cls_token"] = out["cls_token"] + table[:, :1]
    out["pos_embed"] = np.ascontiguousarray(table[:, 1:])
  return out, left_out
