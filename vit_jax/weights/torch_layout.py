"""PyTorch's ViT arrays as ours, and back, by a table of modules.

An origin's room gives its table: each row one module of parameters, our
name, its kind (how its arrays convert: `ARRAYS`) and the origin's name
(`{}` stands for a block's index in both). timm's is
`timm/timm_names.py`'s, transformers' `transformers/hf_names.py`'s.
"""

import re
from typing import NamedTuple
from typing import Optional
from typing import Sequence

import numpy as np

from vit_jax.errors import WeightsError
from vit_jax.weights.names import BLOCK


class Module(NamedTuple):
  """A module of parameters: our name, its kind (`ARRAYS`), its name in
  the origin's naming (None: none there)."""
  ours: str
  kind: str
  theirs: Optional[str]


# The PyTorch code bases' activations (timm's act_layer, transformers'
# hidden_act) as config.model fields.
ACTIVATIONS = {
    "gelu": dict(gelu_approximate=False),
    "gelu_tanh": dict(gelu_approximate=True),
    "gelu_pytorch_tanh": dict(gelu_approximate=True),
    "gelu_new": dict(gelu_approximate=True),
    "quick_gelu": dict(quick_gelu=True),
}
# Modules a model may lack.
OPTIONAL = ("cls", "head", "pre_logits", "Transformer/encoder_norm",
            "registers", "Transformer/pre_norm", "pooled_norm") + tuple(
                BLOCK + m
                for m in ("LayerScale_attention/scale", "LayerScale_mlp/scale",
                          "MultiHeadDotProductAttention_1/query_ln",
                          "MultiHeadDotProductAttention_1/key_ln",
                          "MultiHeadDotProductAttention_1/heads_ln",
                          "MultiHeadDotProductAttention_1/rope_frequencies",
                          "MlpBlock_3/Gate", "MlpBlock_3/LayerNorm_0"))
# Arrays a model may lack, by how they convert: the query/key/value
# biases (timm's and transformers' qkv_bias=False; config.model.qkv_bias).
_OPTIONAL_ARRAYS = ("bias_in",)
_PRE_NORM_LACKS = "embedding/bias"  # timm's CLIP: patch_embed has no bias.
# A module's arrays by kind: (PyTorch's suffix, our leaf, how it converts).
ARRAYS = {
    "tensor": (("", "", "same"),),
    "norm": ((".weight", "/scale", "same"), (".bias", "/bias", "same")),
    "conv": ((".weight", "/kernel", "conv"), (".bias", "/bias", "same")),
    "dense": ((".weight", "/kernel", "dense"), (".bias", "/bias", "same")),
    "heads_in": (
        (".weight", "/kernel", "heads_in"), (".bias", "/bias", "bias_in")),
    "heads_out": (
        (".weight", "/kernel", "heads_out"), (".bias", "/bias", "same")),
    # A LayerNorm over all heads' outputs, ours per head (H x K).
    "heads_norm": (
        (".weight", "/scale", "bias_in"), (".bias", "/bias", "bias_in")),
}


def _to_ours(how: str, value, num_heads: int):
  """A PyTorch array as ours: Linear (out, in) -> Dense (in, out), split
  into heads where attention's input or output is; Conv OIHW -> HWIO."""
  if how == "conv":
    return value.transpose(2, 3, 1, 0)
  if how == "dense":
    return value.T
  if how == "heads_in":  # (D_out, D_in) -> (D_in, H, K).
    return value.T.reshape(value.shape[1], num_heads, -1)
  if how == "bias_in":  # (D_out,) -> (H, K).
    return value.reshape(num_heads, -1)
  if how == "heads_out":  # (D_out, D_in) -> (H, K, D_out).
    return value.T.reshape(num_heads, -1, value.shape[0])
  return value


def _to_torch(how: str, value):
  """The inverse of `_to_ours`."""
  if how == "conv":
    return value.transpose(3, 2, 0, 1)
  if how == "dense":
    return value.T
  if how == "heads_in":
    return value.reshape(value.shape[0], -1).T
  if how == "bias_in":
    return value.reshape(-1)
  if how == "heads_out":
    return value.reshape(-1, value.shape[-1]).T
  return value


def num_blocks(names, table: Sequence[Module], ours: bool = False) -> int:
  """1 + the largest block index among `names` (ours, or the table's)."""
  block = next(  # A block's module that every ViT has.
      m.ours if ours else m.theirs
      for m in table
      if m.ours.startswith(BLOCK + "MlpBlock_3"))
  pattern = re.compile(re.escape(block[:block.index("{}")]) + r"(\d+)")
  return 1 + max(
      (int(m.group(1)) for n in names if (m := pattern.match(n))), default=-1)


def _arrays(table: Sequence[Module], blocks: int):
  """(module, our name, its name, how it converts) of every array."""
  for module in table:
    if module.theirs is None:
      continue
    for i in range(blocks) if "{}" in module.ours else [0]:
      for suffix, leaf, how in ARRAYS[module.kind]:
        yield module, module.ours.format(i) + leaf, module.theirs.format(
            i) + suffix, how


def from_torch(tensors, table: Sequence[Module], num_heads: int, path: str,
               optional=()) -> dict:
  """Our params from a PyTorch state dict named by `table`; `optional`:
  modules it may lack beside OPTIONAL."""
  params = {}
  for module, ours, theirs, how in _arrays(table, num_blocks(tensors, table)):
    if theirs in tensors:
      params[ours] = _to_ours(how, tensors[theirs], num_heads)
    elif module.ours not in OPTIONAL + tuple(
        optional) and how not in _OPTIONAL_ARRAYS:
      raise WeightsError(f"{path} has no {theirs!r}, which every ViT in its "
                         "naming has; is it a whole state dict?")
  return params


def to_torch(params, table: Sequence[Module], naming: str, out: dict,
             used: set) -> dict:
  """`out` plus every parameter of ours in the table's names (`naming`
  says whose); one without a place there refuses the whole export."""
  blocks = num_blocks(params, table, ours=True)
  for module, ours, theirs, how in _arrays(table, blocks):
    if ours in params:
      used.add(ours)
      out[theirs] = _to_torch(how, params[ours])
    elif (module.ours not in OPTIONAL and ours != _PRE_NORM_LACKS and
          how not in _OPTIONAL_ARRAYS):
      raise WeightsError(f"The model has no {ours}, which the {naming} "
                         "model needs; nothing was written.")
  left = sorted(set(params) - used)
  if left:
    raise WeightsError(f"The {naming} model has no place for {left}; "
                       "nothing was written. Use --format=npz, which keeps "
                       "every parameter.")
  # safetensors writes the raw buffer: every array must be C-ordered.
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def renamed(tensors: dict, rename, left_out: dict, path: str,
            family: str) -> tuple[dict, list[str]]:
  """(`tensors` under `rename(name)`'s names, what was left out): names in
  `left_out` ({name: why}) are dropped and said; a name `rename` does not
  know (None) refuses the file."""
  out, said = {}, []
  for name, value in tensors.items():
    if name in left_out:
      said.append(f"{name} ({left_out[name]})")
      continue
    new = rename(name)
    if new is None:
      raise WeightsError(f"{path}: unknown {family} parameter {name!r}.")
    out[new] = value
  return out, said
