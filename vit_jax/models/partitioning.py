"""Logical axis names of the model's parameters and activations.

Parameter names are fixed by the released checkpoints, so the logical axes of
each parameter are read from its path here rather than boxed into the
parameter tree (the tree stays plain arrays, loadable from any `.npz`).
`vit_jax.sharding` maps these names to mesh axes with the config's rules;
the model annotates its activations with the same names
(`nn.with_logical_constraint`, a no-op when no rules are set).
"""

import re
from typing import Optional

LogicalAxes = tuple[Optional[str], ...]

# Activations.
BATCH, LENGTH, EMBED, HEADS, HEAD_DIM, MLP = ("batch", "length", "embed",
                                              "heads", "head_dim", "mlp")
TOKENS_AXES = (BATCH, LENGTH, EMBED)  # B x N x D between blocks.
HIDDEN_AXES = (BATCH, LENGTH, MLP)  # B x N x F inside the MLP.
QKV_AXES = (BATCH, LENGTH, HEADS, HEAD_DIM)  # B x N x H x K in attention.
# A Mixer's token-mixing MLP runs along the patches (B x D x F): channels sit
# where tokens sit in the channel MLP, and F splits as the channel MLP's.
TOKEN_MIXING_HIDDEN_AXES = (BATCH, EMBED, MLP)

# (regex on the '/'-joined path, axes of one layer's parameter). The first
# match wins; a parameter that matches none has no logical axes (all None).
_PARAM_AXES: tuple[tuple[str, LogicalAxes], ...] = (
    # A Mixer's token-mixing MLP reads and writes tokens, not channels (before
    # the generic MLP rows, which would call its token axis `embed`).
    (r".*/token_mixing/Dense_0/kernel", (LENGTH, MLP)),
    (r".*/token_mixing/Dense_0/bias", (MLP,)),
    (r".*/token_mixing/Dense_1/kernel", (MLP, LENGTH)),
    (r".*/(query|key|value)/kernel", (EMBED, HEADS, HEAD_DIM)),
    (r".*/(query|key|value)/bias", (HEADS, HEAD_DIM)),
    (r".*/out/kernel", (HEADS, HEAD_DIM, EMBED)),
    (r".*/heads_ln/(scale|bias)", (HEADS, HEAD_DIM)),
    (r".*/(Dense_0|Gate)/kernel", (EMBED, MLP)),
    (r".*/(Dense_0|Gate)/bias", (MLP,)),
    (r".*/MlpBlock_3/LayerNorm_0/(scale|bias)", (MLP,)),
    (r".*/Dense_1/kernel", (MLP, EMBED)),
)


def key_names(key_path) -> tuple:
  """A jax tree key path (`tree_map_with_path`) as plain names: the keys of
  `flax.traverse_util.flatten_dict`."""
  return tuple(
      getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))
      for k in key_path)


def param_path(key_path) -> str:
  """A jax tree key path as the '/'-joined path the rules here match."""
  return "/".join(str(name) for name in key_names(key_path))


def is_scanned_block(path: str) -> bool:
  """Whether `path` is a scanned-layers block parameter (leading layer axis)."""
  return re.search(r"(^|/)encoderblock/", path) is not None


def param_logical_axes(path: str, ndim: int) -> LogicalAxes:
  """Logical axes of the parameter at `path` with `ndim` dimensions.

  A scanned-layers parameter has one more (leading) dimension than the
  per-layer table says; it gets no name (layers are never sharded).
  """
  for pattern, axes in _PARAM_AXES:
    if re.fullmatch(pattern, path):
      if ndim == len(axes):
        return axes
      if ndim == len(axes) + 1:
        return (None,) + axes
      raise ValueError(f"Parameter {path} has {ndim} dimensions; expected "
                       f"{len(axes)} ({axes}).")
  return (None,) * ndim
