"""Which ViT family a converted checkpoint is, and the `config.model`
options its parameters say it needs.

PyTorch's ViTs differ from the paper's by options each family turns on:
DINOv2 (LayerScale; with registers, position embeddings for the patches
only), DeiT III (LayerScale, patches-only position embeddings), OpenAI's
and OpenCLIP's image encoders in timm (a LayerNorm before the blocks,
LayerNorm epsilon 1e-5; OpenAI's also QuickGELU, which no parameter
shows), and timm's global-average-pooled ViTs with `fc_norm`. What the
weights cannot show (LayerScale's init value, QuickGELU) keeps its default.
"""

from typing import Any

POSEMB = "Transformer/posembed_input/pos_embedding"
_LAYER_SCALE = "/LayerScale_attention/scale"


def options(params: dict[str, Any], posemb_prefix_tokens: int) -> dict:
  """The `config.model` options (beside the defaults) of flat `params`
  under this project's names."""
  found = {}
  registers = params.get("registers")
  if registers is not None:
    found["num_registers"] = int(registers.shape[1])
  prefix = int("cls" in params) + found.get("num_registers", 0)
  if POSEMB in params and prefix and posemb_prefix_tokens == 0:
    found["posemb_covers_prefix"] = False
  if any(name.endswith(_LAYER_SCALE) for name in params):
    found["layer_scale"] = 1e-5  # Trained values are loaded; init unused.
  if "Transformer/pre_norm/scale" in params:
    found["pre_norm"] = True
    found["layer_norm_eps"] = 1e-5  # timm's CLIP image encoders.
  if "pooled_norm/scale" in params:  # With GAP, beside a class token.
    found["pooled_norm"] = True
    if "cls" in params:
      found["class_token"] = True
  return found


def name(found: dict) -> str:
  """The family `options` describe, in words."""
  if found.get("num_registers"):
    return f"DINOv2 with {found['num_registers']} registers"
  if "layer_scale" in found:
    return "DeiT III" if found.get("posemb_covers_prefix") is False else (
        "DINOv2")
  if found.get("pre_norm"):
    return ("CLIP image encoder (OpenAI's compute QuickGELU: "
            "config.model.quick_gelu=True; OpenCLIP's GELU)")
  if found.get("pooled_norm"):
    return "ViT with the pooled features' norm (timm's fc_norm, GAP)"
  return "ViT"


def config_fix(found: dict) -> str:
  """`--config.model.NAME=VALUE` flags that set `found`."""
  return " ".join(
      f"--config.model.{option}={value}" for option, value in found.items())
