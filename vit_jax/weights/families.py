"""Which ViT family a converted checkpoint is, and the `config.model`
options its parameters say it needs.

PyTorch's ViTs differ from the paper's by options each family turns on:
DINOv2 (LayerScale; with registers, position embeddings for the patches
only), DeiT III (LayerScale, patches-only position embeddings), OpenAI's
and OpenCLIP's image encoders in timm (a LayerNorm before the blocks,
LayerNorm epsilon 1e-5; OpenAI's also QuickGELU, which no parameter
shows), and timm's global-average-pooled ViTs with `fc_norm`. What the
weights cannot show (LayerScale's init value, QuickGELU) keeps its default.

ViT-22B's block options (`model_form.block_fields`) show in any origin's
parameters: no `LayerNorm_2` (parallel_block), no encoder LayerNorm biases
(use_bias=False), no query/key/value biases beside LayerNorm biases
(qkv_bias=False, timm's form), query and value biases without a key bias
(key_bias=False, EVA's and DINOv3's) and `query_ln`/`key_ln` (qk_norm).
"""

import re
from typing import Any

from vit_jax.config import model_form

POSEMB = "Transformer/posembed_input/pos_embedding"
_LAYER_SCALE = "/LayerScale_attention/scale"
_BLOCK = "Transformer/encoderblock_0/"


def block_options(params) -> dict:
  """The values of every block option (`model_form.block_fields`: how
  each shows) that flat `params` (this project's looped names, arrays or
  only the names) were made with; {} where there are no encoder blocks
  (an MLP-Mixer)."""
  if _BLOCK + "LayerNorm_0/scale" not in params:
    return {}
  defaults = model_form.defaults()
  found = {}
  for name, shown in model_form.block_fields().items():
    default = defaults[name]
    if shown.shown_with and _BLOCK + shown.shown_with not in params:
      found[name] = default  # Nothing there says it.
    elif shown.adds:  # Its other value adds the parameter.
      found[name] = (_BLOCK + shown.adds in params) != default
    else:  # Its other value removes the parameter.
      found[name] = (_BLOCK + shown.removes in params) == default
  return found


# The parameters a block option adds or removes (each field's
# `InBlocks.names`): LayerNorm_2 (parallel blocks), LayerNorm and
# projection biases, the query/key LayerNorms, ...
BLOCK_OPTION_NAMES = re.compile("|".join(
    f"(?:{shown.names})" for shown in model_form.block_fields().values()))


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
  return {n: defaults[n] for n in model_form.block_fields()}


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
  words = [
      shown.words
      for option, shown in model_form.block_fields().items()
      if option in found
  ]
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
