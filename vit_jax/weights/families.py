"""Which ViT family a converted checkpoint is, and the `config.model`
options its parameters say it needs.

PyTorch's ViTs differ from the paper's by options each family turns on:
DINOv2 (LayerScale; with registers, position embeddings for the patches
only), DeiT III (LayerScale, patches-only position embeddings), OpenAI's
and OpenCLIP's image encoders in timm (a LayerNorm before the blocks,
LayerNorm epsilon 1e-5; OpenAI's also QuickGELU, which no parameter
shows), and timm's global-average-pooled ViTs with `fc_norm`. What the
weights cannot show (LayerScale's init value, QuickGELU) keeps its default.

ViT-22B's block options (`BLOCK_OPTIONS`) show in any origin's
parameters: no `LayerNorm_2` (parallel_block), no encoder LayerNorm biases
(use_bias=False), no query/key/value biases beside LayerNorm biases
(qkv_bias=False, timm's form), query and value biases without a key bias
(key_bias=False, EVA's and DINOv3's) and `query_ln`/`key_ln` (qk_norm).
"""

import re
from typing import Any

from vit_jax.config import model_form

POSEMB = "Transformer/posembed_input/pos_embedding"
# ViT-22B's block options (config.model fields; models/encoder.py).
BLOCK_OPTIONS = ("parallel_block", "use_bias", "qkv_bias", "key_bias",
                 "qk_norm", "swiglu", "mlp_norm", "attention_norm")
_LAYER_SCALE = "/LayerScale_attention/scale"
_BLOCK = "Transformer/encoderblock_0/"
_ATTENTION = _BLOCK + "MultiHeadDotProductAttention_1/"
# What each block option's value other than the default means, for reports.
_BLOCK_WORDS = {
    "parallel_block": "ViT-22B's parallel block",
    "use_bias": "no attention or encoder LayerNorm biases",
    "qkv_bias": "no query/key/value biases",
    "key_bias": "query and value biases only",
    "qk_norm": "query/key LayerNorms",
    "swiglu": "SwiGLU MLPs",
    "mlp_norm": "a LayerNorm inside the MLP",
    "attention_norm": "a LayerNorm over the attention's heads",
}


def block_options(params) -> dict:
  """The values of every block option (`BLOCK_OPTIONS`) that flat
  `params` (this project's looped names, arrays or only the names) were
  made with; {} where there are no encoder blocks (an MLP-Mixer)."""
  if _BLOCK + "LayerNorm_0/scale" not in params:
    return {}
  use_bias = _BLOCK + "LayerNorm_0/bias" in params
  return {
      "parallel_block": _BLOCK + "LayerNorm_2/scale" not in params,
      "use_bias": use_bias,
      # Without use_bias there are none: qkv_bias says nothing more.
      "qkv_bias": not use_bias or _ATTENTION + "query/bias" in params,
      "key_bias": (_ATTENTION + "query/bias" not in params or
                   _ATTENTION + "key/bias" in params),
      "qk_norm": _ATTENTION + "query_ln/scale" in params,
      "swiglu": _BLOCK + "MlpBlock_3/Gate/kernel" in params,
      "mlp_norm": _BLOCK + "MlpBlock_3/LayerNorm_0/scale" in params,
      "attention_norm": _ATTENTION + "heads_ln/scale" in params,
  }


# The parameters a block option adds or removes: LayerNorm_2 (parallel
# blocks), LayerNorm and projection biases, the query/key LayerNorms.
BLOCK_OPTION_NAMES = re.compile(
    r"(/LayerNorm_2/|LayerNorm_\d/bias$|encoder_norm/bias$|pre_norm/bias$|"
    r"/(query|key|value|out)/bias$|/(query|key)_ln/|/Gate/|"
    r"MlpBlock_3/LayerNorm_0/|/heads_ln/)")


def other_block(path: str, file_params, target_flat) -> str:
  """A sentence where the file's blocks have other block options than the
  model's, naming the flags that fit the file; "" where they agree."""
  theirs, ours = block_options(file_params), block_options(target_flat)
  differ = [n for n in theirs if n in ours and theirs[n] != ours[n]]
  if not differ:
    return ""

  def said(options):
    return ", ".join(f"{n}={options[n]}" for n in differ)

  return (f"{path} has blocks with {said(theirs)} but the model's have "
          f"{said(ours)}; set {config_fix({n: theirs[n] for n in differ})} "
          "(or name the parameters to re-initialise and the file entries "
          "to ignore in config.init.dont_load).")


def block_defaults() -> dict:
  """The block options' defaults."""
  defaults = model_form.defaults()
  return {n: defaults[n] for n in BLOCK_OPTIONS}


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
  defaults = block_defaults()
  found.update({
      option: value
      for option, value in block_options(params).items()
      if value != defaults[option]
  })
  return found


def name(found: dict) -> str:
  """The family `options` describe, in words, with its block options."""
  words = [w for option, w in _BLOCK_WORDS.items() if option in found]
  return _family(found) + (f", with {', '.join(words)}" if words else "")


def _family(found: dict) -> str:
  if "layer_scale" in found and found.get("qkv_bias") is False:
    registers = found.get("num_registers")
    return ("ViT with LayerScale" +
            (f" and {registers} registers" if registers else "") +
            " (timm's vit_medium_*, vit_betwixt_*)")
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
