"""An MLP-Mixer's parameters under the released names (big_vision's and
google-research/vision_transformer's, `models/mixer.py`): whether names are
a Mixer's, the architecture they describe, and its token-mixing MLP tiled
for K times the resolution (the Mixer paper's Supplementary C). Pure numpy.
"""

import dataclasses
import re
from typing import Optional

import numpy as np

from vit_jax.errors import WeightsError


def is_mixer(names) -> bool:
  """Whether parameter names (ours, released or timm's) are an MLP-Mixer's."""
  return any("MixerBlock_" in n or ".mlp_tokens." in n for n in names)


@dataclasses.dataclass(frozen=True)
class MixerArchitecture:
  hidden_size: int
  tokens_mlp_dim: int
  channels_mlp_dim: int
  num_layers: int
  patch_size: int
  num_tokens: int  # Patches the token-mixing MLPs were built for.
  num_classes: Optional[int]  # None: no head.
  representation_size: Optional[int]  # The pre-logits width; None: none.

  @property
  def image_size(self) -> Optional[int]:
    """The square image those tokens tile; None if they form no square."""
    side = round(self.num_tokens**0.5)
    return side * self.patch_size if side * side == self.num_tokens else None


def mixer_architecture(flat) -> MixerArchitecture:
  """The Mixer that flat parameters (our names) describe, from their shapes;
  a missing part or blocks that disagree is a WeightsError."""

  def shape(name: str) -> tuple:
    if name not in flat:
      raise WeightsError(f"These Mixer parameters have no {name}.")
    return tuple(np.shape(flat[name]))

  layers = sorted({
      int(m.group(1))
      for m in map(re.compile(r"MixerBlock_(\d+)/").match, flat)
      if m
  })
  if not layers or layers != list(range(len(layers))):
    raise WeightsError(f"Mixer blocks must be MixerBlock_0..N-1; these have "
                       f"{[f'MixerBlock_{i}' for i in layers]}.")
  patch, _, _, hidden = shape("stem/kernel")
  num_tokens, tokens_mlp = shape("MixerBlock_0/token_mixing/Dense_0/kernel")
  channels_mlp = shape("MixerBlock_0/channel_mixing/Dense_0/kernel")[1]
  for i in layers:
    block = f"MixerBlock_{i}/"
    found = (shape(block + "token_mixing/Dense_0/kernel"),
             shape(block + "channel_mixing/Dense_0/kernel"))
    if found != ((num_tokens, tokens_mlp), (hidden, channels_mlp)):
      raise WeightsError(
          f"{block} has MLP kernels {found[0]} and {found[1]}; MixerBlock_0's "
          f"are {(num_tokens, tokens_mlp)} and {(hidden, channels_mlp)}.")
  representation = (shape("pre_logits/kernel")[1]
                    if "pre_logits/kernel" in flat else None)
  classes = shape("head/kernel")[1] if "head/kernel" in flat else None
  return MixerArchitecture(hidden_size=hidden, tokens_mlp_dim=tokens_mlp,
                           channels_mlp_dim=channels_mlp,
                           num_layers=len(layers), patch_size=patch,
                           num_tokens=num_tokens, num_classes=classes,
                           representation_size=representation)


TOKEN_MIXING = re.compile(
    r"MixerBlock_\d+/token_mixing/Dense_([01])/(kernel|bias)")


def tiles_between(file_shape, target_shape, name: str) -> Optional[int]:
  """K where `target_shape` is the token-mixing parameter `name` of a Mixer
  at K times the resolution of `file_shape`'s (K^2 times the patches and
  the hidden units), else None."""
  if not TOKEN_MIXING.fullmatch(name) or len(file_shape) != len(target_shape):
    return None
  ratios = {t / f for f, t in zip(file_shape, target_shape)}
  if len(ratios) != 1:
    return None
  k = round(ratios.pop()**0.5)
  return k if k > 1 and all(
      f * k * k == t for f, t in zip(file_shape, target_shape)) else None


def tile_indices(num_tokens: int, k: int) -> tuple[np.ndarray, np.ndarray]:
  """(tile, position in its tile) of each token of the K*g x K*g grid,
  row-major, where g x g = num_tokens: the tiles are the image's K x K
  equal parts, numbered row-major, each holding a g x g grid."""
  g = round(num_tokens**0.5)
  if g * g != num_tokens:
    raise WeightsError(f"A Mixer's {num_tokens} patches are not a square grid; "
                       "it cannot be tiled.")
  rows, cols = np.divmod(np.arange(k * k * num_tokens), k * g)
  return (rows // g) * k + cols // g, (rows % g) * g + cols % g


def tile_token_mixing(name: str, value: np.ndarray, k: int) -> np.ndarray:
  """The token-mixing parameter `name` for K times the resolution: K^2
  copies of `value` side by side, one per tile (block-diagonal kernels),
  so the Mixer starts as the checkpoint run on each tile separately (the
  Mixer paper's Supplementary C)."""
  layer, leaf = TOKEN_MIXING.fullmatch(name).groups()
  if layer == "0" and leaf == "bias":  # Hidden units: tile-major.
    return np.tile(value, k * k)
  num_tokens = value.shape[0] if layer == "0" else value.shape[-1]
  tile, inner = tile_indices(num_tokens, k)
  if leaf == "bias":  # Dense_1: one per token.
    return value[inner]
  hidden = value.shape[1] if layer == "0" else value.shape[0]
  units = tile[:, None] * hidden + np.arange(hidden)[None]  # Token x unit.
  tokens = np.arange(len(tile))[:, None]
  if layer == "0":  # Tokens x hidden.
    out = np.zeros((len(tile), k * k * hidden), value.dtype)
    out[tokens, units] = value[inner]
  else:  # Hidden x tokens.
    out = np.zeros((k * k * hidden, len(tile)), value.dtype)
    out[units, tokens] = value[:, inner].T
  return out
